package mq

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The backlog of a partition the worker takes: events the durable had delivered and
// not seen acknowledged, which come back out of sequence order. A tenant's lane must
// not run past one of its events still to come back. It is counted at the take and
// again at the first delivery after it, and under a new pin (served).

// backlog is what a partition had pending when this worker took it: the events its
// previous owner handed back or left to the ack wait. The server redelivers them from
// a queue that is not in sequence order: it puts an event it could not deliver (no
// pull waiting, or one nobody listens to any more) back at the end, and queues
// expired events behind those already waiting (nats-server v2.15.2,
// consumer.loopAndGatherMsgs and checkPending; measured: a tenant's event 0 came
// after its 1 and 2, in another pull). The lanes only order what they hold, so the
// partition's lanes wait until the queue is drained: every pending event arrived, or
// a new one did (the server serves its redelivery queue first), or none arrived for
// backlogQuiet (the rest is held elsewhere, by a host or in flight, and comes by the
// ack wait), or an ack wait passed.
//
// After a restart the broker knows more (see returning): which events are pending and
// whose, and that no host holds any of them, since Close handed back what hosts held.
// The boot puts them back (embedded_inflight.go), but with a listener, or when a nak
// was lost, they come back only as their ack waits (or nak delays) run out, in that
// order, not in sequence order; so their tenants' lanes wait for those events, however
// quiet the pull or new the events it brings, and every other tenant goes on. The
// noted events may include some acknowledged out of order before a crash, which never
// come back: once as many noted events arrived as the durable had pending, none is
// still due.
type backlog struct {
	last   uint64              // the stream sequence last delivered at the take
	want   int                 // events pending at the take
	seen   map[uint64]struct{} // those of them arrived
	lastAt time.Time           // the take, or the latest arrival since
	until  time.Time
	// tenants, when known, are the pending events still to arrive, in sequence
	// order by tenant: only these tenants' lanes wait, until want of them arrived.
	tenants map[TenantID][]uint64
	arrived int
}

// newBacklog is what a partition the durable's info shows holds back, or nil when
// nothing is pending; tenants are the events noted pending at open, if any.
func (d *dispatcher) newBacklog(info *jetstream.ConsumerInfo, tenants map[TenantID][]uint64) *backlog {
	if info.NumAckPending == 0 {
		return nil
	}
	now := time.Now()
	return &backlog{last: info.Delivered.Stream, want: info.NumAckPending, seen: map[uint64]struct{}{},
		lastAt: now, until: now.Add(cmp.Or(info.Config.AckWait, d.core.topo.AckWait) + redeliverySlack), tenants: tenants}
}

// served counts again what partition u has pending when the server first delivers to
// this worker after its take (first), or under a new pin, before that delivery is
// filed. The take's count is stale when another worker held the partition meanwhile:
// two workers that both took it (each saw it free) pull it, the server serves the one
// it pinned, and the other gets nothing until that one hands it over; by then its
// backlog had ended for want of arrivals, and the events handed over, some put back
// behind later ones by the server, ran in the order they came (the chaos probe: a
// tenant's event 209 before 207 and 208, 1 run in about 12). A new pin after a gap in
// the durable's delivery sequence means the same: the server served another puller
// meanwhile. A backlog noted at open is exact and kept at the first delivery, less what
// was settled since (dropSettled); when the server cannot be asked, the take's stands.
func (d *dispatcher) served(u *unit, first bool) {
	c := d.core
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(ctx, u.stream, d.durable)
	if err != nil {
		if !first {
			c.log.Info("mq: cannot count a partition pinned to this worker again; its tenants do not wait for what another worker handed back",
				"stream", u.stream, "consumer", d.durable, "error", err)
		}
		return
	}
	info := cons.CachedInfo()
	d.mu.Lock()
	defer d.mu.Unlock()
	if first {
		// Counted: what the server delivers from now on, and what the backlog
		// awaits, decide whether another worker may hold events of u.
		u.shared.Store(false)
	}
	if b := u.backlog; first && b != nil && b.tenants != nil {
		d.dropSettled(u, b, info.AckFloor.Stream)
		return
	}
	// Under a new pin the count includes what this worker still holds, which does
	// not come again: the backlog then ends by the quiet rule or a new event.
	u.backlog = d.newBacklog(info, nil)
	msg := "mq: first delivery of a taken partition"
	if !first {
		msg = "mq: a partition was pinned to this worker again"
	}
	c.log.Debug(msg, "stream", u.stream, "consumer", d.durable,
		"ack_pending", info.NumAckPending, "last_delivered", info.Delivered.Stream)
}

// dropSettled forgets the events noted pending at open that were acknowledged since:
// those at or below the ack floor, and those acked in this process. Another worker
// that took the partition too (two claims right after a restart, or two views of the
// group) may have run them before the server first served this one, and they never
// come: their tenants would wait an ack wait. Called with d.mu held.
func (d *dispatcher) dropSettled(u *unit, b *backlog, floor uint64) {
	acked := func(seq uint64) bool {
		return seq <= floor || (d.core.ackedHere != nil && d.core.ackedHere(eventRef{u.p, seq}))
	}
	left := 0
	for tenant, due := range b.tenants {
		due = slices.DeleteFunc(due, acked)
		if len(due) == 0 {
			delete(b.tenants, tenant)
		} else {
			b.tenants[tenant] = due
		}
		left += len(due)
	}
	if left == 0 {
		d.endBacklog(u, "its pending events were settled elsewhere", 0)
		return
	}
	// What is left may all be due: none of it is waited for beyond it.
	b.want = min(b.want, b.arrived+left)
}

