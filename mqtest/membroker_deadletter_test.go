package mqtest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wavehouse/mq"
)

// Parking, its counts, and the purge of what the ingest durable acknowledged.

func (b *memBroker) DeadLetter(ctx context.Context, msg *mq.Message, opts ...mq.PublishOpt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if msg == nil {
		return errors.New("mem: dead letter: nil message")
	}
	tp, err := mq.ParseTopicKey(msg.TopicKey())
	if err != nil {
		return fmt.Errorf("mem: dead letter: %w", err)
	}
	ev, err := newMemEvent(ctx, tp, msg.Data, msg.Headers, opts)
	if err != nil {
		return fmt.Errorf("mem: dead letter: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("dead letter")
	}
	if ev.id != "" {
		// Scoped to the tenant, as on Publish.
		k := string(tp.Tenant) + "\x00" + ev.id
		if b.parkKeys[k] {
			return nil
		}
		b.parkKeys[k] = true
	}
	ev.stored = time.Now()
	b.parked = append(b.parked, ev)
	return nil
}

func (b *memBroker) DeadLetterCounts(ctx context.Context, tenant mq.TenantID, table string) (mq.DeadLetterCounts, error) {
	if err := tenant.Validate(); err != nil {
		return mq.DeadLetterCounts{}, fmt.Errorf("mem: dead-letter counts: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return mq.DeadLetterCounts{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return mq.DeadLetterCounts{}, errClosed("dead-letter counts")
	}
	counts := mq.DeadLetterCounts{Tables: map[string]uint64{}}
	for _, ev := range b.parked {
		if ev.topic.Tenant != tenant {
			continue
		}
		counts.Total++
		if table == "" || ev.topic.Table == table {
			counts.Tables[ev.topic.Table]++
		}
	}
	return counts, nil
}

// parkedOf is tenant's parked events, in the order they were parked.
func (b *memBroker) parkedOf(tenant mq.TenantID) []*mq.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*mq.Message
	for _, ev := range b.parked {
		if ev.topic.Tenant == tenant {
			out = append(out, ev.message(context.Background(), 1))
		}
	}
	return out
}

// PurgeAcked removes from the history what consumer acknowledged, stored before its
// tenant's cutoff (a tenant absent from the map: whatever it acknowledged).
func (b *memBroker) PurgeAcked(ctx context.Context, consumer string, olderThan map[mq.TenantID]time.Time) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if consumer == "" {
		consumer = mq.WorkerDurable
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, errClosed("purge acked")
	}
	g := b.groups[consumer]
	if g == nil {
		if consumer != mq.WorkerDurable {
			return false, fmt.Errorf("mem: purge acked: durable %q was never created: %w", consumer, mq.ErrConsumerNotFound)
		}
		return false, nil
	}
	kept := b.log[:0]
	purged := false
	for _, ev := range b.log {
		cutoff, limited := olderThan[ev.topic.Tenant]
		if st := g.state[ev.seq]; st != nil && st.acked && (!limited || ev.stored.Before(cutoff)) {
			b.releaseLocked(ev.seq)
			purged = true
			continue
		}
		kept = append(kept, ev)
	}
	clear(b.log[len(kept):])
	b.log = kept
	return purged, nil
}
