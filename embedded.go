package mq

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/gofrs/flock"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// EmbeddedOptions configures an EmbeddedNATS. The zero value is a working broker in a
// temporary directory with no network listener.
type EmbeddedOptions struct {
	// StoreDir holds the JetStream store. Empty means a new temporary directory that
	// Close removes; a named directory is kept and can be opened again. One broker
	// serves a store at a time: it holds a lock on StoreDir/mq.lock until Close or
	// its process ends, and a second NewEmbedded on the store waits ReadyTimeout for
	// it, then returns ErrUnavailable.
	StoreDir string
	// ListenAddr, when set (e.g. "127.0.0.1:0"), also serves NATS clients on that TCP
	// address; see ClientURL. Empty means in-process connections only. The listener
	// has no authentication, so keep it on loopback; any other address is logged as a
	// warning. An address that cannot be bound here is ErrInvalidConfig, a port in use
	// ErrUnavailable, both at once.
	ListenAddr string
	// Topology names and sizes the streams. Zero fields take NATSTopology's defaults;
	// replicas are always 1. A store keeps its partition count while any partition
	// holds an event: another Partitions is ErrInvalidConfig until a worker drained
	// them (a tenant's partition is its hash modulo the count); then the change is
	// made and the partitions beyond the new count are removed.
	Topology NATSTopology
	// NoSync skips the fsync after every write: faster, and a power loss (not a
	// process crash) can lose the last acknowledged writes.
	NoSync bool
	// ReadyTimeout bounds the server's start, and the wait for a store another broker
	// still holds. Default 10s.
	ReadyTimeout time.Duration
	// Logger receives the broker's and the server's logs (attribute component=nats).
	// Default slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the broker's metrics (see the README's Metrics).
	// Default: the global provider, otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// MetricsTenants adds the tenant id (mq.tenant) to the per-tenant gauges and the
	// message and park counters. Off, those gauges sum the tenants of each partition
	// and no metric names a tenant: turn it on only for a bounded number of tenants.
	MetricsTenants bool
	// TracerProvider makes the producer, consumer and replay spans (see the README's
	// Tracing). Default: the global provider, otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// EmbeddedNATS is a Broker over an in-process nats-server. It creates the topology of
// NATSTopology itself and enforces per-tenant byte budgets, because it sees every
// publish: a tenant never given a budget is refused with ErrQueueFull.
type EmbeddedNATS struct {
	core    *natsCore
	topo    NATSTopology
	subs    subjects
	js      jetstream.JetStream
	nc      *nats.Conn
	srv     *server.Server
	log     *slog.Logger
	budgets *budgets
	// commits coalesces concurrent Publish calls under fsync (publish_coalesce.go);
	// nil with NoSync, where each call is sent on its own.
	commits *coalescer
	// partitionOf maps a partition's stream name to its index.
	partitionOf map[string]int
	kv          jetstream.KeyValue
	// budgetWatch follows the budget bucket; budgetWatchEnd cancels its context and
	// budgetWatchDone closes when its goroutine has ended.
	// doubtful[p] lists, in sequence order, partition p's events the boot counted
	// although they had been delivered (see releaseDoubtful), which doubtfulEnd stops
	// and doubtfulDone reports the end of.
	doubtful        [][]uint64
	doubtfulEnd     chan struct{}
	doubtfulDone    chan struct{}
	budgetWatch     jetstream.KeyWatcher
	budgetWatchEnd  context.CancelFunc
	budgetWatchDone chan struct{}
	metrics         metric.Registration
	tempDir         string
	storeDir        string       // the server's store directory
	storeLock       *flock.Flock // held while this broker serves a StoreDir
	listening       bool
}

var (
	_ Broker         = (*EmbeddedNATS)(nil)
	_ HealthChecker  = (*EmbeddedNATS)(nil)
	_ HistoryHorizon = (*EmbeddedNATS)(nil)
)

// Embedded broker bounds.
const (
	defaultReadyTimeout = 10 * time.Second
	bootTimeout         = 30 * time.Second
	sourceAttachWait    = 25 * time.Second // past the server's first retry (awaitSources)
	sourceAttachSlow    = 2 * time.Second
	rebuildFetch        = 1024
	rebuildWait         = time.Second
	closeFlushTimeout   = 2 * time.Second
	// doubtfulPoll is how often the ack floor is read while events counted at boot
	// may already be acknowledged.
	doubtfulPoll = time.Second
	// msgSizeHeader carries the payload size of a message delivered headers-only.
	msgSizeHeader = "Nats-Msg-Size"
	// maxStore is what JetStream may reserve for all streams together: huge, because
	// budgets, not the server, bound each tenant, and half the int64 range because a
	// store that fails to open can release a reservation it never made.
	maxStore = math.MaxInt64 / 2
)

// NewEmbedded starts an in-process nats-server, creates or updates the topology (every
// partition with its durable before anything can be published, the history sourcing
// them, the dead-letter stream), restores the budgets and backlogs kept in the store,
// and returns the broker. Options that cannot work (a store directory it cannot make,
// a topology the server refuses, such as partitions larger than it may reserve) wrap
// ErrInvalidConfig.
func NewEmbedded(ctx context.Context, opts EmbeddedOptions) (*EmbeddedNATS, error) {
	if ctx == nil {
		return nil, errNilContext("embedded nats")
	}
	topo := opts.Topology.WithDefaults()
	topo.Replicas = 1
	if err := topo.Validate(); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	// checkPartitions takes a stream named as a partition of a larger count for one an
	// earlier count left behind: a history of that name, once it held events, would
	// keep the store from opening again.
	if p, ok := topo.partitionOfStream(topo.HistoryStream); ok {
		return nil, fmt.Errorf("%w: embedded nats: the history stream %q is named as ingest partition %d's stream of a larger count",
			ErrInvalidConfig, topo.HistoryStream, p)
	}
	if opts.ReadyTimeout < 0 {
		return nil, fmt.Errorf("%w: embedded nats: negative ReadyTimeout %s", ErrInvalidConfig, opts.ReadyTimeout)
	}
	if opts.ListenAddr != "" {
		if _, _, err := parseListenAddr(opts.ListenAddr); err != nil {
			return nil, err
		}
	}
	log := cmp.Or(opts.Logger, slog.Default())
	e := &EmbeddedNATS{
		topo: topo, subs: topo.subjects(), log: log,
		budgets:     newBudgets(topo.Partitions, topo.DuplicateWindow-topo.minDuplicateWindow()),
		partitionOf: make(map[string]int, topo.Partitions),
	}
	for p := range topo.Partitions {
		e.partitionOf[topo.PartitionStream(p)] = p
	}
	dir := opts.StoreDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "mq-embedded-")
		if err != nil {
			return nil, fmt.Errorf("%w: embedded nats: a temporary store: %w", ErrUnavailable, err)
		}
		dir, e.tempDir = tmp, tmp
	}
	// A store JetStream cannot create fails in the background and readiness would
	// only time out, so make it first.
	if err := os.MkdirAll(dir, 0o700); err != nil { // a file, under a file, a bad name, no permission
		return nil, fmt.Errorf("%w: embedded nats: store %s: %w", ErrInvalidConfig, dir, err)
	}
	if e.tempDir == "" { // a temporary store is this broker's alone
		lock, err := lockStore(ctx, dir, cmp.Or(opts.ReadyTimeout, defaultReadyTimeout))
		if err != nil {
			return nil, err
		}
		e.storeLock = lock
	}
	if err := e.start(opts, dir); err != nil {
		e.shutdown()
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	if err := e.boot(bctx); err != nil {
		e.shutdown()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if err := e.registerMetrics(); err != nil {
		e.shutdown()
		return nil, fmt.Errorf("embedded nats: metrics: %w", err)
	}
	return e, nil
}

func (e *EmbeddedNATS) start(opts EmbeddedOptions, dir string) error {
	sopts := &server.Options{
		ServerName:        "mq-embedded-" + nuid.Next(),
		JetStream:         true,
		StoreDir:          dir,
		JetStreamMaxStore: maxStore,
		SyncAlways:        !opts.NoSync,
		NoSigs:            true,
		DontListen:        opts.ListenAddr == "",
	}
	if opts.ListenAddr != "" {
		host, port, err := parseListenAddr(opts.ListenAddr)
		if err != nil {
			return err
		}
		if err := checkListen(opts.ListenAddr); err != nil {
			return err
		}
		sopts.Host, sopts.Port = host, port
		if sopts.Port == 0 {
			sopts.Port = server.RANDOM_PORT
		}
		if beyondLoopback(host) {
			e.log.Warn("mq: the embedded server listens beyond loopback without authentication: whoever reaches it may read, change and delete every stream",
				"address", opts.ListenAddr)
		}
	}
	e.listening = !sopts.DontListen
	if err := e.prepareLegacyStore(dir); err != nil {
		return err
	}
	if err := e.detachHistory(dir); err != nil {
		return err
	}
	e.storeDir = dir
	srv, err := server.NewServer(sopts)
	if err != nil {
		return fmt.Errorf("embedded nats: server: %w", err)
	}
	e.srv = srv
	srv.SetLoggerV2(serverLogger{e.log.With("component", "nats")}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(cmp.Or(opts.ReadyTimeout, defaultReadyTimeout)) {
		return fmt.Errorf("embedded nats: server in %s not ready", dir)
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("mq-embedded"),
		nats.MaxReconnects(-1), nats.NoCallbacksAfterClientClose())
	if err != nil {
		return fmt.Errorf("embedded nats: connect: %w", err)
	}
	e.nc = nc
	e.js, err = jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("embedded nats: jetstream: %w", err)
	}
	inst, err := newInstruments(opts.MeterProvider, opts.MetricsTenants)
	if err != nil {
		return fmt.Errorf("embedded nats: metrics: %w", err)
	}
	e.core = newNATSCore(e.topo, nc, e.js, e.log, newTracer(opts.TracerProvider), inst)
	e.core.settler = e.settler
	e.core.ackedHere = e.budgets.acknowledged
	e.core.chunkBatches = !opts.NoSync
	if e.core.chunkBatches {
		e.commits = newCoalescer(e.core, e.settleReserved)
	}
	return nil
}

// ClientURL returns the URL NATS clients reach the server at, or "" without a
// listener.
func (e *EmbeddedNATS) ClientURL() string {
	if e.opened() != nil {
		return ""
	}
	if !e.listening {
		return ""
	}
	return e.srv.ClientURL()
}

// Subscribe runs the hub: an ordered consumer on the history from now on.
func (e *EmbeddedNATS) Subscribe(ctx context.Context, name string, handler Handler) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.subscribe(ctx, name, handler)
}

