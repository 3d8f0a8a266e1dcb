package mq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// worker is the ingest durable on every partition.
type worker struct {
	core    *natsCore
	ctx     context.Context
	durable string
}

// Consume runs one pull per partition, splitting prefetch between them.
func (w *worker) Consume(handler Handler, prefetch int) (func(), <-chan error, error) {
	c := w.core
	if err := c.checkOpen(); err != nil {
		return nil, nil, err
	}
	if handler == nil {
		return nil, nil, errors.New("consume: nil handler")
	}
	if prefetch < 0 {
		return nil, nil, fmt.Errorf("consume: negative prefetch %d", prefetch)
	}
	if prefetch == 0 {
		prefetch = c.topo.Prefetch
	}
	share := max(1, prefetch/len(c.partitions))
	d := &delivery{failed: make(chan error, 1)}
	for _, stream := range c.partitions {
		if err := d.start(c, w.ctx, stream, w.durable, handler, share); err != nil {
			d.stop()
			return nil, nil, err
		}
	}
	id, ok := c.track(d.stop)
	if !ok {
		d.stop()
		return nil, nil, ErrClosed
	}
	return func() { d.stop(); c.untrack(id) }, d.failed, nil
}

// delivery is one Consume: a pull per partition and the one report of its end.
type delivery struct {
	mu       sync.Mutex
	stopped  bool
	reported bool
	ccs      []jetstream.ConsumeContext
	pins     []*heldPin // one a partition, as ccs
	failed   chan error
}

// heldPin is the pin the server last delivered a partition's events under, on a
// pinned_client durable: stop hands the partition back with it.
type heldPin struct {
	core            *natsCore
	stream, durable string
	id              atomic.Pointer[string]
}

// pinIDHeader carries the pin a message of a pinned_client durable was delivered
// under (nats-server's JSPullRequestNatsPinId).
const pinIDHeader = "Nats-Pin-Id"

func (p *heldPin) saw(m jetstream.Msg) {
	if id := m.Headers().Get(pinIDHeader); id != "" {
		if cur := p.id.Load(); cur == nil || *cur != id {
			p.id.Store(&id)
		}
	}
}

func (d *delivery) start(c *natsCore, ctx context.Context, stream, durable string, handler Handler, share int) error {
	lctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(lctx, stream, durable)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("consume: %w: %s on stream %s", ErrConsumerNotFound, durable, stream)
		}
		return c.mapRequestError("consume: "+durable+" on stream "+stream, err)
	}
	return d.consume(c, ctx, cons, stream, durable, handler, share)
}

// consume pulls from cons until stop, or until delivery ends on its own.
func (d *delivery) consume(c *natsCore, ctx context.Context, cons jetstream.Consumer, stream, durable string, handler Handler, share int) error {
	// The client reports errors of several concrete types; atomic.Value would panic
	// on the second type, so keep a pointer.
	var lastErr atomic.Pointer[error]
	var checking atomic.Bool
	pin := &heldPin{core: c, stream: stream, durable: durable}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		pin.saw(m)
		if d.isOver() {
			// Delivered after stop (the drain lets these through) or after another
			// partition ended the delivery: hand it back at once rather than leave it
			// to the ack wait.
			_ = m.Nak()
			return
		}
		if err := c.handle("worker", handler, c.message(ctx, m, c.settlement(m))); err != nil {
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(share), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.PullPriorityGroup(c.pullGroup(cons)), jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
			lastErr.Store(&err)
			if d.isStopped() {
				return
			}
			c.log.Warn("mq: ingest consumer reported an error", "stream", stream, "consumer", durable, "error", err)
			// A durable deleted while no pull was outstanding is never reported as
			// deleted: measured, the client retries "no responders" and "no
			// heartbeat" every 2 s for good. Look the durable up, once at a time.
			if (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat)) && checking.CompareAndSwap(false, true) {
				go func() {
					defer checking.Store(false)
					if gone := c.durableGone(stream, durable); gone != nil {
						lastErr.Store(&gone)
						cc.Stop()
					}
				}()
			}
		}))
	if err != nil {
		return c.mapRequestError("consume: "+durable+" on stream "+stream, err)
	}
	d.mu.Lock()
	d.ccs = append(d.ccs, cc)
	d.pins = append(d.pins, pin)
	d.mu.Unlock()
	go func() {
		<-cc.Closed()
		err := fmt.Errorf("%w: stream %s consumer %s", ErrDeliveryEnded, stream, durable)
		if reason := lastErr.Load(); reason != nil {
			err = fmt.Errorf("%w: %w", err, *reason)
		}
		d.ended(err)
	}()
	return nil
}

