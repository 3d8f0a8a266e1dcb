package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The per-tenant budgets of EmbeddedNATS: the bucket that keeps them, the backlog
// rebuilt at boot, and the settler that gives an event's bytes back on ack.

func (e *EmbeddedNATS) budgetBucket() string { return e.topo.budgetBucket() }

// watchBudgets enforces the budgets the store holds and keeps following the bucket
// until the broker shuts down: a write whose answer was lost (SetMaxBytes returned an
// error) is enforced once it turns out stored, so memory never keeps a budget the
// store does not. It returns once every stored budget is enforced.
func (e *EmbeddedNATS) watchBudgets(ctx context.Context) error {
	// The watch's ordered consumer re-creates itself with the context it started with,
	// so that context lives until shutdown; only its start is bounded by the boot's.
	wctx, cancel := context.WithCancel(context.Background())
	unbound := context.AfterFunc(ctx, cancel)
	w, err := e.kv.WatchAll(wctx)
	if !unbound() || err != nil {
		cancel()
		return fmt.Errorf("budget bucket %s: watch: %w", e.budgetBucket(), cmp.Or(err, ctx.Err()))
	}
	e.budgetWatch = w
	e.budgetWatchEnd = cancel
	done := make(chan struct{})
	e.budgetWatchDone = done
	loaded := make(chan struct{})
	go func() {
		defer close(done)
		for entry := range w.Updates() {
			if entry == nil {
				close(loaded)
				continue
			}
			e.applyStoredBudget(entry)
		}
	}()
	select {
	case <-loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("budget bucket %s: loading the budgets: %w", e.budgetBucket(), ctx.Err())
	}
}

// applyStoredBudget enforces one entry of the budget bucket.
func (e *EmbeddedNATS) applyStoredBudget(entry jetstream.KeyValueEntry) {
	if strings.HasPrefix(entry.Key(), ackedKeyPrefix) {
		return
	}
	tenant := TenantID(entry.Key())
	if tenant.Validate() != nil {
		e.log.Warn("mq: ignoring a malformed stored budget", "key", entry.Key())
		return
	}
	if entry.Operation() != jetstream.KeyValuePut {
		e.budgets.removed(tenant, entry.Revision())
		return
	}
	n, err := strconv.ParseInt(string(entry.Value()), 10, 64)
	if err != nil || n < 0 {
		e.log.Warn("mq: ignoring a malformed stored budget", "key", entry.Key())
		return
	}
	e.budgets.stored(tenant, n, entry.Revision())
}

// stopBudgetWatch ends the watch of the budget bucket and waits, bounded, for its
// goroutine.
func (e *EmbeddedNATS) stopBudgetWatch() {
	if e.budgetWatch == nil {
		return
	}
	_ = e.budgetWatch.Stop()
	e.budgetWatchEnd()
	select {
	case <-e.budgetWatchDone:
	case <-time.After(closeFlushTimeout):
		e.log.Warn("mq: the budget watch did not end", "bucket", e.budgetBucket())
	}
}

