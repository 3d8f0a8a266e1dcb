package mq

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

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
	// MeterProvider receives the gauges. Default: none.
	MeterProvider metric.MeterProvider

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

// External broker intervals and bounds.
const (
	defaultConnectTimeout = 5 * time.Second
	defaultTopologyWait   = time.Minute
	recheckInterval       = 5 * time.Minute
	sourcePollInterval    = 30 * time.Second
	checkTimeout          = 30 * time.Second
	reconnectWait         = 2 * time.Second
	reconnectJitter       = 500 * time.Millisecond
	reconnectJitterTLS    = 2 * time.Second
	pingInterval          = 20 * time.Second
	maxPingsOut           = 3
	drainTimeout          = 5 * time.Second
	maxLag                = int64(1) << 62
)

// ExternalNATS is a Broker over an operator-owned NATS cluster. It never creates,
// changes, purges or deletes a stream or a durable: it verifies the topology at boot
// and every few minutes, and creates only auto-expiring consumers on the history (one
// per Subscribe, one per replay). Budgets are recorded, not enforced: the tenants of a
// partition share its limits.
type ExternalNATS struct {
	core *natsCore
	cfg  NATSConfig
	topo NATSTopology
	nc   *nats.Conn
	js   jetstream.JetStream
	log  *slog.Logger

	closing    atomic.Bool
	connected  atomic.Bool
	topologyOK atomic.Bool
	closedCh   chan struct{}

	watchCancel context.CancelFunc
	watchDone   chan struct{}
	metrics     metric.Registration

	mu            sync.Mutex
	budgets       map[TenantID]int64
	budgetsLogged bool
	historyMaxAge time.Duration
	windowsWarned map[TenantID]bool
	sources       map[string]sourceState
	held          map[string]int64 // by partition stream: acked events kept for the history
	closeOnce     sync.Once
}

type sourceState struct {
	lag    int64
	active float64 // seconds since last contact, -1 before the first attach
}

var _ Broker = (*ExternalNATS)(nil)

// validate refuses a configuration that cannot work, before any dial.
func (c NATSConfig) validate() error {
	if err := c.NATSTopology.Validate(); err != nil {
		return err
	}
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
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats config: nkey seed file %s: %w", c.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case c.User != "":
		pw, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("nats config: password file: %w", err)
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

// NewNATS connects to the cluster and waits, up to TopologyWait, until the topology
// verifies. A required finding left at the end is a *TopologyError listing every
// finding; a cluster never reached is ErrUnavailable. Recommended findings are logged.
func NewNATS(ctx context.Context, cfg NATSConfig) (*ExternalNATS, error) {
	cfg.NATSTopology = cfg.NATSTopology.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &ExternalNATS{
		cfg: cfg, topo: cfg.NATSTopology, log: cmp.Or(cfg.Logger, slog.Default()),
		closedCh: make(chan struct{}), budgets: map[TenantID]int64{},
		windowsWarned: map[TenantID]bool{}, sources: map[string]sourceState{}, held: map[string]int64{},
	}
	opts, err := cfg.options(e)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrUnavailable, redactURLs(cfg.URLs), err)
	}
	e.nc = nc
	e.connected.Store(nc.IsConnected())
	if e.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	wait := cmp.Or(cfg.TopologyWait, defaultTopologyWait)
	bctx, cancel := context.WithTimeout(ctx, wait+time.Second)
	defer cancel()
	recommended, err := AwaitNATSTopology(bctx, e.js, e.topo, wait)
	if err == nil {
		err = e.resolveStreams(bctx)
	}
	if err != nil {
		connected := nc.IsConnected()
		lastErr := nc.LastError()
		nc.Close()
		if !connected {
			return nil, errors.Join(fmt.Errorf("%w: not connected to %s", ErrUnavailable, redactURLs(cfg.URLs)), lastErr, err)
		}
		return nil, err
	}
	for _, f := range recommended {
		e.log.Warn("mq: nats topology recommendation", "finding", f.String())
	}
	e.topologyOK.Store(true)
	e.core.lostTopology = e.lostTopology
	e.pollHistory(bctx)
	if err := e.registerMetrics(cmp.Or[metric.MeterProvider](cfg.MeterProvider, noop.NewMeterProvider())); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: metrics: %w", err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	e.watchCancel, e.watchDone = wcancel, make(chan struct{})
	go e.watch(wctx)
	return e, nil
}