// pullGroup is the priority group to pull cons in: IngestGroup when the durable has
// priority groups (the server refuses a pull without one, "Priority Group missing"),
// "" (none) when it has none.
func (c *natsCore) pullGroup(cons jetstream.Consumer) string {
	if info := cons.CachedInfo(); info != nil && len(info.Config.PriorityGroups) > 0 {
		return c.topo.IngestGroup
	}
	return ""
}

// settlement is how a delivered message settles: through the broker's settler (which
// may observe it, see natsCore.settler), its failures mapped as every other method's
// are, so a message held past Close settles with ErrClosed rather than the client's
// bare "connection closed".
func (c *natsCore) settlement(m jetstream.Msg) Settler {
	return settlement{Settler: c.settler(m), core: c, subject: m.Subject()}
}

type settlement struct {
	Settler
	core    *natsCore
	subject string
}

func (s settlement) Ack() error { return s.failed("ack", s.Settler.Ack()) }

func (s settlement) DoubleAck(ctx context.Context) error {
	return s.failed("double ack", s.Settler.DoubleAck(ctx))
}

func (s settlement) Nak() error { return s.failed("nak", s.Settler.Nak()) }

func (s settlement) NakWithDelay(delay time.Duration) error {
	return s.failed("nak with delay", s.Settler.NakWithDelay(delay))
}

func (s settlement) InProgress() error { return s.failed("in progress", s.Settler.InProgress()) }

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

func (d *delivery) isStopped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopped
}

// isOver reports whether the delivery was stopped or has ended by itself: no handler
// call may start after either.
func (d *delivery) isOver() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopped || d.reported
}

// ended reports the end of delivery once, and never after stop.
func (d *delivery) ended(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.reported {
		return
	}
	d.reported = true
	d.failed <- err // buffered for exactly this one report
	// The whole delivery ends with one partition's: a caller that starts a new Consume
	// must not end up with two pulls on the other partitions.
	for _, cc := range d.ccs {
		cc.Stop()
	}
}

func (d *delivery) stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	ccs, pins := d.ccs, d.pins
	d.mu.Unlock()
	// Drain, not Stop: a pull request the server holds keeps delivering until the
	// unsubscribe reaches it, and a stopped subscription would drop those events into
	// the void for a whole ack wait (measured: 60 s on the operator's durable). A
	// drain passes them to the handler, which naks them.
	for _, cc := range ccs {
		cc.Drain()
	}
	releasePins(ccs, pins)
}

// releasePins hands back every partition still pinned to this delivery, so the next
// pull (a new Consume here, or another worker) gets it at once rather than once
// PinnedTTL has passed (measured: a second Consume in one process waited the whole
// 15 s). A partition the server has pinned to another worker since is left alone:
// unpinning it would let a third take it while that one holds events unsettled.
//
// First the drained pulls must be gone from the server. It keeps a pull request until
// it next looks at it, and pins a partition that has no pin to the first request
// waiting, before it checks that anyone still listens to that request (nats-server
// v2.15.2, consumer.nextWaiting): an event published before the next Consume pulls
// would pin the partition to this stopped delivery. So wait until the pulls have
// unsubscribed, flush, so the server has seen it, and read every partition's durable:
// reading its info drops the requests nobody listens to.
func releasePins(ccs []jetstream.ConsumeContext, pins []*heldPin) {
	if len(pins) == 0 || !pins[0].core.nc.IsConnected() {
		return
	}
	c := pins[0].core
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	for _, cc := range ccs {
		select {
		case <-cc.Closed():
		case <-ctx.Done():
		}
	}
	_ = c.nc.FlushWithContext(ctx)
	var wg sync.WaitGroup
	for _, p := range pins {
		wg.Go(func() { p.release(ctx) })
	}
	wg.Wait()
}

// release reads the partition's durable and unpins it if it is still pinned under the
// pin this delivery last saw.
func (p *heldPin) release(ctx context.Context) {
	c := p.core
	cons, err := c.js.Consumer(ctx, p.stream, p.durable)
	if held := p.id.Load(); err == nil && held != nil {
		for _, g := range cons.CachedInfo().PriorityGroups {
			if g.Group == c.topo.IngestGroup && g.PinnedClientID == *held {
				var stream jetstream.Stream
				if stream, err = c.js.Stream(ctx, p.stream); err == nil {
					err = stream.UnpinConsumer(ctx, p.durable, g.Group)
				}
			}
		}
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.log.Info("mq: could not hand back a partition of the ingest durable; it waits for its pinned TTL", "stream", p.stream,
			"consumer", p.durable, "pinned_ttl", c.topo.PinnedTTL, "error", err)
	}
}
