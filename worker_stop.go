package mq

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The worker's end: a graceful stop, and a partition given up (at stop, on a
// handover, or when its pull ended by itself). Everything the worker holds of a
// partition goes back to the server unsettled and in sequence order, so the next
// worker has it at once, in order, rather than after the ack wait.

// stop ends the delivery: no handler call begins after it is called; it waits up to
// StopTimeout for the calls in flight, then hands back every partition. A second call
// waits for the first to finish.
func (d *dispatcher) stop() {
	d.forget() // stopped by its caller (or Close): Health no longer counts it
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		<-d.done
		return
	}
	d.stopped = true
	d.wake.Broadcast()
	d.room.Broadcast()
	d.mu.Unlock()
	d.leave(time.Now().Add(d.policy.stopTimeout))
	d.checks.Wait()
	close(d.done)
}

// leave hands back every partition and leaves the group.
func (d *dispatcher) leave(deadline time.Time) {
	if d.group != nil {
		d.group.halt()
	}
	d.mu.Lock()
	units := d.unitList()
	d.mu.Unlock()
	d.releaseAll(units, deadline)
	if d.group != nil {
		for _, u := range units {
			if u.unsettled.Load() {
				d.group.noteUnsettled(u.p)
			}
		}
		d.group.leave()
	}
	d.endTicks()
}

// give hands partition p back, for another worker to take.
func (d *dispatcher) give(p int) {
	d.mu.Lock()
	u := d.units[p]
	d.mu.Unlock()
	if u == nil {
		return
	}
	d.release(u, time.Now().Add(d.policy.stopTimeout))
	if u.unsettled.Load() && d.group != nil {
		d.group.noteUnsettled(p)
	}
	d.mu.Lock()
	if d.units[p] == u {
		delete(d.units, p)
		d.given = append(d.given, u)
	}
	d.mu.Unlock()
}

// close is stop at the broker's Close: a message a handler returned without settling
// can no longer be settled once the connection closes, so it goes back too, rather
// than wait for the ack wait.
func (d *dispatcher) close() {
	d.stop()
	d.mu.Lock()
	var held []*entry
	for _, u := range append(d.unitList(), d.given...) {
		for _, e := range u.returned {
			held = append(held, e)
		}
		clear(u.returned)
	}
	d.mu.Unlock()
	slices.SortFunc(held, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	ctx, cancel := context.WithTimeout(context.Background(), d.core.topo.PublishTimeout)
	defer cancel()
	if _, err := d.handBack(ctx, held, ""); err != nil {
		d.core.log.Debug("mq: cannot hand back what handlers left unsettled; the ack wait redelivers it",
			"consumer", d.durable, "error", err)
	}
}

// unitList is every partition taken, under d.mu.
func (d *dispatcher) unitList() []*unit {
	units := make([]*unit, 0, len(d.units))
	for _, u := range d.units {
		units = append(units, u)
	}
	return units
}

func (d *dispatcher) releaseAll(units []*unit, deadline time.Time) {
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Go(func() { d.release(u, deadline) })
	}
	wg.Wait()
}

func (d *dispatcher) endTicks() { d.tickOnce.Do(func() { close(d.endTick) }) }

// pullEnded is told when partition u's pull closed. Unless the worker closed it, the
// whole delivery ends with it: a caller that starts a new Consume must not end up
// with two pulls on the other partitions.
func (d *dispatcher) pullEnded(u *unit, err error) {
	if u.isReleasing() {
		return
	}
	d.ended(err)
}

// ended ends the delivery on its own and reports err, once, unless stop came first.
func (d *dispatcher) ended(err error) {
	d.mu.Lock()
	if d.over() {
		d.mu.Unlock()
		return
	}
	d.reported = true
	d.part.fail(fmt.Errorf("%s delivery ended: %w", d.part.name, err))
	d.failed <- err // buffered for exactly this one report
	d.wake.Broadcast()
	d.room.Broadcast()
	d.mu.Unlock()
	go d.leave(time.Now().Add(d.policy.stopTimeout))
}

