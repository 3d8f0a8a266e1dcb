package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
)

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

	closing   atomic.Bool
	connected atomic.Bool
	// topologyErr is nil while the topology has no required finding (the last
	// re-check's, or a publish's that found its stream gone); else what was found.
	topologyErr atomic.Pointer[error]
	closedCh    chan struct{}
	// dialErr is the last failed attempt to connect, kept for the broker's life but
	// read by dial alone, for a first connect that failed.
	dialErr atomic.Pointer[error]

	watchCancel context.CancelFunc
	watchDone   chan struct{}
	inst        *instruments
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

var (
	_ Broker         = (*ExternalNATS)(nil)
	_ HealthChecker  = (*ExternalNATS)(nil)
	_ HistoryHorizon = (*ExternalNATS)(nil)
)

// NewNATS connects to the cluster and waits, up to TopologyWait, until the topology
// verifies. A required finding left at the end is a *TopologyError listing every
// finding, also when ctx ends before TopologyWait (the error then wraps ctx's error
// too); a cluster never reached is ErrUnavailable. A configuration that cannot work,
// credentials files included, is ErrInvalidConfig at once, and so are credentials a
// server refuses, wrapping nats.ErrAuthorization (a server refuses them too when its
// auth callout or account resolver did not answer). Recommended findings are logged.
func NewNATS(ctx context.Context, cfg NATSConfig) (*ExternalNATS, error) {
	if ctx == nil {
		return nil, errNilContext("external nats")
	}
	cfg.NATSTopology = cfg.NATSTopology.WithDefaults()
	if err := cfg.Validate(); err != nil {
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
	if e.inst, err = newInstruments(cfg.MeterProvider, cfg.MetricsTenants); err != nil {
		return nil, fmt.Errorf("nats: metrics: %w", err)
	}
	wait := cmp.Or(cfg.TopologyWait, defaultTopologyWait)
	deadline := time.Now().Add(wait)
	bctx, cancel := context.WithDeadline(ctx, deadline.Add(time.Second))
	defer cancel()
	nc, err := dial(bctx, cfg, opts, e, deadline)
	if err != nil {
		return nil, err
	}
	e.nc = nc
	e.connected.Store(nc.IsConnected())
	if e.js, err = jetstream.New(nc); err != nil {
		e.abandon(nc)
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	// At least one check, should the connection have come up at the deadline.
	recommended, err := AwaitNATSTopology(bctx, e.js, e.topo, max(time.Until(deadline), awaitFirstBackoff))
	if err == nil {
		err = e.resolveStreams(bctx)
	}
	if err != nil {
		connected := nc.IsConnected()
		lastErr := nc.LastError()
		e.abandon(nc)
		if !connected {
			return nil, errors.Join(fmt.Errorf("%w: not connected to %s", ErrUnavailable, redactURLs(cfg.URLs)), lastErr, err)
		}
		return nil, err
	}
	for _, f := range recommended {
		e.log.Warn("mq: nats topology recommendation", "finding", f.String())
	}
	e.core.lostTopology = e.lostTopology
	e.pollHistory(bctx)
	if err := e.registerMetrics(); err != nil {
		e.abandon(nc)
		return nil, fmt.Errorf("nats: metrics: %w", err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	e.watchCancel, e.watchDone = wcancel, make(chan struct{})
	go e.watch(wctx)
	return e, nil
}

// abandon closes the connection of a NewNATS or ConnectNATS that failed. The broker is
// marked closing first, or the disconnect handler would log the disconnect this close
// makes as a lost server ("error=<nil>"); and abandon waits for the closed handler, the
// last of the connection's handlers (they run in order), so none of them writes to the
// host's logger after the failed call returned. The wait is bounded as Close's is.
func (e *ExternalNATS) abandon(nc *nats.Conn) {
	e.closing.Store(true)
	nc.Close()
	select {
	case <-e.closedCh:
	case <-time.After(drainTimeout):
	}
}

// resolveStreams finds each partition's stream and the dead-letter stream by subject:
// the operator may name them anything.
func (e *ExternalNATS) resolveStreams(ctx context.Context) error {
	e.core = newNATSCore(e.topo, e.nc, e.js, e.log, newTracer(e.cfg.TracerProvider), e.inst)
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
	lost := fmt.Errorf("%w: stream %s gone or replaced (found by a publish): %w", ErrTopology, stream, err)
	e.topologyErr.Store(&lost)
	e.log.Error("mq: nats topology lost: a publish found its stream gone or replaced", "stream", stream, "error", err)
}

// Publish stores data on the tenant's partition.
func (e *ExternalNATS) Publish(ctx context.Context, topic Topic, data []byte, opts ...PublishOpt) error {
	if err := e.opened(); err != nil {
		return err
	}
	ev, err := e.core.ingestEvent(ctx, topic, data, opts)
	if err != nil {
		return err
	}
	_, err = e.core.send(ctx, ev)
	ev.span.end(err)
	return err
}

// PublishBatch stores b's events on the tenant's partition, pipelined or as one
// atomic batch (see [BatchPublisher]).
func (e *ExternalNATS) PublishBatch(ctx context.Context, b Batch) error {
	if err := e.opened(); err != nil {
		return err
	}
	out, err := e.core.prepareBatch(ctx, b)
	if err != nil || len(out.events) == 0 {
		return err
	}
	err = batchError(e.core.sendBatch(ctx, out))
	out.span.end(err)
	return err
}

// Subscribe runs the hub: an ordered, ack-less consumer on the history from now on.
// The name only names the hub in Health and the log: every process needs every
// event. A handler error is logged.
func (e *ExternalNATS) Subscribe(ctx context.Context, name string, handler Handler) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.subscribe(ctx, name, handler)
}

// CreateConsumer maps cfg.Durable onto the operator's ingest durable and checks it on
// every partition: its ack wait at least cfg's (default the topology's), and a max ack
// pending set. It never creates one.
func (e *ExternalNATS) CreateConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error) {
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
	policy, err := newWorkerPolicy(cfg, len(e.core.partitions))
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
	return &worker{core: e.core, ctx: ctx, durable: durable, policy: policy}, nil
}

// DeadLetter parks msg on the dead-letter stream under its own topic, with a fresh id.
func (e *ExternalNATS) DeadLetter(ctx context.Context, msg *Message, opts ...PublishOpt) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.deadLetter(ctx, msg, opts, "")
}

// DeadLetterCounts counts tenant's parked events with one subject-filtered info call;
// a tenant that parked nothing has zero counts.
func (e *ExternalNATS) DeadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	if err := e.opened(); err != nil {
		return DeadLetterCounts{}, err
	}
	return e.core.deadLetterCounts(ctx, tenant, table)
}