// CreateConsumer maps cfg.Durable onto the ingest durable and applies cfg's AckWait and
// MaxAckPending to it on every partition.
func (e *EmbeddedNATS) CreateConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error) {
	if err := e.opened(); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, errNilContext("create consumer")
	}
	durable, err := e.core.durable(cfg.Durable)
	if err != nil {
		return nil, err
	}
	policy, err := newWorkerPolicy(cfg, e.topo.Partitions)
	if err != nil {
		return nil, err
	}
	for p := range e.topo.Partitions {
		want := e.topo.ingestConsumerConfig(p)
		want.AckWait = cmp.Or(cfg.AckWait, want.AckWait)
		want.MaxAckPending = cmp.Or(cfg.MaxAckPending, want.MaxAckPending)
		if _, err := e.js.CreateOrUpdateConsumer(ctx, e.topo.PartitionStream(p), want); err != nil {
			return nil, e.core.mapRequestError(fmt.Sprintf("create consumer %s on stream %s", durable, e.topo.PartitionStream(p)), err)
		}
	}
	return &worker{core: e.core, ctx: ctx, durable: durable, policy: policy}, nil
}

// ReplaySince replays topic from the history.
func (e *EmbeddedNATS) ReplaySince(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.replay(ctx, topic, since, send)
}

