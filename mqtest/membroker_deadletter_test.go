package mqtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wavehouse/mq"
)

// Parking, its counts, the parks' reading, redrive and removal (mq.DeadLetterManager),
// and the purge of what the ingest durable acknowledged.

var _ mq.DeadLetterManager = (*memBroker)(nil)

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
	b.parkSeq++
	ev.seq, ev.id, ev.stored = b.parkSeq, "park-"+strconv.FormatUint(b.parkSeq, 10), time.Now()
	ev.parkedID = msg.ID // for a redrive to keep
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
	for t := range olderThan {
		if err := t.Validate(); err != nil {
			return false, fmt.Errorf("mem: purge acked: %w", err)
		}
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

// DeadLetters pages tenant's parks, oldest first; a cursor is the last park's number.
func (b *memBroker) DeadLetters(ctx context.Context, tenant mq.TenantID, q mq.DeadLetterQuery) ([]*mq.Message, string, error) {
	if err := tenant.Validate(); err != nil {
		return nil, "", fmt.Errorf("mem: dead letters: %w", err)
	}
	limit := q.Limit
	if limit == 0 {
		limit = 100
	}
	from, err := strconv.ParseUint(q.Cursor, 10, 64)
	if q.Cursor == "" {
		from, err = 0, nil
	}
	if err != nil || limit < 0 {
		return nil, "", fmt.Errorf("mem: dead letters of %s: cursor %q, limit %d: %w", tenant, q.Cursor, q.Limit, mq.ErrInvalidConfig)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, "", errClosed("dead letters")
	}
	var page []*mq.Message
	for _, ev := range b.parked {
		if ev.topic.Tenant != tenant || ev.seq < from || q.Table != "" && ev.topic.Table != q.Table {
			continue
		}
		if len(page) == limit {
			return page, strconv.FormatUint(ev.seq, 10), nil // the next page's first
		}
		page = append(page, ev.message(ctx, 1))
	}
	return page, "", nil
}

// Redrive publishes the selected parks again, oldest first, without their Mq-Dead-*
// headers and under an idempotency key made from the park, removing each once stored.
func (b *memBroker) Redrive(ctx context.Context, tenant mq.TenantID, sel mq.DeadLetterSelector) (int, error) {
	return b.takeParked(ctx, tenant, sel, true)
}

func (b *memBroker) DeleteDeadLetters(ctx context.Context, tenant mq.TenantID, sel mq.DeadLetterSelector) (int, error) {
	return b.takeParked(ctx, tenant, sel, false)
}

// takeParked removes the parks sel picks, publishing each first when redrive is set.
func (b *memBroker) takeParked(ctx context.Context, tenant mq.TenantID, sel mq.DeadLetterSelector, redrive bool) (int, error) {
	if err := tenant.Validate(); err != nil {
		return 0, fmt.Errorf("mem: dead letters: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errClosed("dead letters")
	}
	picked, err := b.selectParkedLocked(tenant, sel)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ev := range picked {
		if redrive {
			again := &memEvent{topic: ev.topic, key: ev.key, id: "mem-redrive-" + ev.id, msgID: ev.parkedID, data: ev.data, headers: mq.Headers{}, size: ev.size}
			for k, vs := range ev.headers {
				if !strings.HasPrefix(k, "Mq-Dead-") {
					again.headers[k] = slices.Clone(vs)
				}
			}
			if err := b.storeLocked(tenant, []*memEvent{again}); err != nil {
				return n, err
			}
		}
		b.parked = slices.DeleteFunc(b.parked, func(p *memEvent) bool { return p == ev })
		n++
	}
	return n, nil
}

// selectParkedLocked returns tenant's parks sel picks, oldest first: its IDs (each
// must be tenant's park), its Table, or All of them; exactly one must be given.
func (b *memBroker) selectParkedLocked(tenant mq.TenantID, sel mq.DeadLetterSelector) ([]*memEvent, error) {
	var picked []*memEvent
	switch {
	case (sel.All && sel.Table != "") || (len(sel.IDs) > 0 && (sel.All || sel.Table != "")):
		return nil, fmt.Errorf("mem: dead letters of %s: the selector gives two ways: %w", tenant, mq.ErrInvalidConfig)
	case len(sel.IDs) > 0:
		want := map[string]bool{}
		for _, id := range sel.IDs {
			want[id] = true
		}
		for _, ev := range b.parked {
			if ev.topic.Tenant == tenant && want[ev.id] {
				picked = append(picked, ev)
				delete(want, ev.id)
			}
		}
		for _, id := range sel.IDs {
			if want[id] {
				return nil, fmt.Errorf("mem: %s has no park %q: %w", tenant, id, mq.ErrDeadLetterNotFound)
			}
		}
	case sel.Table != "" || sel.All:
		for _, ev := range b.parked {
			if ev.topic.Tenant == tenant && (sel.Table == "" || ev.topic.Table == sel.Table) {
				picked = append(picked, ev)
			}
		}
	default:
		return nil, fmt.Errorf("mem: dead letters of %s: the selector picks nothing: %w", tenant, mq.ErrInvalidConfig)
	}
	return picked, nil
}
