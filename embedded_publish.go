package mq

import (
	"context"
	"fmt"
	"time"
)

// EmbeddedNATS's publishing, single and in batches, with the budget reserved for it.

// Publish stores data on the tenant's partition once it fits the tenant's budget. The
// bytes it reserves are given back on every way out that stored nothing, a panic
// included.
func (e *EmbeddedNATS) Publish(ctx context.Context, topic Topic, data []byte, opts ...PublishOpt) (err error) {
	if err = e.opened(); err != nil {
		return err
	}
	ev, err := e.core.ingestEvent(ctx, topic, data, opts)
	if err != nil {
		return err
	}
	defer func() { ev.span.end(err) }()
	p := e.partitionOf[ev.stream]
	keyedID := ""
	if id := ev.header.Get(HeaderIdempotencyKey); callerKeyed(id) {
		keyedID = id
	}
	size := eventSize(ev.subject, ev.header, len(data))
	r, err := e.budgets.reserve(topic.Tenant, p, keyedID, size, time.Now())
	if err != nil {
		return fmt.Errorf("publish %s: %w", ev.subject, err)
	}
	if e.commits != nil {
		return e.commits.publish(ctx, p, ev, r)
	}
	defer e.budgets.cancel(r) // a panic in the send gives r back
	ack, err := e.core.send(ctx, ev)
	s := stored{err: err}
	if err == nil {
		s.seq, s.dup = ack.Sequence, ack.Duplicate
	}
	e.settleReserved(p, r, s)
	return err
}

// settleReserved ends reservation r with the outcome s of its event on partition p:
// a stored event holds it, a duplicate gives it back and counts the event it repeats
// if nothing counts it yet. An error leaves the outcome unknown: the reservation is
// given back, and a reopen counts what was stored.
func (e *EmbeddedNATS) settleReserved(p int, r *reservation, s stored) {
	switch {
	case s.err != nil:
		e.budgets.cancel(r)
	case s.dup:
		e.budgets.cancel(r)
		ctx, cancel := context.WithTimeout(context.Background(), e.topo.PublishTimeout)
		defer cancel()
		e.adoptUncounted(ctx, eventRef{p, s.seq})
	default:
		e.budgets.commit(r, s.seq)
	}
}

// PublishBatch stores b's events on the tenant's partition (see [BatchPublisher]),
// the tenant's budget reserved for the whole batch before anything is sent. As in
// Publish, what a panic leaves unsettled is given back.
func (e *EmbeddedNATS) PublishBatch(ctx context.Context, b Batch) (err error) {
	if err = e.opened(); err != nil {
		return err
	}
	out, err := e.core.prepareBatch(ctx, b)
	if err != nil || len(out.events) == 0 {
		return err
	}
	defer func() { out.span.end(err) }()
	keyedIDs := make([]string, len(out.events))
	sizes := make([]int64, len(out.events))
	for i, ev := range out.events {
		if id := ev.header.Get(HeaderIdempotencyKey); callerKeyed(id) {
			keyedIDs[i] = id
		}
		sizes[i] = eventSize(ev.subject, ev.header, len(ev.data))
	}
	rs, err := e.budgets.reserveBatch(b.Tenant, out.part, keyedIDs, sizes, time.Now())
	if err != nil {
		return fmt.Errorf("publish batch: %w", err)
	}
	// A panic in the send (a caller's ctx may do anything) gives back what was not
	// settled yet; on the way out without a panic every reservation is settled.
	settled := 0
	defer func() {
		for _, r := range rs[settled:] {
			e.budgets.cancel(r)
		}
	}()
	results := e.core.sendBatch(ctx, out)
	for i, r := range results {
		e.settleReserved(out.part, rs[i], r)
		settled = i + 1
	}
	return batchError(results)
}
