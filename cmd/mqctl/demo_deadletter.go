package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/wavehouse/mq"
)

// The dead letters: the broker's counts per tenant and table, and the parked events
// themselves, read back with the broker's DeadLetters to show why the policy parked
// the poison event.

// demoDeadLetters is what the dead-letter step read.
type demoDeadLetters struct {
	counts map[mq.TenantID]mq.DeadLetterCounts
	stream string // the dead-letter stream's name
	parked []parkedEvent
}

// parkedEvent is one parked event, with the headers the poison policy adds
// (mq.HeaderDead*).
type parkedEvent struct {
	key      string // its topic key
	topic    mq.Topic
	stored   time.Time
	demoID   string // X-Demo-Id, as published
	reason   string
	lastErr  string
	attempts string
	part     string
	sequence string
	first    string
	last     string
}

// deadLetters counts every tenant's parked events and reads the parked events back.
func (d *demoRun) deadLetters(ctx context.Context) (demoDeadLetters, error) {
	dl := demoDeadLetters{counts: map[mq.TenantID]mq.DeadLetterCounts{}, stream: d.topo.DeadLetterStream()}
	for _, t := range demoTenants {
		c, err := d.broker.DeadLetterCounts(ctx, t, "")
		if err != nil {
			return dl, fmt.Errorf("dead-letter counts %s: %w", t, err)
		}
		dl.counts[t] = c
	}
	poison := d.plan.poison
	narrowed, err := d.broker.DeadLetterCounts(ctx, poison.Tenant, poison.Table)
	if err != nil {
		return dl, fmt.Errorf("dead-letter counts %s %s: %w", poison.Tenant, poison.Table, err)
	}
	d.check(fmt.Sprintf("dead-lettered %s/%s (table filter)", poison.Tenant, poison.Table), narrowed.Tables[poison.Table], 1)
	for _, t := range demoTenants {
		want := map[string]uint64{}
		if t == poison.Tenant {
			want[poison.Table] = 1
		}
		d.check("dead-lettered "+string(t)+" per table", formatCounts(dl.counts[t].Tables), formatCounts(want))
		d.check("dead-lettered "+string(t)+" total", dl.counts[t].Total, uint64(len(want)))
	}
	d.printf("parked: %s", formatTotals(dl.counts))

	dl.parked, err = readParked(ctx, d.broker, demoTenants)
	if err != nil {
		return dl, fmt.Errorf("read the parked events back: %w", err)
	}
	for _, p := range dl.parked {
		d.printf("read back from %s: %s (%s), reason %s after %s attempts: %s",
			dl.stream, p.demoID, p.key, p.reason, p.attempts, p.lastErr)
	}
	return dl, nil
}

// readParked reads tenants' parked events back through the broker's own reader,
// tenant by tenant, oldest first, a page at a time, as an operator's tool would.
func readParked(ctx context.Context, b mq.DeadLetterManager, tenants []mq.TenantID) ([]parkedEvent, error) {
	var parked []parkedEvent
	for _, t := range tenants {
		q := mq.DeadLetterQuery{Limit: 10}
		for {
			page, next, err := b.DeadLetters(ctx, t, q)
			if err != nil {
				return parked, fmt.Errorf("tenant %s: %w", t, err)
			}
			for _, m := range page {
				h := m.Headers
				parked = append(parked, parkedEvent{
					key: m.TopicKey(), topic: m.Topic(), stored: m.Timestamp, demoID: h.Get("X-Demo-Id"),
					reason: h.Get(mq.HeaderDeadReason), lastErr: h.Get(mq.HeaderDeadError),
					attempts: h.Get(mq.HeaderDeadAttempts), part: h.Get(mq.HeaderDeadPartition),
					sequence: h.Get(mq.HeaderDeadSequence),
					first:    h.Get(mq.HeaderDeadFirstAttempt), last: h.Get(mq.HeaderDeadLastAttempt),
				})
			}
			if next == "" {
				break
			}
			q.Cursor = next
		}
	}
	return parked, nil
}

// checkParked adds the checks of what the dead-letter stream holds, under d.mu: the
// poison event alone, parked by the policy with why, and its tenant's later events
// written only after the park.
func (d *demoRun) checkParked(parked []parkedEvent) {
	poison := d.plan.poison
	d.check("parked events read back", len(parked), 1)
	if len(parked) == 0 {
		return
	}
	p := parked[0]
	last := d.fleet.lastPoison()
	d.check("parked event (X-Demo-Id)", p.demoID, poison.id())
	d.check("parked topic", p.topic, poison.topic())
	d.check("parked reason ("+mq.HeaderDeadReason+")", p.reason, mq.DeadReasonHandlerFailed)
	d.check("parked last error ("+mq.HeaderDeadError+") is the last attempt's", p.lastErr == last.err && last.err != "", true)
	d.check("parked attempts ("+mq.HeaderDeadAttempts+")", p.attempts, demoPolicy.MaxDeliveries)
	d.check("parked partition ("+mq.HeaderDeadPartition+")", p.part, mq.Partition(poison.Tenant, d.topo.Partitions))
	d.check("parked sequence ("+mq.HeaderDeadSequence+")", p.sequence, strconv.FormatUint(last.sequence, 10))

	later, after := 0, 0
	for _, ev := range d.plan.events[poison.Tenant][poison.Seq:] {
		later++
		if at, ok := d.fleet.firstWrite[ev.id()]; ok && at.After(p.stored) {
			after++
		}
	}
	d.check(fmt.Sprintf("%s events after the poison, first written after its park", poison.Tenant), after, later)
}
