package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pullExpiry and pullHeartbeat bound how long a worker's pull can stall: nats.go
// v1.55.0 skips a top-up pull while one is in flight, and only the heartbeat
// monitor (twice the heartbeat) restarts it. Measured: with the defaults (30 s,
// 15 s) a loaded machine stalled delivery ~30 s in about 1 of 30 runs; with these,
// 0 of 45.
const (
	pullExpiry    = 5 * time.Second
	pullHeartbeat = time.Second
)

// Worker defaults (see ConsumerConfig).
const (
	defaultConcurrency   = 16
	defaultMaxDeliveries = 10
	defaultRetryDelay    = time.Second
	defaultMaxRetryDelay = time.Minute
	defaultStopTimeout   = 10 * time.Second
	defaultMemberTimeout = 3 * time.Second
	// minMemberTimeout: below it a worker's heartbeats (three per timeout) would come
	// faster than a loaded server and scheduler can be relied on to carry them, and a
	// busy worker would be declared gone between two of them.
	minMemberTimeout = 100 * time.Millisecond
)

// durable maps a consumer name onto the ingest durable, on an open broker.
func (c *natsCore) durable(name string) (string, error) {
	if err := c.checkOpen(); err != nil {
		return "", err
	}
	durable, err := c.topo.durableFor(name)
	if err != nil {
		return "", fmt.Errorf("create consumer: %w", err)
	}
	return durable, nil
}

// workerPolicy is a ConsumerConfig's worker settings with the defaults applied.
type workerPolicy struct {
	concurrency   int
	maxDeliveries int // 0: never park
	retryDelay    time.Duration
	maxRetryDelay time.Duration
	stopTimeout   time.Duration
	memberTimeout time.Duration
	claim         []int // the partitions claimed; nil joins the group
}