// SetMaxBytes records tenant's budget in the store and enforces it from now on. Of
// concurrent calls for one tenant, the one the store keeps last is the one enforced.
func (e *EmbeddedNATS) SetMaxBytes(ctx context.Context, tenant TenantID, maxBytes int64) error {
	if err := e.opened(); err != nil {
		return err
	}
	if err := e.core.checkOpen(); err != nil {
		return err
	}
	if ctx == nil {
		return errNilContext("set max bytes")
	}
	if err := tenant.Validate(); err != nil {
		return fmt.Errorf("set max bytes: %w", err)
	}
	if maxBytes < 0 {
		return fmt.Errorf("set max bytes: tenant %s: negative budget %d: %w", tenant, maxBytes, ErrInvalidConfig)
	}
	if e.budgets.inForce(tenant, maxBytes) {
		return nil
	}
	rev, err := e.kv.Put(ctx, string(tenant), []byte(strconv.FormatInt(maxBytes, 10)))
	if err != nil {
		// The write may be stored all the same: the watch enforces it then, and
		// until the outcome is known the next call writes rather than trust memory.
		e.budgets.doubt(tenant)
		return e.core.mapRequestError("set max bytes: tenant "+string(tenant), err)
	}
	e.budgets.wrote(tenant, maxBytes, rev)
	return nil
}