// backlogQuiet is how long a taken partition's pull may bring nothing before its
// redelivery queue counts as drained: a pull's next batch follows within a round trip.
const backlogQuiet = 250 * time.Millisecond

// over reports whether b stops holding lanes at now, whatever has not arrived.
func (b *backlog) over(now time.Time) bool {
	return now.After(b.until) || (b.tenants == nil && now.Sub(b.lastAt) > backlogQuiet)
}

// holds reports whether partition u holds lane l: for its backlog, or for an event of
// its tenant lost in transit. Called with dispatcher.mu held.
func (u *unit) holds(l *lane) bool {
	if u.lost != nil && len(u.lost.tenants[l.tenant]) > 0 {
		return true
	}
	b := u.backlog
	if b == nil {
		return false
	}
	if b.tenants == nil {
		return true
	}
	return len(b.tenants[l.tenant]) > 0
}

// backlogArrived notes the arrival of tenant's event seq on partition u, whose
// backlog it may end. Called with d.mu held.
func (d *dispatcher) backlogArrived(u *unit, tenant TenantID, seq uint64) {
	b := u.backlog
	b.lastAt = time.Now()
	if b.tenants == nil {
		if seq <= b.last {
			b.seen[seq] = struct{}{}
		}
		switch {
		case seq > b.last:
			d.endBacklog(u, "an event delivered for the first time arrived", seq)
		case len(b.seen) >= b.want:
			d.endBacklog(u, allPendingArrived, seq)
		}
		return
	}
	found, cleared := takeDue(b.tenants, tenant, seq)
	if !found {
		return
	}
	b.arrived++
	if b.arrived >= b.want {
		d.endBacklog(u, allPendingArrived, seq)
		return
	}
	if l := d.lanes[tenant]; cleared && l != nil {
		d.schedule(l)
	}
}

// takeDue removes tenant's event seq from due, each tenant's events in sequence
// order, and reports whether it was there and whether the tenant has none left.
func takeDue(due map[TenantID][]uint64, tenant TenantID, seq uint64) (found, cleared bool) {
	seqs := due[tenant]
	i, found := slices.BinarySearch(seqs, seq)
	if !found {
		return false, false
	}
	if seqs = slices.Delete(seqs, i, i+1); len(seqs) > 0 {
		due[tenant] = seqs
		return true, false
	}
	delete(due, tenant)
	return true, true
}

// allPendingArrived is the reason a backlog ends when nothing of it is held elsewhere.
const allPendingArrived = "every pending event arrived"

// endBacklog lets partition u's lanes run, for the reason why, on the arrival of seq
// (0 for none). Called with d.mu held.
func (d *dispatcher) endBacklog(u *unit, why string, seq uint64) {
	if why != allPendingArrived {
		u.shared.Store(true)
	}
	if b := u.backlog; b != nil {
		d.core.log.Debug("mq: a taken partition's pending events stop holding its tenants", "stream", u.stream,
			"reason", why, "seq", seq, "pending_at_take", b.want, "arrived", max(len(b.seen), b.arrived), "last_delivered_at_take", b.last)
	}
	u.backlog = nil
	for _, l := range d.lanes {
		if l.part == u.p {
			d.schedule(l)
		}
	}
}

// returning is what EmbeddedNATS found pending on the ingest durable when it opened:
// by partition, each tenant's events in sequence order, and the stream sequence the
// durable had delivered last. A worker taking a partition (see backlog) gets the
// events while the durable has delivered nothing since: then what it has pending is
// among them, whether this is the first take or the partition changed hands (a worker
// elsewhere, through ListenAddr, delivers too).
type returning struct {
	mu sync.Mutex
	m  map[int]*pendingAtOpen
}

type pendingAtOpen struct {
	delivered uint64
	tenants   map[TenantID][]uint64
}

// note records tenant's event seq on partition p, whose durable had delivered through
// delivered, as pending; seqs come in order.
func (r *returning) note(p int, delivered uint64, tenant TenantID, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[int]*pendingAtOpen{}
	}
	if r.m[p] == nil {
		r.m[p] = &pendingAtOpen{delivered: delivered, tenants: map[TenantID][]uint64{}}
	}
	r.m[p].tenants[tenant] = append(r.m[p].tenants[tenant], seq)
}

// since returns a copy of partition p's pending events, or nil when none were noted
// or the durable has delivered beyond them (delivered is its last delivered now).
func (r *returning) since(p int, delivered uint64) map[TenantID][]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ret := r.m[p]
	if ret == nil {
		return nil
	}
	if ret.delivered != delivered {
		delete(r.m, p)
		return nil
	}
	out := make(map[TenantID][]uint64, len(ret.tenants))
	for t, seqs := range ret.tenants {
		out[t] = slices.Clone(seqs)
	}
	return out
}