// newWorkerPolicy checks cfg's worker settings against a topology of n partitions.
func newWorkerPolicy(cfg ConsumerConfig, n int) (workerPolicy, error) {
	bad := func(format string, args ...any) (workerPolicy, error) {
		return workerPolicy{}, fmt.Errorf("create consumer %q: %w: "+format, append([]any{cfg.Durable, ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.AckWait < 0, cfg.RetryDelay < 0, cfg.MaxRetryDelay < 0, cfg.StopTimeout < 0, cfg.MemberTimeout < 0:
		return bad("negative duration (ack wait %s, retry delay %s, max retry delay %s, stop timeout %s, member timeout %s)",
			cfg.AckWait, cfg.RetryDelay, cfg.MaxRetryDelay, cfg.StopTimeout, cfg.MemberTimeout)
	case cfg.MaxAckPending < 0, cfg.Concurrency < 0:
		return bad("negative count (max ack pending %d, concurrency %d)", cfg.MaxAckPending, cfg.Concurrency)
	case cfg.MemberTimeout > 0 && cfg.MemberTimeout < minMemberTimeout:
		return bad("member timeout %s is below %s", cfg.MemberTimeout, minMemberTimeout)
	}
	p := workerPolicy{
		concurrency:   cmp.Or(cfg.Concurrency, defaultConcurrency),
		maxDeliveries: cmp.Or(cfg.MaxDeliveries, defaultMaxDeliveries),
		retryDelay:    cmp.Or(cfg.RetryDelay, defaultRetryDelay),
		maxRetryDelay: cmp.Or(cfg.MaxRetryDelay, defaultMaxRetryDelay),
		stopTimeout:   cmp.Or(cfg.StopTimeout, defaultStopTimeout),
		memberTimeout: cmp.Or(cfg.MemberTimeout, defaultMemberTimeout),
	}
	if p.maxDeliveries < 0 {
		p.maxDeliveries = 0
	}
	p.maxRetryDelay = max(p.maxRetryDelay, p.retryDelay)
	if cfg.Partitions != nil {
		if len(cfg.Partitions) == 0 {
			return bad("an empty partition claim takes nothing; leave Partitions nil to join the other workers")
		}
		for _, q := range cfg.Partitions {
			if q < 0 || q >= n {
				return bad("partition %d does not exist (the topology has 0 to %d)", q, n-1)
			}
		}
		p.claim = slices.Clone(cfg.Partitions)
		slices.Sort(p.claim)
		if len(slices.Compact(p.claim)) != len(cfg.Partitions) {
			return bad("partition claim %v names a partition twice", cfg.Partitions)
		}
	}
	return p, nil
}

// worker is the ingest durable on every partition, as one Consume sees it.
type worker struct {
	core    *natsCore
	ctx     context.Context
	durable string
	policy  workerPolicy
}

// Consume starts the dispatcher: a pull on each partition of a static claim, or a
// member of the workers' group that takes its share.
func (w *worker) Consume(handler Handler, prefetch int) (func(), <-chan error, error) {
	c := w.core
	if err := c.checkOpen(); err != nil {
		return nil, nil, err
	}
	if handler == nil {
		return nil, nil, fmt.Errorf("consume: %w: nil handler", ErrInvalidConfig)
	}
	if prefetch < 0 {
		return nil, nil, fmt.Errorf("consume: %w: negative prefetch %d", ErrInvalidConfig, prefetch)
	}
	if prefetch == 0 {
		prefetch = c.topo.Prefetch
	}
	d := newDispatcher(c, w.ctx, w.durable, handler, w.policy, max(1, prefetch/len(c.partitions)))
	d.group = newGroup(d, c.topo.workerSubject(), w.policy.memberTimeout)
	for _, p := range w.policy.claim {
		if err := d.take(p); err != nil {
			d.stop()
			return nil, nil, err
		}
		d.group.owned[p] = true
	}
	if err := d.group.join(); err != nil {
		d.stop()
		return nil, nil, err
	}
	// Tracked until Close even once stopped: what the handler returned unsettled is
	// the host's to settle until then, and Close hands it back.
	if _, ok := c.track(d.close); !ok {
		d.close()
		return nil, nil, ErrClosed
	}
	return d.stop, d.failed, nil
}

// pull starts partition p's pull for u: the durable's priority group when it has one,
// so the server pins the partition to one worker at a time.
func (d *dispatcher) pull(u *unit) error {
	c := d.core
	lctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(lctx, u.stream, d.durable)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("consume: %w: %s on stream %s", ErrConsumerNotFound, d.durable, u.stream)
		}
		return c.mapRequestError("consume: "+d.durable+" on stream "+u.stream, err)
	}
	return d.consume(u, cons)
}

// consume pulls cons for u until the release of u, or until the pull ends by itself.
func (d *dispatcher) consume(u *unit, cons jetstream.Consumer) error {
	c := d.core
	info := cons.CachedInfo()
	cfg := info.Config
	// u is filed already: keepAlive reads its ack wait under d.mu.
	returning := c.returning.since(u.p, info.Delivered.Stream)
	d.mu.Lock()
	u.ackWait = cfg.AckWait
	u.acked = d.ackedOn(u.p, cfg.MaxAckPending)
	select {
	case d.retick <- struct{}{}:
	default: // one is pending already
	}
	// Only this worker pulls the partition now: what is pending is the previous
	// owner's, and comes back out of sequence order (see backlog).
	u.backlog = d.newBacklog(info, returning)
	d.mu.Unlock()
	u.lastDelivery.Store(info.Delivered.Consumer)
	u.pinAtTake = groupPin(info, c.topo.IngestGroup)
	d.core.log.Debug("mq: taking a partition", "stream", u.stream, "consumer", d.durable,
		"ack_pending", info.NumAckPending, "last_delivered", info.Delivered.Stream, "ack_floor", info.AckFloor.Stream)
	opts := []jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(d.share), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) { d.pullError(u, cc, err) }),
	}
	// A durable with priority groups refuses a pull without one ("Priority Group
	// missing"); one without takes only a pull without.
	if len(cfg.PriorityGroups) > 0 {
		u.group = c.topo.IngestGroup
		opts = append(opts, jetstream.PullPriorityGroup(u.group))
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { d.arrive(u, m) }, opts...)
	if err != nil {
		return c.mapRequestError("consume: "+d.durable+" on stream "+u.stream, err)
	}
	d.mu.Lock()
	if u.releasing.Load() {
		// Released while the pull started: release found no pull to drain.
		d.mu.Unlock()
		cc.Drain()
		return nil
	}
	u.cc = cc
	d.mu.Unlock()
	go func() {
		<-cc.Closed()
		err := fmt.Errorf("%w: stream %s consumer %s", ErrDeliveryEnded, u.stream, d.durable)
		if reason := u.lastErr.Load(); reason != nil {
			err = fmt.Errorf("%w: %w", err, *reason)
		}
		d.pullEnded(u, err)
	}()
	return nil
}