// release gives partition u up: its pull drains, the calls in flight finish (until
// deadline), and everything held of it is nak'ed in sequence order; then its pin is
// released, so the next worker's pull is served at once. A second release of u waits
// for the first.
func (d *dispatcher) release(u *unit, deadline time.Time) {
	d.mu.Lock()
	if u.releasing.Swap(true) {
		d.mu.Unlock()
		<-u.handedBack
		return
	}
	if u.running == 0 {
		close(u.idle)
	}
	d.room.Broadcast() // a pull waiting for room files its event as late
	cc := u.cc
	d.mu.Unlock()
	defer close(u.handedBack)
	if cc != nil {
		d.awaitInFlight(u, cc, deadline)
		// Drain, not Stop: a pull the server holds keeps delivering until the
		// unsubscribe reaches it, and a stopped subscription would drop those events
		// into the void for a whole ack wait. Drained ones arrive as late and go back
		// with the rest.
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(time.Until(deadline)):
		}
	}
	select {
	case <-u.idle:
	case <-time.After(time.Until(deadline)):
		d.core.log.Warn("mq: handler calls still running at the stop timeout; their events are left to the ack wait",
			"stream", u.stream, "consumer", d.durable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.core.topo.PublishTimeout)
	defer cancel()
	// The server must have dropped the drained pull before the naks. It keeps a pull
	// request until it next looks at it: it would redeliver into the void until the
	// ack wait, and on a pinned durable it pins a partition that has no pin to the
	// first request waiting before it checks that anyone still listens to it
	// (nats-server v2.15.2, consumer.nextWaiting), for the whole pinned TTL. The
	// flush makes the server see the unsubscribe; reading the durable's info drops
	// the requests nobody listens to.
	_ = d.core.nc.FlushWithContext(ctx)
	cons, infoErr := d.core.js.Consumer(ctx, u.stream, d.durable)
	held := d.takeHeld(u)
	d.mu.Lock()
	barrier, returned := u.lastAcked, len(u.returned)
	d.mu.Unlock()
	if n, err := d.handBack(ctx, held, barrier); err != nil {
		// Not unpinned: the partition waits for the pinned TTL, which gives the
		// unconfirmed naks time to arrive, or the ack wait to redeliver them, before
		// the next owner pulls.
		u.unsettled.Store(true)
		d.core.log.Info("mq: could not hand back every event of a partition; the ack wait redelivers them",
			"stream", u.stream, "consumer", d.durable, "handed_back", n, "held", len(held), "error", err)
		return
	}
	// Everything this worker sent the leader is processed now (handBack's barrier), so
	// what the durable still has pending beyond what was handed back and what the
	// host holds was delivered to this worker and never reached it (the server's last
	// deliveries can cross the unsubscribe, on one node as on a cluster), or is held
	// by another worker. handBackUnarrived puts the first back when it can tell them
	// apart. Otherwise the next owner must not pull before they come back, an ack wait
	// after their delivery; the group treats the partition as an orphan rather than
	// as released.
	if infoErr == nil {
		if info, err := cons.Info(ctx); err == nil && info.NumAckPending > len(held)+returned && !d.handBackUnarrived(ctx, u, info, held) {
			u.unsettled.Store(true)
			d.core.log.Info("mq: events of a partition were delivered as it was released and never arrived; the next owner waits an ack wait for them",
				"stream", u.stream, "consumer", d.durable, "ack_pending", info.NumAckPending, "handed_back", len(held), "held_by_host", returned)
			return
		}
	}
	if len(held) > 0 {
		d.core.log.Debug("mq: handed a partition's events back", "stream", u.stream, "consumer", d.durable,
			"handed_back", len(held), "first", held[0].seq, "last", held[len(held)-1].seq, "held_by_host", returned)
	}
	if u.group != "" && infoErr == nil && !d.core.nc.IsClosed() {
		d.unpin(ctx, u, cons)
	}
}

// handBack puts held back on the server's redelivery queue, in the order given, and
// returns once the consumer's leader confirmed each, or with how many it confirmed
// when ctx ends first. A nak sent without waiting can reach the leader after a later
// unpin (the server runs acks and API requests on different queues), and the next
// owner would then get its tenant's later events first. An event nak'ed with a delay
// gets a plain nak on the same delivery: it puts it back now, ahead of its tenant's
// later events. barrier, when not "", is the ack subject of a delivery the worker
// acked: a progress report on it, confirmed after the naks, proves the leader
// processed every ack this connection sent before (it reads them in order), and on a
// delivery no longer pending it changes nothing.
//
// Each event gets two naks (handBackNaks): the server's redelivery queue, where a plain
// nak puts it, is memory only, and its stored state still said "due an ack wait after
// its delivery" (or after a handler's delayed nak), so a server restarted meanwhile sent
// it again only then (the conformance case ARestartRedelivers… did not get it within
// its 5 s once in CI, under the fixture's one-minute ack wait). A nak with a delay of
// 1ns first stores it as due now; the plain nak then queues it at once, in the order
// given.
func (d *dispatcher) handBack(ctx context.Context, held []*entry, barrier string) (int, error) {
	replies := make([]string, len(held))
	for i, e := range held {
		replies[i] = e.m.Reply()
	}
	return d.nakConfirmed(ctx, replies, handBackNaks, barrier)
}

