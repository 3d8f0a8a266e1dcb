package mq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// NATSConfig: what ExternalNATS connects with, how it is checked before dialing, and
// how credentials (always file paths) become connection options without ever showing
// in an error or a log.

// NATSConfig configures an ExternalNATS. Secrets are file paths only.
type NATSConfig struct {
	// NATSTopology is the operator's topology; it must match the cluster.
	NATSTopology

	// URLs of the cluster's servers, without credentials.
	URLs []string
	// Name of the connection, as servers show it. Default "mq-<hostname>".
	Name string

	// At most one of User (with PasswordFile), NKeySeedFile and CredsFile.
	User         string
	PasswordFile string // trailing CR/LF trimmed
	NKeySeedFile string
	CredsFile    string // user JWT and nkey seed (operator mode)

	// TLS, when any field is set: a CA to trust, a client certificate and key for
	// mutual TLS (both or neither), the server name to verify, and whether to start
	// with the TLS handshake.
	TLS NATSTLS

	// ConnectTimeout bounds each dial. Default 5s.
	ConnectTimeout time.Duration
	// TopologyWait is how long boot waits for the topology to verify. Default 60s:
	// on Kubernetes the operator's resources roll out with the pods.
	TopologyWait time.Duration

	// Logger receives the broker's logs. Default slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the broker's metrics (see the README's Metrics).
	// Default: the global provider, otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// MetricsTenants adds the tenant id (mq.tenant) to the message and park counters.
	// Off, no metric names a tenant: turn it on only for a bounded number of tenants.
	MetricsTenants bool
	// TracerProvider makes the producer, consumer and replay spans (see the README's
	// Tracing). Default: the global provider, otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// recheckEvery and pollEvery override the watch loop's intervals in tests.
	recheckEvery, pollEvery time.Duration
}

// NATSTLS configures TLS to the cluster.
type NATSTLS struct {
	CAFile, CertFile, KeyFile string
	ServerName                string
	HandshakeFirst            bool
}

func (t NATSTLS) enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.HandshakeFirst
}

// Validate reports, wrapping ErrInvalidConfig, why c cannot work, without dialing or
// reading a secret: its topology, its URLs, its credentials' combination, and that its
// secret and TLS files exist. NewNATS, ConnectNATS and CheckNATS call it first, and
// then read the files.
func (c NATSConfig) Validate() error {
	if err := c.NATSTopology.Validate(); err != nil {
		return err
	}
	if err := c.checkConnection(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (c NATSConfig) checkConnection() error {
	if len(c.URLs) == 0 {
		return errors.New("nats config: no URLs")
	}
	for i, u := range c.URLs {
		if strings.TrimSpace(u) == "" {
			return fmt.Errorf("nats config: URL %d is empty", i)
		}
		if strings.Contains(u, "@") {
			return fmt.Errorf("nats config: URL %d (%s) carries credentials: use User and PasswordFile, NKeySeedFile or CredsFile", i, redactURL(u))
		}
	}
	auth := 0
	for _, set := range []bool{c.User != "", c.NKeySeedFile != "", c.CredsFile != ""} {
		if set {
			auth++
		}
	}
	switch {
	case auth > 1:
		return errors.New("nats config: set at most one of User, NKeySeedFile and CredsFile")
	case c.PasswordFile != "" && c.User == "":
		return errors.New("nats config: PasswordFile needs User")
	case c.User != "" && c.PasswordFile == "":
		return fmt.Errorf("nats config: user %s needs a PasswordFile", c.User)
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return errors.New("nats config: TLS CertFile and KeyFile come as a pair")
	case c.ConnectTimeout < 0 || c.TopologyWait < 0:
		return errors.New("nats config: negative timeout")
	}
	for what, path := range map[string]string{"password file": c.PasswordFile, "nkey seed file": c.NKeySeedFile,
		"creds file": c.CredsFile, "TLS CA file": c.TLS.CAFile, "TLS cert file": c.TLS.CertFile, "TLS key file": c.TLS.KeyFile} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("nats config: %s: %w", what, err)
		}
	}
	return nil
}

// redactURL returns s fit for an error or a log: any userinfo (a token, a user, a
// password) is replaced whole by "***", so neither it nor a part of it shows. It works
// on the text, not on a parse: a URL that does not parse may carry credentials too,
// and url.Redacted hides only a password. Everything between the scheme and the last
// '@' is hidden: more than the userinfo when a path holds an '@', never less.
func redactURL(s string) string {
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	scheme := ""
	if i := strings.Index(s, "://"); i > 0 && i < at && isScheme(s[:i]) {
		scheme = s[:i+len("://")]
	}
	return scheme + "***" + s[at:]
}

// isScheme reports whether s is a URL scheme (RFC 3986): a letter, then letters,
// digits, "+", "-" or ".".
func isScheme(s string) bool {
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

func redactURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = redactURL(u)
	}
	return strings.Join(out, ",")
}

// options builds the connection options of c.
func (c NATSConfig) options(e *ExternalNATS) ([]nats.Option, error) {
	name := c.Name
	if name == "" {
		host, _ := os.Hostname()
		name = "mq-" + host
	}
	jitter := reconnectJitter
	opts := []nats.Option{
		nats.Name(name),
		nats.Timeout(cmp.Or(c.ConnectTimeout, defaultConnectTimeout)),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.DrainTimeout(drainTimeout),
		nats.CustomInboxPrefix(inboxPrefix(c.NATSTopology)),
		nats.ConnectHandler(func(*nats.Conn) { e.connected.Store(true) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			e.connected.Store(false)
			if !e.closing.Load() {
				e.log.Warn("mq: disconnected from nats", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			e.connected.Store(true)
			e.log.Info("mq: reconnected to nats", "url", redactURL(nc.ConnectedUrl()))
		}),
		nats.ClosedHandler(func(*nats.Conn) { e.connected.Store(false); close(e.closedCh) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			if !e.closing.Load() {
				e.log.Warn("mq: nats error", "subject", subject, "error", err)
			}
		}),
	}
	switch {
	case c.CredsFile != "":
		opt := nats.UserCredentials(c.CredsFile)
		if err := checkCreds(opt); err != nil {
			return nil, fmt.Errorf("%w: nats config: creds file %s: %w", ErrInvalidConfig, c.CredsFile, err)
		}
		opts = append(opts, opt)
	case c.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats config: nkey seed file %s: %w", ErrInvalidConfig, c.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case c.User != "":
		pw, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats config: password file: %w", ErrInvalidConfig, err)
		}
		opts = append(opts, nats.UserInfo(c.User, strings.TrimRight(string(pw), "\r\n")))
	}
	if c.TLS.enabled() {
		jitter = reconnectJitterTLS
		if c.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(c.TLS.CAFile))
		}
		if c.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
		}
		if c.TLS.ServerName != "" {
			opts = append(opts, nats.Secure(&tls.Config{ServerName: c.TLS.ServerName, MinVersion: tls.VersionTLS12}))
		}
		if c.TLS.HandshakeFirst {
			opts = append(opts, nats.TLSHandshakeFirst())
		}
	}
	return append(opts, nats.ReconnectJitter(jitter, jitter)), nil
}

// checkCreds reads a creds file through opt, as the connection will at each connect,
// so an unreadable or malformed one is refused at once rather than retried until the
// wait runs out. nats.go's errors name neither the JWT nor the seed.
func checkCreds(opt nats.Option) error {
	var o nats.Options
	if err := opt(&o); err != nil {
		return err
	}
	if _, err := o.UserJWT(); err != nil {
		return err
	}
	_, err := o.SignatureCB([]byte("mq"))
	return err
}