// pullError keeps the pull's last error for the report of its end, and finds a
// durable deleted while no pull was outstanding, which the client never reports as
// deleted: measured, it retries "no responders" and "no heartbeat" every 2 s for good.
func (d *dispatcher) pullError(u *unit, cc jetstream.ConsumeContext, err error) {
	u.lastErr.Store(&err)
	if d.isOver() || u.isReleasing() {
		return
	}
	d.core.log.Warn("mq: ingest consumer reported an error", "stream", u.stream, "consumer", d.durable, "error", err)
	if (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat)) && u.checking.CompareAndSwap(false, true) {
		go func() {
			defer u.checking.Store(false)
			if gone := d.core.durableGone(u.stream, d.durable); gone != nil {
				u.lastErr.Store(&gone)
				cc.Stop()
			}
		}()
	}
}

// settled is the kind of settle a handler made.
type settled int

const (
	settledAck settled = iota
	settledNak
	settledFailed // an ack or nak the server never got: the ack wait brings the event back
)

// settlement is how a delivered message settles: through the broker's settler (which
// may observe it, see natsCore.settler), its failures mapped as every other method's
// are, so a message held past Close settles with ErrClosed rather than the client's
// bare "connection closed". observer, when set, hears of every ack and nak: the kind
// made, or settledFailed when it could not be sent, and a nak's delay.
type settlement struct {
	Settler
	core     *natsCore
	subject  string
	observer interface {
		observe(kind settled, delay time.Duration)
	}
}

func (s settlement) Ack() error { return s.done(settledAck, "ack", s.Settler.Ack()) }

func (s settlement) DoubleAck(ctx context.Context) error {
	return s.done(settledAck, "double ack", s.Settler.DoubleAck(ctx))
}

func (s settlement) Nak() error { return s.done(settledNak, "nak", s.Settler.Nak()) }

func (s settlement) NakWithDelay(delay time.Duration) error {
	return s.observed(settledNak, delay, "nak with delay", s.Settler.NakWithDelay(delay))
}

func (s settlement) InProgress() error { return s.failed("in progress", s.Settler.InProgress()) }

func (s settlement) done(kind settled, what string, err error) error {
	return s.observed(kind, 0, what, err)
}

func (s settlement) observed(kind settled, delay time.Duration, what string, err error) error {
	if s.observer != nil {
		if err != nil {
			kind = settledFailed
		}
		s.observer.observe(kind, delay)
	}
	return s.failed(what, err)
}

func (s settlement) failed(what string, err error) error {
	if err == nil {
		return nil
	}
	return s.core.mapRequestError(what+" "+s.subject, err)
}

// durableGone returns an error wrapping jetstream.ErrConsumerDeleted when the durable
// no longer exists, and nil when it does or the lookup could not tell.
func (c *natsCore) durableGone(stream, durable string) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	_, err := c.js.Consumer(ctx, stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("%w: %w", jetstream.ErrConsumerDeleted, err)
	}
	return nil
}