// resolveStreams finds each partition's stream and the dead-letter stream by subject:
// the operator may name them anything.
func (e *ExternalNATS) resolveStreams(ctx context.Context) error {
	e.core = newNATSCore(e.topo, e.nc, e.js, e.log)
	subs := e.topo.subjects()
	for p := range e.topo.Partitions {
		name, err := e.js.StreamNameBySubject(ctx, subs.ingest(p, "x"))
		if err != nil {
			return fmt.Errorf("find partition %d: %w", p, err)
		}
		e.core.partitions[p] = name
	}
	name, err := e.js.StreamNameBySubject(ctx, subs.deadLetter("x"))
	if err != nil {
		return fmt.Errorf("find the dead-letter stream: %w", err)
	}
	e.core.deadLetters = name
	return nil
}

// lostTopology is called when a publish found its stream gone or its subject held by
// another stream: the topology gauge drops at once, before the next re-check.
func (e *ExternalNATS) lostTopology(stream string, err error) {
	e.topologyOK.Store(false)
	e.log.Error("mq: nats topology lost: a publish found its stream gone or replaced", "stream", stream, "error", err)
}

// Publish stores data on the tenant's partition.
func (e *ExternalNATS) Publish(ctx context.Context, topic Topic, data []byte, opts ...PublishOpt) error {
	ev, err := e.core.ingestEvent(ctx, topic, data, opts)
	if err != nil {
		return err
	}
	_, _, err = e.core.send(ctx, ev)
	return err
}

// Subscribe runs the hub: an ordered, ack-less consumer on the history from now on.
// The name is ignored: every process needs every event. A handler error is logged.
func (e *ExternalNATS) Subscribe(ctx context.Context, _ string, handler Handler) error {
	return e.core.subscribe(ctx, handler)
}

// CreateConsumer maps cfg.Durable onto the operator's ingest durable and checks it on
// every partition: its ack wait at least cfg's (default the topology's), and a max ack
// pending set. It never creates one.
func (e *ExternalNATS) CreateConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error) {
	if ctx == nil {
		return nil, errNilContext("create consumer")
	}
	durable, err := e.core.durable(cfg.Durable)
	if err != nil {
		return nil, err
	}
	wantWait := cmp.Or(cfg.AckWait, e.topo.AckWait)
	for _, stream := range e.core.partitions {
		cons, err := e.js.Consumer(ctx, stream, durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("create consumer: %w: %s on stream %s (the operator creates it)", ErrConsumerNotFound, durable, stream)
		}
		if err != nil {
			return nil, e.core.mapRequestError("create consumer "+durable+" on stream "+stream, err)
		}
		got := cons.CachedInfo().Config
		if got.AckWait < wantWait {
			return nil, fmt.Errorf("create consumer %s on stream %s: its ack wait %s is below the %s asked for", durable, stream, got.AckWait, wantWait)
		}
		if got.MaxAckPending <= 0 {
			return nil, fmt.Errorf("create consumer %s on stream %s: max ack pending is not set", durable, stream)
		}
	}
	return &worker{core: e.core, ctx: ctx, durable: durable}, nil
}

// DeadLetter parks msg on the dead-letter stream under its own topic, with a fresh id.
func (e *ExternalNATS) DeadLetter(ctx context.Context, msg *Message, opts ...PublishOpt) error {
	return e.core.deadLetter(ctx, msg, opts)
}

// DeadLetterCounts counts tenant's parked events with one subject-filtered info call;
// a tenant that parked nothing has zero counts.
func (e *ExternalNATS) DeadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	return e.core.deadLetterCounts(ctx, tenant, table)
}

