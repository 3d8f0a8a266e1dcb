package mq

import (
	"context"
	"fmt"
	"time"
)

// Retried events that vanished. A failed event is nak'ed and its tenant waits for it to
// come back; when it does not within that wait (keepAlive), it usually came back at
// another worker. But a partition can also lose it: nats-server's leader-change race on
// a cluster (README, "A nats-server race on a cluster"), or an operator's delete or
// purge. Its retries would then end in nothing, never on the dead-letter queue. So when
// the wait runs out while the partition is still pinned to this worker as it was (no
// other worker can have had the event), the worker asks the partition for it, and parks
// the copy it kept when the partition no longer holds it.

// vanishedCheck is one failed event whose wait ran out, and its record of attempts as
// the wait ran out (tries, the record itself, never nil; last, its last attempt).
type vanishedCheck struct {
	e     *entry
	tries *tries
	last  time.Time
}

// checkVanished parks each of checks whose event partition no longer holds. It runs
// on a goroutine of its own, outside d.mu; stop waits for it, so it gives up once the
// delivery is over.
func (d *dispatcher) checkVanished(checks []vanishedCheck) {
	defer d.checks.Done()
	for _, v := range checks {
		if d.isOver() {
			return
		}
		d.parkIfVanished(v)
	}
}

func (d *dispatcher) parkIfVanished(v vanishedCheck) {
	c, e := d.core, v.e
	u := e.u
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.topo.PublishTimeout)
	defer cancel()
	held, err := c.partitionHolds(ctx, u.stream, e.seq)
	if err != nil {
		c.log.Info("mq: cannot tell whether a retried event that did not come back is still stored",
			"stream", u.stream, "seq", e.seq, "error", err)
		return
	}
	if held {
		return
	}
	// Gone. The pin read after that read: a pin never comes back once moved, so the
	// same pin now means no other worker was served meanwhile, and had the event.
	if u.group != "" {
		cons, err := c.js.Consumer(ctx, u.stream, d.durable)
		if err != nil || !pinnedHere(cons.CachedInfo(), u) {
			return
		}
	}
	d.mu.Lock()
	// The pin before shared: arrive marks u shared before it stores a new pin. A
	// redelivery that came after the wait ran out, and was run (its record moved on)
	// or acked (its record dropped), is not lost either.
	lost := !d.over() && d.units[u.p] == u && !u.isReleasing() && !u.shared.Load() &&
		!u.acked.has(e.seq) && d.tries[eventRef{e.part, e.seq}] == v.tries && v.tries.last.Equal(v.last)
	t := tries{}
	if lost {
		t = *v.tries
	}
	d.mu.Unlock()
	if !lost {
		return
	}
	if err := c.deadLetter(ctx, e.msg, d.parkHeaders(e, &t, DeadReasonVanished), t.lastErr); err != nil {
		c.log.Error("mq: a retried event vanished from its partition and cannot be parked",
			"stream", u.stream, "seq", e.seq, "topic", e.msg.key, "error", err)
		return
	}
	c.log.Warn("mq: a retried event vanished from its partition before its retry; parked it on the dead-letter queue",
		"stream", u.stream, "seq", e.seq, "attempt", e.attempt, "topic", e.msg.key)
}

// partitionHolds reports whether stream still stores seq.
func (c *natsCore) partitionHolds(ctx context.Context, stream string, seq uint64) (bool, error) {
	m, err := c.storedMsg(ctx, stream, struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return false, fmt.Errorf("event %d: %w", seq, err)
	}
	return m != nil, nil
}
