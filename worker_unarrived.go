package mq

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Deliveries that never arrived. The server can serve a pull the worker drains at a
// release after the worker's last look: it sends events into a subscription that is
// gone and counts them delivered, so without a hand-back they reach the next owner
// only after the ack wait (a minute by default). The conformance case
// TwoConsumesShare… waited so in 11 of 300 runs under load (measured), on one node as
// on a cluster. Their reply subjects never arrived either, so the worker builds them
// (builtAckSubject).

// inFlightWait bounds how long a release waits for the deliveries the server counted
// before it drains the pull (awaitInFlight). They normally follow their count within
// milliseconds.
const inFlightWait = time.Second

// awaitInFlight waits, before partition u's pull cc is drained, until every delivery
// the durable counted since the take reached this worker, or until inFlightWait or
// deadline passes (the durable's read included), or the pull ends by itself. The
// server counts a delivery before its stream's loop routes it: unsubscribed meanwhile,
// the pull loses it. handBackUnarrived puts such losses back only when it knows the pin
// they went under, from an earlier delivery; one lost as the first delivery of a take
// waited for the ack wait (measured: 2 of 200 runs of TestWorker_StopHandsBack… under
// load, a stop right after the server counted the events). Skipped while disconnected
// (nothing arrives, and the read would wait out its timeout) and when the partition is
// pinned elsewhere (pinnedElsewhere). A new pin of this worker's own pull whose first
// delivery is still on its way looks the same as another worker's: that delivery, if
// lost, still waits for the ack wait.
func (d *dispatcher) awaitInFlight(u *unit, cc jetstream.ConsumeContext, deadline time.Time) {
	if u.group == "" || !d.core.nc.IsConnected() {
		return
	}
	until := time.Now().Add(inFlightWait)
	if deadline.Before(until) {
		until = deadline
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	cons, err := d.core.js.Consumer(ctx, u.stream, d.durable)
	if err != nil {
		return
	}
	info := cons.CachedInfo()
	if pinnedElsewhere(info, u) {
		return
	}
	for u.lastDelivery.Load() < info.Delivered.Consumer && time.Now().Before(until) {
		select {
		case <-cc.Closed():
			return // ended by itself: what it had buffered is gone, nothing more comes
		case <-time.After(time.Millisecond):
		}
	}
}

// maxUnarrivedScan bounds the stream sequences a release looks through for events
// that never arrived: above it (a host holding an early event while thousands went
// by), they are left to the ack wait.
const maxUnarrivedScan = 1 << 14

// handBackUnarrived nak's, and waits for the server to confirm, every event partition
// u's durable has pending, as info found it after held was handed back, that this
// worker neither holds nor runs: the server delivered it to this worker's pull, and it
// never arrived. It reports false, leaving such events to the ack wait, when another
// worker may hold one (u.shared, a backlog not ended yet, or the server pins u to
// another), when a call of u still runs (its event must come back before its tenant's
// later ones), when there is nothing of this worker's to put back, or when the events
// cannot be put back. Each gets the hand-back's two naks (see handBack), so a server
// restarted meanwhile still has it due now; one the host nak'ed with a delay after its
// call comes back at once, as a handler's delayed nak does at a hand-back.
func (d *dispatcher) handBackUnarrived(ctx context.Context, u *unit, info *jetstream.ConsumerInfo, held []*entry) bool {
	floor, last := info.AckFloor.Stream, info.Delivered.Stream
	// The pin before shared: arrive marks u shared before it stores a new pin.
	if u.group == "" || !pinnedHere(info, u) || u.shared.Load() || last <= floor || last-floor > maxUnarrivedScan {
		return false
	}
	ours := make(map[uint64]bool, len(held))
	for _, e := range held {
		ours[e.seq] = true
	}
	d.mu.Lock()
	// A backlog still open counts events that may be held elsewhere and not arrived
	// yet: u is not known unshared until it ends.
	if u.running > 0 || u.backlog != nil {
		d.mu.Unlock()
		return false
	}
	for _, gone := range slices.Concat(d.given, []*unit{u}) {
		if gone.p != u.p {
			continue
		}
		for seq := range gone.returned {
			ours[seq] = true // the host's to settle
		}
	}
	var seqs []uint64
	for seq := floor + 1; seq <= last; seq++ {
		// An event acked here is no longer pending (the hand-back's barrier proved the
		// server has the acks), and the server ignores the nak of one not pending.
		if !ours[seq] && !u.acked.has(seq) {
			seqs = append(seqs, seq)
		}
	}
	d.mu.Unlock()
	if len(seqs) == 0 {
		return false // the excess is not this worker's to explain
	}
	subjects := make([]string, len(seqs))
	for i, seq := range seqs {
		subjects[i] = builtAckSubject(u.stream, d.durable, seq, info.Delivered.Consumer)
	}
	n, err := d.nakConfirmed(ctx, subjects, handBackNaks, "")
	if err != nil {
		d.core.log.Info("mq: could not hand back the events of a partition delivered as it was released",
			"stream", u.stream, "consumer", d.durable, "naked", n, "of", len(subjects), "error", err)
		return false
	}
	d.core.log.Debug("mq: handed back the events of a partition delivered as it was released",
		"stream", u.stream, "consumer", d.durable, "ack_pending", info.NumAckPending, "handed_back", len(held),
		"looked_through", len(subjects))
	return true
}

// pinnedElsewhere reports whether info shows partition u pinned to a pull other than
// this worker's: a pin other than the one it last got, or, before it got any, the pin
// some other pull held when it took the partition.
func pinnedElsewhere(info *jetstream.ConsumerInfo, u *unit) bool {
	now := groupPin(info, u.group)
	if now == "" {
		return false
	}
	if pin := u.pin.Load(); pin != nil {
		return now != *pin
	}
	return now == u.pinAtTake
}

// pinnedHere reports whether info shows partition u pinned to this worker's pull.
func pinnedHere(info *jetstream.ConsumerInfo, u *unit) bool {
	pin := u.pin.Load()
	return pin != nil && groupPin(info, u.group) == *pin
}

// pinnedToADrainedPull reports whether info shows partition u pinned to a pull that
// got nothing: a pin new since this worker took u, with nothing delivered since, by
// the durable or to this worker. nats-server (v2.15.3, consumer.nextWaiting) gives a
// pin only to the pull it is about to deliver to, which counts the delivery, except
// when nobody listens to that pull any more: then it drops the pull, delivers
// nothing, and keeps the pin for the whole pinned TTL (upstream_pin_test.go pins it).
// This worker's pull drained before its first event is such a pull when an event
// reaches the server between the release's drain and its read of the durable. The
// pin's holder holds nothing of u, so unpinning it cannot let a tenant's events
// interleave, whoever pulled. Measured in the conformance suite under load (two
// suites at once on 2 cores, race detector): the next owner got nothing of the
// partition within the case's 5 s wait (the pinned TTL is 15 s) in 3 of 34 runs
// before, in none of 40 after.
func pinnedToADrainedPull(info *jetstream.ConsumerInfo, u *unit) bool {
	pin := groupPin(info, u.group)
	return pin != "" && pin != u.pinAtTake && u.pin.Load() == nil && info.Delivered.Consumer == u.lastDelivery.Load()
}

// groupPin is the pin info shows for priority group, "" for none.
func groupPin(info *jetstream.ConsumerInfo, group string) string {
	for _, g := range info.PriorityGroups {
		if g.Group == group {
			return g.PinnedClientID
		}
	}
	return ""
}