// ReplaySince replays topic from the history.
func (e *ExternalNATS) ReplaySince(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error {
	return e.core.replay(ctx, topic, since, send)
}

// PurgeAcked removes nothing: the partitions drop an event once acknowledged and the
// history has its own max age. It warns once per tenant whose window (now minus its
// cutoff) is longer than the history keeps: once in the broker's life, since a fixed
// cutoff makes the window grow with every call.
func (e *ExternalNATS) PurgeAcked(_ context.Context, consumer string, olderThan map[TenantID]time.Time) (bool, error) {
	if err := e.core.checkOpen(); err != nil {
		return false, err
	}
	if _, err := e.topo.durableFor(consumer); err != nil {
		return false, fmt.Errorf("purge acked: %w", err)
	}
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for t, cutoff := range olderThan {
		window := now.Sub(cutoff).Round(time.Second)
		if e.historyMaxAge <= 0 || window <= e.historyMaxAge || e.windowsWarned[t] {
			continue
		}
		e.windowsWarned[t] = true
		e.log.Warn("mq: a tenant's replay window is longer than the history keeps", "tenant", t,
			"window", window, "history", e.topo.HistoryStream, "max_age", e.historyMaxAge)
	}
	return false, nil
}

// SetMaxBytes records tenant's budget; it is not enforced per tenant here.
func (e *ExternalNATS) SetMaxBytes(_ context.Context, tenant TenantID, maxBytes int64) error {
	if err := e.core.checkOpen(); err != nil {
		return err
	}
	if err := tenant.Validate(); err != nil {
		return fmt.Errorf("set max bytes: %w", err)
	}
	if maxBytes < 0 {
		return fmt.Errorf("set max bytes: tenant %s: negative budget %d", tenant, maxBytes)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.budgets[tenant] = maxBytes
	if !e.budgetsLogged {
		e.budgetsLogged = true
		e.log.Info("mq: per-tenant budgets are recorded, not enforced: the tenants of a partition share its max_bytes")
	}
	return nil
}

// MaxBytes returns the budget last recorded for tenant, or 0.
func (e *ExternalNATS) MaxBytes(tenant TenantID) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.budgets[tenant]
}

// Stats reports the connection (1 or 0) and the client's counters.
func (e *ExternalNATS) Stats() (Stats, error) {
	if err := e.core.checkOpen(); err != nil {
		return Stats{}, err
	}
	s := e.nc.Stats()
	st := Stats{InMsgs: int64(s.InMsgs), InBytes: int64(s.InBytes), OutMsgs: int64(s.OutMsgs), OutBytes: int64(s.OutBytes)}
	if e.nc.IsConnected() {
		st.Connections = 1
	}
	return st, nil
}

// Close stops the watch loop (cancelling an in-flight re-check) and every consumer and
// subscription, so none reports failed, then drains the connection.
func (e *ExternalNATS) Close() error {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.watchCancel()
		<-e.watchDone
		e.core.stopAll()
		if err := e.nc.Drain(); err != nil {
			e.nc.Close()
		}
		select {
		case <-e.closedCh:
		case <-time.After(drainTimeout + time.Second):
			e.nc.Close()
		}
		_ = e.metrics.Unregister()
	})
	return nil
}

// watch re-checks the topology and polls the history's sources until Close.
func (e *ExternalNATS) watch(ctx context.Context) {
	defer close(e.watchDone)
	recheck := time.NewTicker(cmp.Or(e.cfg.recheckEvery, recheckInterval))
	defer recheck.Stop()
	poll := time.NewTicker(cmp.Or(e.cfg.pollEvery, sourcePollInterval))
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recheck.C:
			e.recheck(ctx)
		case <-poll.C:
			e.pollHistory(ctx)
		}
	}
}

// recheck verifies the topology again and sets topology_ok to whether no required,
// non-transient finding remains. It is skipped while disconnected, and its result is
// discarded if the connection dropped during it: a check over a dropped connection
// reads the server version as "".
func (e *ExternalNATS) recheck(ctx context.Context) {
	if !e.nc.IsConnected() {
		return
	}
	before := e.nc.Stats().Reconnects
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	findings, err := VerifyNATSTopology(cctx, e.js, e.topo)
	if ctx.Err() != nil || !e.nc.IsConnected() || e.nc.Stats().Reconnects != before {
		return
	}
	if err != nil {
		e.log.Warn("mq: nats topology re-check could not run", "error", err)
		return
	}
	var faults []string
	for _, f := range findings {
		if f.Severity == Required && !f.Transient {
			faults = append(faults, f.String())
		}
	}
	was := e.topologyOK.Swap(len(faults) == 0)
	switch {
	case len(faults) > 0:
		e.log.Error("mq: nats topology does not match", "findings", faults)
	case !was:
		e.log.Info("mq: nats topology matches again")
	}
}

// pollHistory reads the history's max age, each source's lag and last contact, and
// what each partition holds only for the history.
func (e *ExternalNATS) pollHistory(ctx context.Context) {
	if !e.nc.IsConnected() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	s, err := e.js.Stream(cctx, e.topo.HistoryStream)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("mq: cannot read the history", "stream", e.topo.HistoryStream, "error", err)
		}
		return
	}
	info := s.CachedInfo()
	sources := make(map[string]sourceState, len(info.Sources))
	for _, src := range info.Sources {
		sources[src.Name] = sourceState{lag: int64(min(src.Lag, uint64(maxLag))), active: activeSeconds(src.Active)}
	}
	held := e.heldForHistory(cctx)
	e.mu.Lock()
	e.historyMaxAge = info.Config.MaxAge
	e.sources = sources
	e.held = held
	e.mu.Unlock()
}

