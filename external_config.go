package mq

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
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
	NKeySeedFile string // the seed alone: a file holding a JWT is refused
	CredsFile    string // user JWT and nkey seed as nsc writes them (operator mode); a seed alone is refused

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
// secret and TLS files exist as regular files of at most 1 MiB. NewNATS, ConnectNATS and CheckNATS call it first, and
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
		if err := checkSecretFile(path); err != nil {
			return fmt.Errorf("nats config: %s: %w", what, err)
		}
	}
	return nil
}

// maxSecretFile is the most a secret or TLS file may hold: a creds file is about 1 KiB,
// a CA bundle rarely beyond 300 KiB.
const maxSecretFile = 1 << 20

// checkSecretFile refuses a path that is not a regular file of at most maxSecretFile
// bytes. nats.go reads creds, nkey and TLS files again at every reconnect, which a pipe
// cannot serve; and a device or pipe given by mistake ran the process out of memory
// (/dev/zero) or blocked it in open for good, deaf to Ctrl-C (a FIFO without writer).
func checkSecretFile(path string) error {
	fi, err := os.Stat(path) // follows links: a mounted Kubernetes secret is one
	if err != nil {
		return err
	}
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	case fi.Size() > maxSecretFile:
		return fmt.Errorf("%s holds %d bytes, more than such a file does (at most %d)", path, fi.Size(), maxSecretFile)
	}
	return nil
}

// readSecretFile reads path as checkSecretFile allows, its size bounded in the read
// too: the file may have been replaced since the check.
func readSecretFile(path string) ([]byte, error) {
	if err := checkSecretFile(path); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	contents, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err == nil && len(contents) > maxSecretFile {
		clear(contents)
		err = fmt.Errorf("%s holds more than %d bytes, more than such a file does", path, maxSecretFile)
	}
	return contents, err
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
		// No reconnect buffer: what is published while the connection is down fails
		// at once. nats.go's buffer sent it after the reconnect, behind events lost
		// with the old socket, so a batch cut by a disconnect and retried stored a
		// tenant's events out of order (a host's walkthrough saw rows 84-149 before
		// 0-83). A publish that fails is sent again by its caller, in order.
		nats.ReconnectBufSize(-1),
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
		// The first connect's failure reaches only this handler: nats.go clears
		// LastError as it starts retrying. dial reads it when the wait ends first.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { e.dialErr.Store(&err) }),
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
		opt, err := credsOption(c.CredsFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats config: %w", ErrInvalidConfig, err)
		}
		opts = append(opts, opt)
	case c.NKeySeedFile != "":
		opt, err := nkeyOption(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats config: nkey seed file %s: %w", ErrInvalidConfig, c.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case c.User != "":
		pw, err := readSecretFile(c.PasswordFile)
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

// credsOption returns nats.go's option for a creds file with its JWT callback checked,
// after reading the file through it once, as the connection will at each connect, so
// an unreadable or malformed file is refused at once rather than retried until the
// wait runs out.
//
// nats.go sends whatever its parser calls the JWT in CONNECT's "jwt" field, and for a
// file without a decorated JWT block (an nkey seed such as user.nk given as creds) that
// is the whole file: the seed would travel in clear on a non-TLS connection and show in
// a server's trace log, which does not redact the field. So the callback hands over
// only a user JWT; and it checks at every connect, not only here, since a creds file
// replaced on disk while the broker runs is read again at the next reconnect.
func credsOption(path string) (nats.Option, error) {
	var o nats.Options
	if err := nats.UserCredentials(path)(&o); err != nil {
		return nil, fmt.Errorf("creds file %s: %w", path, err)
	}
	readJWT, sign := o.UserJWT, o.SignatureCB
	userJWT := func() (string, error) {
		s, err := readJWT()
		if err != nil {
			return "", fmt.Errorf("creds file %s: %w", path, err)
		}
		// The decoding error is not wrapped: it may quote the text it could not read,
		// a part of the seed.
		if _, err := jwt.DecodeUserClaims(s); err != nil {
			return "", fmt.Errorf("creds file %s: malformed: it holds no decorated user JWT "+
				"(a creds file holds a user JWT and its nkey seed, as nsc writes it; an nkey seed alone goes in NKeySeedFile)", path)
		}
		return s, nil
	}
	if _, err := userJWT(); err != nil {
		return nil, err
	}
	// nats.go's errors here name the file, never the seed.
	if _, err := sign([]byte("mq")); err != nil {
		return nil, fmt.Errorf("creds file %s: %w", path, err)
	}
	return nats.UserJWT(userJWT, sign), nil
}

// nkeyOption returns nats.go's option for an nkey seed file, refusing a file that
// holds a JWT: nats.go takes the seed out of a creds file given in its place and
// connects as that key without its JWT, which an operator-mode server refuses only
// after the dial and without a word about which file was wrong.
func nkeyOption(path string) (nats.Option, error) {
	contents, err := readSecretFile(path)
	if err != nil {
		return nil, err
	}
	first, _ := nkeys.ParseDecoratedJWT(contents) // never fails: the first block, or all
	clear(contents)                               // the seed, as nats.go wipes its copies
	if _, err := jwt.DecodeGeneric(first); err == nil {
		return nil, errors.New("holds a JWT, not an nkey seed alone: a creds file goes in CredsFile")
	}
	return nats.NkeyOptionFromSeed(path)
}
