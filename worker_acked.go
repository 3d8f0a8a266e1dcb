package mq

import "slices"

// A worker stopped for longer than the ack wait (a paused VM or container, a SIGSTOP,
// a starved machine) has its deliveries redelivered meanwhile: once it runs again, it
// handles and acks the events it held, and the server's copies of them arrive after.
// Handled, each copy would reach the handler again after its tenant's later events (a
// probe saw 37 of 200 events so, in order). The dispatcher remembers what it acked on
// each partition and drops such a copy with a second ack instead. What it remembers
// outlives its hold on the partition: a group that lost sight of every member during
// the stall gives the partitions out again, often to the same worker (the probe saw
// that too). A copy that reaches another worker is handled there.

// maxAckedRemembered bounds what a partition remembers when its durable sets no
// MaxAckPending (8 bytes each).
const maxAckedRemembered = 1 << 16

// acked is the sequences a worker acknowledged last on one partition, oldest
// overwritten first. Remembering the durable's MaxAckPending of them is enough: a copy
// is sent before the server got the ack of its event, and the acks of this partition
// go out on one connection in order, so every event acked between that ack and the
// copy's arrival was still pending at the server when it sent the copy.
type acked struct {
	seqs  []uint64
	next  int // where the next sequence goes once seqs is full
	limit int
}

func newAcked(maxAckPending int) *acked {
	if maxAckPending <= 0 || maxAckPending > maxAckedRemembered {
		maxAckPending = maxAckedRemembered
	}
	return &acked{limit: maxAckPending}
}

// ackedOn is what this worker remembers of its acks on partition p, under a durable
// whose MaxAckPending is maxAckPending. Called with d.mu held.
func (d *dispatcher) ackedOn(p, maxAckPending int) *acked {
	a := d.acked[p]
	if a == nil {
		a = newAcked(maxAckPending)
		d.acked[p] = a
	}
	return a
}

// add remembers seq as acknowledged.
func (a *acked) add(seq uint64) {
	if a == nil {
		return // a unit whose pull never started
	}
	if len(a.seqs) < a.limit {
		a.seqs = append(a.seqs, seq)
		return
	}
	a.seqs[a.next] = seq
	a.next = (a.next + 1) % len(a.seqs)
}

// has reports whether seq is among those remembered. A linear scan, as it is asked
// only of redeliveries.
func (a *acked) has(seq uint64) bool { return a != nil && slices.Contains(a.seqs, seq) }

// dropAcked settles e, a copy of an event this worker acknowledged already, without
// a handler call: its ack may not have reached the server yet, so it is acked again.
func (d *dispatcher) dropAcked(u *unit, e *entry) {
	d.core.log.Debug("mq: dropped a redelivered copy of an event already acknowledged",
		"stream", u.stream, "seq", e.seq, "attempt", e.attempt)
	if err := e.settler.Ack(); err != nil {
		d.core.log.Debug("mq: cannot acknowledge a copy of an acknowledged event; the server redelivers it",
			"stream", u.stream, "seq", e.seq, "error", err)
	}
}