// heldForHistory counts, per partition, the events the worker acknowledged that the
// partition still holds: the history's source has not copied them. Measured: a
// history that refuses writes (full, discard new) keeps its source's reported lag at 0
// while acknowledged events pile up on the partition, so the lag gauge alone misses
// that stall; this one shows it.
func (e *ExternalNATS) heldForHistory(ctx context.Context) map[string]int64 {
	held := make(map[string]int64, len(e.core.partitions))
	for _, name := range e.core.partitions {
		s, err := e.js.Stream(ctx, name)
		if err != nil {
			continue
		}
		c, err := s.Consumer(ctx, e.topo.IngestConsumer)
		if err != nil {
			continue
		}
		ci := c.CachedInfo()
		held[name] = max(0, int64(s.CachedInfo().State.Msgs)-int64(ci.NumPending)-int64(ci.NumAckPending))
	}
	return held
}

// activeSeconds converts a source's time since last contact to seconds; the server
// reports -1ns before the first attach, which becomes exactly -1.
func activeSeconds(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return d.Seconds()
}

func (e *ExternalNATS) registerMetrics(mp metric.MeterProvider) error {
	meter := mp.Meter("github.com/wavehouse/mq")
	connected, err := meter.Int64ObservableGauge("wavehouse_mq_connected",
		metric.WithDescription("1 while the broker is connected to nats."))
	if err != nil {
		return err
	}
	ok, err := meter.Int64ObservableGauge("wavehouse_mq_topology_ok",
		metric.WithDescription("1 while the nats topology has no required finding (transient ones excluded)."))
	if err != nil {
		return err
	}
	lag, err := meter.Int64ObservableGauge("wavehouse_mq_history_source_lag",
		metric.WithDescription("Events on a partition the history has yet to copy; a stalled source holds them on the partition."))
	if err != nil {
		return err
	}
	active, err := meter.Float64ObservableGauge("wavehouse_mq_history_source_last_active_seconds",
		metric.WithDescription("Seconds since the history's source last heard from its partition; -1 before the first attach."),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	held, err := meter.Int64ObservableGauge("wavehouse_mq_partition_held_for_history",
		metric.WithDescription("Events the worker acknowledged that a partition still holds because the history has not copied them."))
	if err != nil {
		return err
	}
	e.metrics, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(connected, boolGauge(e.nc.IsConnected()))
		o.ObserveInt64(ok, boolGauge(e.topologyOK.Load()))
		e.mu.Lock()
		defer e.mu.Unlock()
		for name, s := range e.sources {
			attrs := metric.WithAttributes(sourceAttr(name))
			o.ObserveInt64(lag, s.lag, attrs)
			o.ObserveFloat64(active, s.active, attrs)
		}
		for name, n := range e.held {
			o.ObserveInt64(held, n, metric.WithAttributes(attribute.String("stream", name)))
		}
		return nil
	}, connected, ok, lag, active, held)
	return err
}

func sourceAttr(name string) attribute.KeyValue { return attribute.String("source", name) }

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// CheckNATS connects as cfg says and verifies the topology once, without waiting for
// it to match: the check an operator runs before deploying. It waits up to
// TopologyWait for the connection; a cluster never reached is ErrUnavailable.
func CheckNATS(ctx context.Context, cfg NATSConfig) ([]Finding, error) {
	cfg.NATSTopology = cfg.NATSTopology.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	probe := &ExternalNATS{log: cmp.Or(cfg.Logger, slog.Default()), closedCh: make(chan struct{})}
	probe.closing.Store(true) // a one-shot check has no disconnects worth a warning
	opts, err := cfg.options(probe)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %s: %w", ErrUnavailable, redactURLs(cfg.URLs), err)
	}
	defer nc.Close()
	wctx, cancel := context.WithTimeout(ctx, cmp.Or(cfg.TopologyWait, defaultTopologyWait))
	defer cancel()
	for !nc.IsConnected() {
		if sleepCtx(wctx, awaitFirstBackoff) != nil {
			return nil, errors.Join(fmt.Errorf("%w: not connected to %s", ErrUnavailable, redactURLs(cfg.URLs)), nc.LastError())
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	return VerifyNATSTopology(wctx, js, cfg.NATSTopology)
}