// MaxBytes returns tenant's budget, or 0.
func (e *EmbeddedNATS) MaxBytes(tenant TenantID) int64 {
	if e.opened() != nil {
		return 0
	}
	n, _ := e.budgets.limit(tenant)
	return n
}

// Stats reads the server's counters.
func (e *EmbeddedNATS) Stats() (Stats, error) {
	if err := e.opened(); err != nil {
		return Stats{}, err
	}
	if err := e.core.checkOpen(); err != nil {
		return Stats{}, err
	}
	v, err := e.srv.Varz(nil)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	return Stats{
		Connections: int64(v.Connections),
		InMsgs:      v.InMsgs, InBytes: v.InBytes,
		OutMsgs: v.OutMsgs, OutBytes: v.OutBytes,
	}, nil
}

// Health reports the connection to the in-process server, the history stream (one
// stream info request), and every running hub and Consume (see [HealthChecker]).
func (e *EmbeddedNATS) Health(ctx context.Context) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.health(ctx, nil)
}

// Close stops every consumer and subscription, flushes pending acks, shuts the server
// down and waits for it, so the store can be opened again with nothing lost. Before
// the shutdown it waits up to 5 s for the history to copy what the partitions hold, so
// the next start's hub and replays see new events at once (see awaitCopies).
func (e *EmbeddedNATS) Close() error {
	if e.opened() != nil {
		return nil // nothing to close
	}
	if !e.core.stopAll() {
		return nil
	}
	e.saveAcked()
	if e.tempDir == "" && !e.listening { // a store the next start opens, and only this process writes to
		e.awaitCopies()
	}
	e.shutdown()
	return nil
}

func (e *EmbeddedNATS) shutdown() {
	if e.metrics != nil {
		_ = e.metrics.Unregister()
	}
	e.stopBudgetWatch()
	if e.doubtfulEnd != nil {
		close(e.doubtfulEnd)
		<-e.doubtfulDone // at most one consumer lookup, bounded by PublishTimeout
	}
	if e.nc != nil {
		_ = e.nc.FlushTimeout(closeFlushTimeout)
		e.nc.Close()
		if e.commits != nil {
			e.commits.wait() // their sends fail at once now
		}
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	if e.tempDir != "" {
		_ = os.RemoveAll(e.tempDir)
	}
	if e.storeLock != nil {
		_ = e.storeLock.Close() // unlocks: the next broker may serve the store
	}
}

// registerMetrics registers the core's gauges and the budgets': per tenant with
// MetricsTenants, else summed per partition.
func (e *EmbeddedNATS) registerMetrics() error {
	g := e.core.gauges()
	backlog := g.int64(metricTenantBacklog, "Bytes of the tenants' events stored and not yet acknowledged by the ingest worker.")
	budget := g.int64(metricTenantBudget, "The tenants' byte budgets; a tenant's publishes past its own are refused.")
	g.then(func(_ context.Context, o metric.Observer) {
		limits, used := e.budgets.snapshot()
		sums := map[attribute.Distinct]*[2]int64{}
		sets := map[attribute.Distinct]attribute.Set{}
		for t := range limits {
			set := e.core.tenantAttrs(t)
			k := set.Equivalent()
			if sums[k] == nil {
				sums[k], sets[k] = new([2]int64), set
			}
			sums[k][0] += limits[t]
			sums[k][1] += used[t]
		}
		for k, s := range sums {
			o.ObserveInt64(budget, s[0], metric.WithAttributeSet(sets[k]))
			o.ObserveInt64(backlog, s[1], metric.WithAttributeSet(sets[k]))
		}
	})
	var err error
	e.metrics, err = g.register()
	return err
}

// serverLogger hands nats-server's log lines to slog. Fatal is logged at Error and
// never exits the process.
type serverLogger struct{ log *slog.Logger }

func (l serverLogger) Noticef(format string, v ...any) { l.log.Info(fmt.Sprintf(format, v...)) }
func (l serverLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l serverLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
