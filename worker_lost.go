package mq

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"
)

// Deliveries lost in transit. When the server a worker's connection runs through
// stops (a rolling restart, a crash) or a partition's leader moves, the last
// deliveries sent to the worker can be lost on the way while the durable counts them
// delivered: they came back only at their ack wait (a minute by default), after their
// tenants' later events had run. Measured: a rolling restart of a three-node cluster
// under live traffic lost a few deliveries in most runs, and each broke its tenant's
// order. A durable delivers each event for the first time in sequence order, and only
// to the pull it pinned the partition to: a first delivery that skips sequences after
// an earlier one to this worker means the skipped events were sent to this worker (a
// new pin after a leader change included), and those that did not come back since
// (as redeliveries, held or acked here) were lost. Their tenants' lanes wait for
// them, and a hand-back brings them back now (their attempt counts toward
// MaxDeliveries, as a hand-back's does). Another worker can have had them only if it
// pulled the partition while this one still held it (two views of the group): then
// those it acknowledged are gone from the partition once the history copied them,
// and are not waited for.

// maxLostInTransit bounds the events a skip recovers: each is read to learn its
// tenant. A larger skip is left to the ack wait.
const maxLostInTransit = 1024

// lostWait is the events of a partition that were lost in transit and not back yet,
// each tenant's in sequence order, and when to stop waiting for them.
type lostWait struct {
	tenants map[TenantID][]uint64
	until   time.Time
}

// recoverLost recovers the events partition u's durable delivered for the first time
// before at, a first delivery, that did not reach this worker. at is not filed yet, so
// its tenant's lane waits too. Runs on u's delivery goroutine, which it holds while it
// reads the events and hands them back.
func (d *dispatcher) recoverLost(u *unit, at delivery) {
	c := d.core
	first := u.lastFirst + 1
	if at.streamSeq-first > maxLostInTransit {
		c.log.Info("mq: events of a partition did not reach this worker; they come back after their ack wait, possibly after later events of their tenants",
			"stream", u.stream, "consumer", d.durable, "skipped", at.streamSeq-first)
		return
	}
	here := d.heldOrAcked(u, first, at.streamSeq)
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	tenants := map[TenantID][]uint64{}
	var replies []string
	for seq := first; seq < at.streamSeq; seq++ {
		if here[seq] {
			continue
		}
		m, err := c.storedMsg(ctx, u.stream, struct {
			Seq uint64 `json:"seq"`
		}{seq})
		if err != nil {
			c.log.Info("mq: events of a partition did not reach this worker and cannot be read; they come back after their ack wait, possibly after later events of their tenants",
				"stream", u.stream, "consumer", d.durable, "first", first, "last", at.streamSeq-1, "error", err)
			return
		}
		if m == nil {
			continue // acknowledged elsewhere, or removed by an operator: nothing comes back
		}
		tenant, _, _ := strings.Cut(c.subs.keyOrSubject(m.Subject), ".") // a key's first token is its tenant
		tenants[TenantID(tenant)] = append(tenants[TenantID(tenant)], seq)
		replies = append(replies, builtAckSubject(u.stream, d.durable, seq, at.consumerSeq))
	}
	if len(replies) == 0 {
		return
	}
	d.mu.Lock()
	d.awaitLost(u, tenants)
	d.mu.Unlock()
	if n, err := d.nakConfirmed(ctx, replies, handBackNaks, ""); err != nil {
		c.log.Info("mq: events of a partition did not reach this worker and could not all be handed back; their tenants wait for their ack wait",
			"stream", u.stream, "consumer", d.durable, "lost", len(replies), "handed_back", n, "error", err)
		return
	}
	c.log.Info("mq: events of a partition did not reach this worker; handed back, their tenants wait for them",
		"stream", u.stream, "consumer", d.durable, "lost", len(replies), "first", first, "last", at.streamSeq-1)
}

// heldOrAcked is the events of partition u from first up to before end that this
// worker holds (in a lane, with the host, or late) or acknowledged.
func (d *dispatcher) heldOrAcked(u *unit, first, end uint64) map[uint64]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	here := map[uint64]bool{}
	note := func(e *entry) {
		if e != nil && e.seq >= first && e.seq < end {
			here[e.seq] = true
		}
	}
	for _, l := range d.lanes {
		if l.part != u.p {
			continue
		}
		for _, e := range l.queue {
			note(e)
		}
		note(l.running)
		note(l.again)
		note(l.blocked)
	}
	for _, e := range u.returned {
		note(e)
	}
	for _, e := range u.late {
		note(e)
	}
	for seq := first; seq < end; seq++ {
		if u.acked.has(seq) {
			here[seq] = true
		}
	}
	return here
}

// awaitLost makes the lanes of tenants on partition u wait for their lost events, for
// two ack waits at most: a hand-back brings them back at once, but one that did not
// reach the server leaves them to the ack wait, which a new leader can overrun
// (measured: one came 6 s after its 5 s ack wait, after a leader change). Called
// with d.mu held.
func (d *dispatcher) awaitLost(u *unit, tenants map[TenantID][]uint64) {
	if u.lost == nil {
		u.lost = &lostWait{tenants: map[TenantID][]uint64{}}
	}
	for tenant, seqs := range tenants {
		u.lost.tenants[tenant] = slices.Sorted(slices.Values(append(u.lost.tenants[tenant], seqs...)))
	}
	u.lost.until = time.Now().Add(2*cmp.Or(u.ackWait, d.core.topo.AckWait) + redeliverySlack)
}

// lostArrived notes the arrival of tenant's event seq on partition u, which may be
// one it waits for. Called with d.mu held.
func (d *dispatcher) lostArrived(u *unit, tenant TenantID, seq uint64) {
	if _, cleared := takeDue(u.lost.tenants, tenant, seq); !cleared {
		return
	}
	if len(u.lost.tenants) == 0 {
		u.lost = nil
	}
	if l := d.lanes[tenant]; l != nil {
		d.schedule(l)
	}
}

// endLostWait stops partition u's wait for lost events once it ran out at now.
// Called with d.mu held.
func (d *dispatcher) endLostWait(u *unit, now time.Time) {
	w := u.lost
	if w == nil || !now.After(w.until) {
		return
	}
	d.core.log.Warn("mq: events lost in transit did not come back within an ack wait; their tenants go on",
		"stream", u.stream, "consumer", d.durable, "tenants", len(w.tenants))
	u.lost = nil
	for tenant := range w.tenants {
		if l := d.lanes[tenant]; l != nil {
			d.schedule(l)
		}
	}
}