// rebuildBacklog counts partition p's stored events that the durable has not
// acknowledged against their tenants, reading headers only.
func (e *EmbeddedNATS) rebuildBacklog(ctx context.Context, p int) error {
	name := e.topo.PartitionStream(p)
	stream, err := e.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	cons, err := stream.Consumer(ctx, e.topo.IngestConsumer)
	if err != nil {
		return fmt.Errorf("consumer %s/%s: %w", name, e.topo.IngestConsumer, err)
	}
	info := cons.CachedInfo()
	floor := info.AckFloor.Stream
	e.budgets.ackedThrough(p, floor)
	if err := e.loadAcked(ctx, p); err != nil {
		return err
	}
	last := stream.CachedInfo().State.LastSeq
	if last <= floor {
		return nil
	}
	scan, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   floor + 1,
		HeadersOnly:   true,
	})
	if err != nil {
		return fmt.Errorf("stream %s: backlog scan: %w", name, err)
	}
	// An ack-less consumer still holds every event past what it delivered on an
	// interest stream, so the scan must not outlive the boot.
	defer func() {
		if info := scan.CachedInfo(); info != nil {
			e.core.deleteConsumer(name, info.Name)
		}
	}()
	// The events counted above the floor and up to the last one delivered should be
	// the ones the durable awaits an ack for. More means acks saveAcked never kept
	// (the broker stopped without Close): the server will not deliver those events
	// again, so releaseDoubtful gives their bytes back once the floor passes them.
	delivered, counted := info.Delivered.Stream, 0
	var inFlight []uint64 // stored, delivered, above the floor: pending unless acked out of order
	defer func() { e.redeliverInFlight(name, info, inFlight) }()
	defer func() {
		if counted > info.NumAckPending {
			e.log.Warn("mq: the backlog counts events the ingest durable may have acknowledged out of order before the broker stopped without closing",
				"stream", name, "counted", counted, "ack_pending", info.NumAckPending)
		}
	}()
	for {
		batch, err := scan.Fetch(rebuildFetch, jetstream.FetchMaxWait(rebuildWait))
		if err != nil {
			return fmt.Errorf("stream %s: backlog scan: %w", name, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, ok := parseDelivery(m.Reply())
			if !ok {
				continue
			}
			if meta.streamSeq <= delivered {
				inFlight = append(inFlight, meta.streamSeq)
			}
			if tenant, held := e.holdStored(p, m, meta); held && meta.streamSeq <= delivered {
				counted++
				e.doubtful[p] = append(e.doubtful[p], meta.streamSeq)
				e.core.returning.note(p, delivered, tenant, meta.streamSeq)
			}
			if meta.streamSeq >= last {
				return nil
			}
		}
		if got == 0 {
			// An empty fetch is either the end or a slow server; only the server can
			// say which, and stopping early would leave events uncounted.
			left, err := scan.Info(ctx)
			if err != nil {
				return fmt.Errorf("stream %s: backlog scan: %w", name, err)
			}
			if left.NumPending == 0 {
				return nil
			}
		}
	}
}

// ackedKey names the entry of the budget bucket that keeps partition p's events
// acknowledged above its ack floor. A tenant id has no dot, so it never collides
// with a budget.
func ackedKey(p int) string { return ackedKeyPrefix + strconv.Itoa(p) }

const ackedKeyPrefix = "acked."