// ReplaySince replays topic from the history.
func (e *ExternalNATS) ReplaySince(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.replay(ctx, topic, since, send)
}

// PurgeAcked removes nothing: the partitions drop an event once acknowledged and the
// history has its own max age. It warns once per tenant whose window (now minus its
// cutoff) is longer than the history keeps: once in the broker's life, since a fixed
// cutoff makes the window grow with every call.
func (e *ExternalNATS) PurgeAcked(ctx context.Context, consumer string, olderThan map[TenantID]time.Time) (bool, error) {
	if err := e.opened(); err != nil {
		return false, err
	}
	if ctx == nil {
		return false, errNilContext("purge acked")
	}
	if err := e.core.checkOpen(); err != nil {
		return false, err
	}
	if _, err := e.topo.durableFor(consumer); err != nil {
		return false, fmt.Errorf("purge acked: %w", err)
	}
	if err := validCutoffs(olderThan); err != nil {
		return false, err
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
func (e *ExternalNATS) SetMaxBytes(ctx context.Context, tenant TenantID, maxBytes int64) error {
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
	if e.opened() != nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.budgets[tenant]
}

// Health reports the connection, the history stream (one stream info request), every
// running hub and Consume, and the last topology re-check (see [HealthChecker]).
func (e *ExternalNATS) Health(ctx context.Context) error {
	if err := e.opened(); err != nil {
		return err
	}
	var topo error
	if err := e.topologyErr.Load(); err != nil {
		topo = fmt.Errorf("health: %w", *err)
	}
	return e.core.health(ctx, topo)
}

// Stats reports the connection (1 or 0) and the client's counters.
func (e *ExternalNATS) Stats() (Stats, error) {
	if err := e.opened(); err != nil {
		return Stats{}, err
	}
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
	if e.opened() != nil {
		return nil // nothing to close
	}
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.watchCancel()
		<-e.watchDone
		e.core.stopAll()
		e.core.replies.settle(drainTimeout) // answers still due, which the drain would lose
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

// CheckNATS connects as cfg says and verifies the topology once, without waiting for
// it to match: the check an operator runs before deploying. It waits up to
// TopologyWait for the connection; a cluster never reached is ErrUnavailable.
func CheckNATS(ctx context.Context, cfg NATSConfig) ([]Finding, error) {
	if ctx == nil {
		return nil, errNilContext("check nats")
	}
	cfg.NATSTopology = cfg.NATSTopology.WithDefaults()
	nc, err := ConnectNATS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, cmp.Or(cfg.TopologyWait, defaultTopologyWait))
	defer cancel()
	return VerifyNATSTopology(wctx, js, cfg.NATSTopology)
}

// ConnectNATS dials the cluster with the connection options NewNATS uses (credentials,
// TLS, inbox prefix, timeouts, reconnects) and waits up to TopologyWait until it is
// connected; it verifies nothing. It is for a plain nats.go client working beside the
// library as the same user, such as mqctl bench's baseline. Its errors are NewNATS's;
// the caller closes the connection.
func ConnectNATS(ctx context.Context, cfg NATSConfig) (*nats.Conn, error) {
	if ctx == nil {
		return nil, errNilContext("connect nats")
	}
	cfg.NATSTopology = cfg.NATSTopology.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	probe := &ExternalNATS{log: cmp.Or(cfg.Logger, slog.Default()), closedCh: make(chan struct{})}
	probe.closing.Store(true) // the broker's handlers would warn on a disconnect nobody watches
	opts, err := cfg.options(probe)
	if err != nil {
		return nil, err
	}
	return dial(ctx, cfg, opts, probe, time.Now().Add(cmp.Or(cfg.TopologyWait, defaultTopologyWait)))
}

// dial connects with opts and waits until connected, or until deadline: a cluster not
// reached by then is ErrUnavailable (joined with ctx's error when ctx ended first). It
// returns at once with ErrInvalidConfig when nats.go refuses opts (a URL that does not
// parse, a CA file that is not PEM) or gives up on credentials a server refused twice
// (e.closedCh, which the options' ClosedHandler closes). opts are e's.
func dial(ctx context.Context, cfg NATSConfig, opts []nats.Option, e *ExternalNATS, deadline time.Time) (*nats.Conn, error) {
	// With RetryOnFailedConnect, Connect fails only on its options: an unreachable
	// server is retried in the background.
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: nats config: connect to %s: %w", ErrInvalidConfig, redactURLs(cfg.URLs), err)
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tick := time.NewTicker(awaitFirstBackoff)
	defer tick.Stop()
	for !nc.IsConnected() {
		select {
		case <-tick.C:
			continue
		case <-e.closedCh:
			// nats.go gives up after the same refusal twice from one server, and
			// the connection is over whatever the other servers would say. The
			// server says "Authorization Violation" for wrong credentials, and also
			// when an auth callout or an account resolver did not answer: the error
			// wraps nats.ErrAuthorization, for a host that tells them apart.
			if err := refusedCredentials(cfg.URLs, nc.LastError()); err != nil {
				return nil, err
			}
		case <-wctx.Done():
		}
		lastErr := nc.LastError()
		if p := e.dialErr.Load(); lastErr == nil && p != nil {
			lastErr = *p
		}
		e.abandon(nc)
		// Refused once, and the wait ended before nats.go tried again (its reconnect
		// wait is 2 s): said as a refusal, not as a server out of reach. A callout
		// that did not answer is refused in the same words, but the wait is over
		// either way, and a wrong credential is the likelier.
		if err := refusedCredentials(cfg.URLs, lastErr); err != nil {
			return nil, err
		}
		return nil, errors.Join(fmt.Errorf("%w: not connected to %s", ErrUnavailable, redactURLs(cfg.URLs)), lastErr, ctx.Err())
	}
	return nc, nil
}

// refusedCredentials is the error for err, a server's refusal of the credentials at
// urls, or nil when err is none. It wraps nats.ErrAuthorization: a refusal of the first
// connect comes as the server's text alone (nats.go too recognises it by the text),
// and that text is nats.ErrAuthorization's.
func refusedCredentials(urls []string, err error) error {
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, nats.ErrAuthorization):
		said := err.Error()
		if !strings.Contains(strings.ToLower(said), "authorization violation") {
			return nil
		}
		err = nats.ErrAuthorization
		if said != err.Error() {
			err = fmt.Errorf("%w (the server said %q)", err, said)
		}
	}
	return fmt.Errorf("%w: nats config: %s refused the credentials: %w", ErrInvalidConfig, redactURLs(urls), err)
}

// DeadLetters pages tenant's parked events, oldest first; see [DeadLetterManager].
func (e *ExternalNATS) DeadLetters(ctx context.Context, tenant TenantID, q DeadLetterQuery) ([]*Message, string, error) {
	if err := e.opened(); err != nil {
		return nil, "", err
	}
	return e.core.listDeadLetters(ctx, tenant, q)
}

// Redrive publishes the selected parked events again through Publish and removes each
// once stored; see [DeadLetterManager].
func (e *ExternalNATS) Redrive(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.redrive(ctx, tenant, sel, e.Publish)
}

// DeleteDeadLetters removes the selected parked events; see [DeadLetterManager].
func (e *ExternalNATS) DeleteDeadLetters(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.deleteDeadLetters(ctx, tenant, sel)
}