// nakConfirmed sends each of naks, in order, to each of the ack subjects replies, in
// order, then a progress report to barrier unless it is "", and returns once the
// consumer's leader answered every one, or with how many subjects it confirmed when
// ctx ends first.
func (d *dispatcher) nakConfirmed(ctx context.Context, replies []string, naks [][]byte, barrier string) (int, error) {
	if len(replies) == 0 && barrier == "" {
		return 0, nil
	}
	nc := d.core.nc
	inbox := nc.NewInbox() // a private one: the request mux's wildcard would also get the answers
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	for _, reply := range replies {
		for _, nak := range naks {
			if err := nc.PublishRequest(reply, inbox, nak); err != nil {
				return 0, err
			}
		}
	}
	answers := len(naks) * len(replies)
	if barrier != "" {
		if err := nc.PublishRequest(barrier, inbox, []byte("+WPI")); err != nil {
			return 0, err
		}
		answers++
	}
	for n := range answers {
		if _, err := sub.NextMsgWithContext(ctx); err != nil {
			return min(n/len(naks), len(replies)), err
		}
	}
	return len(replies), nil
}

// handBackNaks are the naks that hand an event back (see handBack): stored as due now,
// then queued now.
var handBackNaks = [][]byte{[]byte(`-NAK {"delay":1}`), []byte("-NAK")}

// handBackNow hands e back without waiting for the server's answers.
func (d *dispatcher) handBackNow(e *entry) {
	for _, nak := range handBackNaks {
		_ = d.core.nc.Publish(e.m.Reply(), nak)
	}
}

// takeHeld removes everything the worker holds of partition u, in sequence order. What a handler returned
// without settling stays the host's to settle, until Close (handBackReturned).
func (d *dispatcher) takeHeld(u *unit) []*entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	var held []*entry
	for t, l := range d.lanes {
		if l.part != u.p {
			continue
		}
		held = append(held, l.queue...)
		if l.again != nil {
			held = append(held, l.again)
			l.again = nil
		}
		if l.blocked != nil {
			held = append(held, l.blocked)
		}
		// Emptied either way: a lane dropped while on the ready list must not run what
		// was taken from it when it is popped.
		l.queue, l.blocked = nil, nil
		if l.running == nil {
			delete(d.lanes, t)
		}
	}
	held = append(held, u.late...)
	u.late, u.released, u.waiting = nil, true, 0
	// The latest delivery of an event is the one whose reply the server honours.
	latest := make(map[uint64]*entry, len(held))
	for _, e := range held {
		if o := latest[e.seq]; o == nil || e.attempt >= o.attempt {
			latest[e.seq] = e
		}
	}
	held = held[:0]
	for _, e := range latest {
		held = append(held, e)
		delete(d.tries, eventRef{e.part, e.seq}) // the next worker keeps its own count
	}
	slices.SortFunc(held, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	return held
}

// unpin lets the server pin u's partition to the next worker now rather than after
// the pinned TTL (measured: a second Consume in one process waited the whole 15 s). A
// partition the server pinned to another worker since is left alone: unpinning it
// would let a third take it while that one holds events unsettled. The durable is
// read again: its pin can have changed since the release's first read (see
// pinnedToADrainedPull).
func (d *dispatcher) unpin(ctx context.Context, u *unit, cons jetstream.Consumer) {
	// The stream first: the read of the durable and the unpin follow each other at
	// once, the unpin naming no pin.
	stream, err := d.core.js.Stream(ctx, u.stream)
	if err == nil {
		info, ierr := cons.Info(ctx)
		if ierr != nil {
			info = cons.CachedInfo() // the release's first read
		}
		if !pinnedHere(info, u) && !pinnedToADrainedPull(info, u) {
			return
		}
		err = stream.UnpinConsumer(ctx, d.durable, u.group)
	}
	if err != nil {
		d.core.log.Info("mq: could not hand back a partition of the ingest durable; it waits for its pinned TTL",
			"stream", u.stream, "consumer", d.durable, "pinned_ttl", d.core.topo.PinnedTTL, "error", err)
	}
}