// loadAcked reads back what saveAcked kept for partition p.
func (e *EmbeddedNATS) loadAcked(ctx context.Context, p int) error {
	entry, err := e.kv.Get(ctx, ackedKey(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("budget bucket %s: %s: %w", e.budgetBucket(), ackedKey(p), err)
	}
	ranges, err := parseSeqRanges(string(entry.Value()))
	if err != nil {
		// Counting an acknowledged event again is the safe side of a broken entry.
		e.log.Warn("mq: ignoring a malformed record of acknowledged events", "key", ackedKey(p), "error", err)
		return nil
	}
	e.budgets.ackedRanges(p, ranges)
	return nil
}

// saveAcked keeps, per partition, the events this broker saw acknowledged above the
// durable's ack floor. An event acknowledged out of order stays stored above the
// floor (measured on nats-server v2.15.2: until the history's source has
// acknowledged it too, about a second later, and a restart in between keeps it),
// and the server tells nobody which events above the floor are acknowledged, so
// without this a restart would count them again and no ack would ever release them.
// A record left by an earlier run is never wrong, only short: acks are final.
func (e *EmbeddedNATS) saveAcked() {
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	// The acks reach the server before its floor is read; a floor read too early
	// only keeps more.
	_ = e.nc.FlushWithContext(ctx)
	for p := range e.topo.Partitions {
		name := e.topo.PartitionStream(p)
		cons, err := e.js.Consumer(ctx, name, e.topo.IngestConsumer)
		if err != nil {
			e.log.Warn("mq: cannot keep the events acknowledged out of order", "stream", name, "error", err)
			continue
		}
		above := e.budgets.ackedAbove(p, cons.CachedInfo().AckFloor.Stream)
		if _, err := e.kv.Put(ctx, ackedKey(p), []byte(formatSeqRanges(above))); err != nil {
			e.log.Warn("mq: cannot keep the events acknowledged out of order", "stream", name, "error", err)
		}
	}
}

// holdStored counts a stored event (delivered headers-only) against its tenant
// unless it is known to be acknowledged, and reports the tenant and whether it did.
func (e *EmbeddedNATS) holdStored(p int, m jetstream.Msg, meta delivery) (TenantID, bool) {
	dataLen, _ := strconv.Atoi(m.Headers().Get(msgSizeHeader))
	ev, ok := e.storedEvent(m.Subject(), m.Headers(), dataLen)
	if !ok {
		return "", false
	}
	return ev.tenant, e.budgets.adopt(eventRef{p, meta.streamSeq}, ev, meta.timestamp)
}

// storedEvent is what a stored event counts, and against which tenant; false for a
// subject this package could not have written.
func (e *EmbeddedNATS) storedEvent(subject string, h nats.Header, dataLen int) (heldEvent, bool) {
	key, ok := e.subs.key(subject)
	if !ok {
		return heldEvent{}, false
	}
	t, err := ParseTopicKey(key)
	if err != nil {
		return heldEvent{}, false
	}
	ev := heldEvent{tenant: t.Tenant, size: eventSize(subject, Headers(h), dataLen)}
	if id := h.Get(HeaderIdempotencyKey); callerKeyed(id) {
		ev.keyedID = id
	}
	return ev, true
}

// settler releases the budget of the event at ref once the worker acknowledged it.
func (e *EmbeddedNATS) settler(m jetstream.Msg, ref eventRef, into *budgetSettler) Settler {
	*into = budgetSettler{Msg: m, budgets: e.budgets, ref: ref}
	return into
}

type budgetSettler struct {
	jetstream.Msg
	budgets *budgets
	ref     eventRef
}

func (s budgetSettler) release() { s.budgets.release(s.ref) }

func (s budgetSettler) Ack() error {
	err := s.Msg.Ack()
	if err == nil {
		s.release()
	}
	return err
}

func (s budgetSettler) DoubleAck(ctx context.Context) error {
	err := s.Msg.DoubleAck(ctx)
	if err == nil {
		s.release()
	}
	return err
}

// adoptUncounted counts the event a repeated message id was dropped in favour of,
// if nothing counts it yet: an earlier attempt of the same publish stored it and
// its answer was lost, or the publish that stored it ended without an answer. The
// stored event is read back, because a repeat may carry other data than the event
// the stream kept.
func (e *EmbeddedNATS) adoptUncounted(ctx context.Context, ref eventRef) {
	if e.budgets.counted(ref) {
		return
	}
	name := e.topo.PartitionStream(ref.partition)
	stream, err := e.js.Stream(ctx, name)
	if err != nil {
		e.log.Warn("mq: cannot read back a repeated event to count it", "stream", name, "seq", ref.seq, "error", err)
		return
	}
	m, err := stream.GetMsg(ctx, ref.seq)
	if err != nil {
		// Gone means acknowledged everywhere: nothing to count.
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			e.log.Warn("mq: cannot read back a repeated event to count it", "stream", name, "seq", ref.seq, "error", err)
		}
		return
	}
	if ev, ok := e.storedEvent(m.Subject, m.Header, len(m.Data)); ok {
		e.budgets.adopt(ref, ev, m.Time)
	}
}

// releaseDoubtful gives back the bytes of events the boot counted although they had
// been delivered, once the durable's ack floor has passed them. An ack made out of
// order before a crash was never saved (saveAcked runs at Close), so such an event may
// be acknowledged already: the server will not deliver it again, and no settler would
// ever release it. Below the floor every event is acknowledged, so releasing there is
// exact. It polls every doubtfulPoll until none is left or the broker shuts down.
func (e *EmbeddedNATS) releaseDoubtful() {
	defer close(e.doubtfulDone)
	tick := time.NewTicker(doubtfulPoll)
	defer tick.Stop()
	for {
		left := 0
		for p, seqs := range e.doubtful {
			if len(seqs) == 0 {
				continue
			}
			if floor, ok := e.ackFloor(p); ok {
				n := 0
				for n < len(seqs) && seqs[n] <= floor { // the scan appended in sequence order
					e.budgets.release(eventRef{partition: p, seq: seqs[n]})
					n++
				}
				e.doubtful[p] = seqs[n:]
			}
			left += len(e.doubtful[p])
		}
		if left == 0 {
			return
		}
		select {
		case <-e.doubtfulEnd:
			return
		case <-tick.C:
		}
	}
}

// ackFloor reads partition p's ack floor, bounded by PublishTimeout.
func (e *EmbeddedNATS) ackFloor(p int) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), e.topo.PublishTimeout)
	defer cancel()
	cons, err := e.js.Consumer(ctx, e.topo.PartitionStream(p), e.topo.IngestConsumer)
	if err != nil {
		return 0, false
	}
	return cons.CachedInfo().AckFloor.Stream, true
}
