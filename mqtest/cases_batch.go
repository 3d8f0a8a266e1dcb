package mqtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// PublishBatch as BatchPublisher states it: one tenant's events in batch order, checked
// and budgeted whole before anything is stored, idempotent on retry, and atomic where
// Caps.AtomicBatch says so.

func batchCases() []testCase {
	return []testCase{
		{
			name: "PublishBatchStoresEveryEventInBatchOrderAcrossTablesAndScopes",
			proves: "A pipelined batch of one tenant's events over several tables and scopes is " +
				"stored whole: the worker gets every event once, in batch order, with its " +
				"topic and headers; the hub gets them in batch order too; each topic's " +
				"replay holds exactly its own events, in order. Another tenant's batch does " +
				"not mix in.",
			publishes: "a batch of 30 events over acme/a, acme/a/s, acme/b and acme/<hard table>, " +
				"and a batch of 5 on globex/a",
			run: batchRoundTrips,
		},
		{
			name: "PublishBatchRetriedWithIdempotencyKeysStoresEachEventOnce",
			proves: "A batch whose events carry idempotency keys, sent again (as a caller " +
				"retries after an error), stores each event once; a batch that repeats some " +
				"keys and adds others stores only the new ones. With Caps.AtomicBatch the " +
				"same holds for an atomic batch.",
			flags:     []string{"AtomicBatch"},
			publishes: "keyed batches on acme/idem, each sent twice, and a fence",
			run:       batchRetryStoresOnce,
		},
		{
			name: "PublishBatchRefusesAnInvalidEventWholeAndStoresNothing",
			proves: "A batch with one bad event (no table, an invalid tenant, a reserved or " +
				"uncarriable header, a payload over Harness.TooLarge) is refused whole with " +
				"the sentinel Publish would return (ErrInvalidTopic, ErrInvalidTenant, " +
				"ErrInvalidHeader, ErrPayloadTooLarge), pipelined and, with " +
				"Caps.AtomicBatch, atomic: none of its good events is stored.",
			hooks:     []string{"ReservedHeaderPrefix", "TooLarge"},
			flags:     []string{"AtomicBatch"},
			publishes: "refused batches on acme/bad; 1 fence",
			run:       batchRefusesAnInvalidEvent,
		},
		{
			name: "PublishBatchOverTheBudgetIsRefusedWholeWithErrQueueFull",
			proves: "With PerTenantBudget, a batch of 8 KiB for a tenant with a 4 KiB budget is " +
				"refused with ErrQueueFull and none of it is stored, while a batch that fits " +
				"is stored and another tenant publishes; without it, the batch is stored " +
				"whole.",
			flags:     []string{"PerTenantBudget"},
			publishes: "a batch of 8 events of 1 KiB and one of 2 small events on acme/budget, a batch on globex/budget",
			run:       batchOverBudget,
		},
		{
			name: "AnEmptyBatchIsANoOp",
			proves: "A batch with no events, pipelined or atomic, nil or empty, returns nil and " +
				"stores nothing, also for a tenant that has no budget; one of an invalid tenant is " +
				"still ErrInvalidTenant.",
			publishes: "empty batches for acme, initech and two invalid tenants; 1 fence on acme/empty",
			run:       emptyBatchIsANoOp,
		},
		{
			name: "AnAtomicBatchStoresEverythingInOrderOrIsUnsupportedExactlyAsAtomicBatchIsDeclared",
			proves: "With Caps.AtomicBatch an atomic batch over several tables and scopes is " +
				"stored whole, in batch order, on every path; without it, it is refused with " +
				"an error wrapping errors.ErrUnsupported, nothing of it is stored, and the " +
				"same events still go out as a pipelined batch.",
			flags:     []string{"AtomicBatch"},
			publishes: "an atomic batch of 20 events over acme/a, acme/a/s and acme/b (without the flag, then 1 on acme/fence and the 20 pipelined)",
			run:       atomicBatchPerCaps,
		},
		{
			name:      "PublishBatchWithADoneContextReturnsTheContextsError",
			proves:    "PublishBatch under a cancelled or expired context returns that context's error, never ErrQueueFull.",
			publishes: "batches on acme/ctx under done contexts, then 1 event",
			run:       batchWithADoneContext,
		},
		{
			name:      "PublishBatchAfterCloseReturnsErrClosed",
			proves:    "After Close, PublishBatch (pipelined or atomic) returns an error wrapping ErrClosed.",
			publishes: "1 event on acme/t before Close",
			run:       batchAfterClose,
		},
	}
}

// batchOf builds a batch of tenant with one event per data, on tp's table and scope,
// each with the header X-Data saying its data.
func batchOf(tenant mq.TenantID, atomic bool, tps []mq.Topic, data ...string) mq.Batch {
	b := mq.Batch{Tenant: tenant, Atomic: atomic}
	for i, d := range data {
		tp := tps[i%len(tps)]
		b.Events = append(b.Events, mq.BatchEvent{
			Table: tp.Table, Scope: tp.Scope, Data: []byte(d),
			Options: []mq.PublishOpt{mq.WithHeader("X-Data", d)},
		})
	}
	return b
}

// publishBatch publishes b and requires success.
func (e *env) publishBatch(b mq.Batch) {
	e.t.Helper()
	require.NoError(e.t, e.b.PublishBatch(e.ctx, b), "publish a batch of %d events for %s (atomic %t)", len(b.Events), b.Tenant, b.Atomic)
}

// topicsOf is the topic of each of b's events.
func topicsOf(b mq.Batch) []mq.Topic {
	out := make([]mq.Topic, len(b.Events))
	for i, ev := range b.Events {
		out[i] = topic(b.Tenant, ev.Table, ev.Scope)
	}
	return out
}

// assertBatchOnEveryPath checks that b's events reached the worker deliveries and the
// hub deliveries in batch order, each with its topic and X-Data header, and that each
// topic's replay holds its events in batch order.
func (e *env) assertBatchOnEveryPath(b mq.Batch, worker, hub []delivery) {
	e.t.Helper()
	tps := topicsOf(b)
	var want []string
	perTopic := map[mq.Topic][]string{}
	for i, ev := range b.Events {
		want = append(want, string(ev.Data))
		perTopic[tps[i]] = append(perTopic[tps[i]], string(ev.Data))
	}
	for path, got := range map[string][]delivery{"consume": worker, "subscribe": hub} {
		var mine []delivery
		for _, d := range got {
			if d.topic.Tenant == b.Tenant {
				mine = append(mine, d)
			}
		}
		require.Equal(e.t, want, datas(mine), "%s: %s's batch in batch order", path, b.Tenant)
		for i, d := range mine {
			assert.Equal(e.t, tps[i], d.topic, "%s: topic of %q", path, d.data)
			assert.Equal(e.t, d.data, d.msg.Headers.Get("X-Data"), "%s: headers of %q", path, d.data)
		}
	}
	for tp, want := range perTopic {
		assert.Equal(e.t, want, e.replayThrough(tp, time.Time{}, want[len(want)-1]), "replay of %s", tp)
	}
}

func batchRoundTrips(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("batch")
	acme := batchOf(Acme, false, []mq.Topic{
		topic(Acme, "a", ""), topic(Acme, "a", "s"), topic(Acme, "b", ""), topic(Acme, hardTable, ""),
	}, seq("", 30)...)
	globex := batchOf(Globex, false, []mq.Topic{topic(Globex, "a", "")}, seq("g", 5)...)
	e.publishBatch(acme)
	e.publishBatch(globex)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	worker := next(t, c.deliveries, 35)
	hubGot := next(t, hub, 35)
	e.assertBatchOnEveryPath(acme, worker, hubGot)
	e.assertBatchOnEveryPath(globex, worker, hubGot)
	none(t, c.deliveries)
}

// keyed is a batch of Acme's on acme/idem whose events carry their data as their
// idempotency key.
func keyed(atomic bool, keys ...string) mq.Batch {
	b := mq.Batch{Tenant: Acme, Atomic: atomic}
	for _, k := range keys {
		b.Events = append(b.Events, mq.BatchEvent{Table: "idem", Data: []byte(k), Options: []mq.PublishOpt{mq.WithIdempotencyKey(k)}})
	}
	return b
}

func batchRetryStoresOnce(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "idem", "")
	want := []string{"k0", "k1", "k2", "k3"}
	for range 2 {
		e.publishBatch(keyed(false, "k0", "k1", "k2"))
	}
	e.publishBatch(keyed(false, "k1", "k2", "k3"))
	if h.Caps.AtomicBatch {
		for range 2 {
			e.publishBatch(keyed(true, "a0", "a1"))
		}
		e.publishBatch(keyed(true, "a1", "a2"))
		want = append(want, "a0", "a1", "a2")
	}
	e.publish(tp, "fence")
	want = append(want, "fence")
	assert.Equal(t, want, e.replayThrough(tp, time.Time{}, "fence"), "the history")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, want, datas(next(t, c.deliveries, len(want))), "the worker")
	none(t, c.deliveries)
}

func batchRefusesAnInvalidEvent(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "bad", "")
	good := func(d string) mq.BatchEvent { return mq.BatchEvent{Table: tp.Table, Data: []byte(d)} }
	for _, bad := range []struct {
		name   string
		tenant mq.TenantID
		event  mq.BatchEvent
		want   error
	}{
		{"no table", Acme, mq.BatchEvent{Data: []byte("no table")}, mq.ErrInvalidTopic},
		{"an invalid tenant", "Not.A.Tenant", good("invalid tenant"), mq.ErrInvalidTenant},
		{"a reserved header", Acme, mq.BatchEvent{Table: tp.Table, Data: []byte("reserved"),
			Options: []mq.PublishOpt{mq.WithHeader(h.ReservedHeaderPrefix+"Expected-Stream", "x")}}, mq.ErrInvalidHeader},
		{"an uncarriable header", Acme, mq.BatchEvent{Table: tp.Table, Data: []byte("uncarriable"),
			Options: []mq.PublishOpt{mq.WithHeader("X-Line", "a\r\nb")}}, mq.ErrInvalidHeader},
		{"a payload too large", Acme, mq.BatchEvent{Table: tp.Table, Data: make([]byte, h.tooLarge())}, mq.ErrPayloadTooLarge},
	} {
		if bad.name == "a reserved header" && h.ReservedHeaderPrefix == "" {
			continue // the broker reserves no names
		}
		for _, atomic := range []bool{false, true} {
			if atomic && !h.Caps.AtomicBatch {
				continue
			}
			b := mq.Batch{Tenant: bad.tenant, Atomic: atomic, Events: []mq.BatchEvent{good("before"), bad.event, good("after")}}
			err := e.b.PublishBatch(e.ctx, b)
			assert.ErrorIs(t, err, bad.want, "a batch with %s (atomic %t)", bad.name, atomic)
		}
	}
	e.publish(tp, "fence")
	assert.Equal(t, []string{"fence"}, e.replayThrough(tp, time.Time{}, "fence"), "a refused batch stored some of its events")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, []string{"fence"}, datas(next(t, c.deliveries, 1)))
	none(t, c.deliveries)
}

func batchOverBudget(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "budget", "")
	var kibs []string
	for i := range 8 {
		kibs = append(kibs, fmt.Sprintf("%d%s", i, strings.Repeat("k", 1<<10-1)))
	}
	big := batchOf(Acme, false, []mq.Topic{tp}, kibs...)
	require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 4<<10))
	err := e.b.PublishBatch(e.ctx, big)
	if !h.Caps.PerTenantBudget {
		require.NoError(t, err, "Caps.PerTenantBudget is false, yet a batch of 8 KiB over a 4 KiB budget was refused")
		assert.Equal(t, kibs, e.replayThrough(tp, time.Time{}, kibs[7]), "the batch over the budget, stored")
		return
	}
	require.ErrorIs(t, err, mq.ErrQueueFull, "Caps.PerTenantBudget: a batch of 8 KiB over a 4 KiB budget")
	e.publishBatch(batchOf(Acme, false, []mq.Topic{tp}, "small 1", "small 2"))
	e.publishBatch(batchOf(Globex, false, []mq.Topic{topic(Globex, "budget", "")}, kibs...))
	assert.Equal(t, []string{"small 1", "small 2"}, e.replayThrough(tp, time.Time{}, "small 2"), "the refused batch stored some of its events")
}

func emptyBatchIsANoOp(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("empty-batch")
	for _, b := range []mq.Batch{
		{Tenant: Acme},
		{Tenant: Acme, Events: []mq.BatchEvent{}},
		{Tenant: Acme, Atomic: true},
		{Tenant: "initech"},
	} {
		assert.NoError(t, e.b.PublishBatch(e.ctx, b), "an empty batch %+v", b)
	}
	// Empty or not, the batch names its tenant: wiring that left it unset is told so.
	for _, tenant := range []mq.TenantID{"", "Not.A.Tenant"} {
		assert.ErrorIs(t, e.b.PublishBatch(e.ctx, mq.Batch{Tenant: tenant}), mq.ErrInvalidTenant, "an empty batch of tenant %q", tenant)
	}
	tp := topic(Acme, "empty", "")
	e.publish(tp, "fence")
	assert.Equal(t, []string{"fence"}, datas(next(t, hub, 1)))
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, []string{"fence"}, datas(next(t, c.deliveries, 1)))
	none(t, c.deliveries)
	none(t, hub)
}

func atomicBatchPerCaps(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("atomic")
	b := batchOf(Acme, true, []mq.Topic{topic(Acme, "a", ""), topic(Acme, "a", "s"), topic(Acme, "b", "")}, seq("", 20)...)
	err := e.b.PublishBatch(e.ctx, b)
	if !h.Caps.AtomicBatch {
		require.ErrorIs(t, err, errors.ErrUnsupported, "Caps.AtomicBatch is false, yet an atomic batch was not refused as unsupported")
		// The fence goes to a table of its own: the hub delivers a tenant in order, so
		// an event of the refused batch would come before it, and the replays of the
		// batch's topics below stay the batch's alone.
		e.publish(topic(Acme, "fence", ""), "fence")
		assert.Equal(t, []string{"fence"}, datas(next(t, hub, 1)), "Caps.AtomicBatch is false: the refused atomic batch stored some of its events")
		b.Atomic = false
		e.publishBatch(b)
	} else {
		require.NoError(t, err, "Caps.AtomicBatch: an atomic batch")
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	worker := next(t, c.deliveries, len(b.Events)+boolInt(!h.Caps.AtomicBatch))
	hubGot := next(t, hub, len(b.Events))
	if !h.Caps.AtomicBatch {
		worker = worker[1:] // the fence, published before the pipelined batch
	}
	e.assertBatchOnEveryPath(b, worker, hubGot)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func batchWithADoneContext(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "ctx", "")
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for _, atomic := range []bool{false, true} {
		b := batchOf(Acme, atomic, []mq.Topic{tp}, "one", "two")
		err := e.b.PublishBatch(cancelled, b)
		assert.ErrorIs(t, err, context.Canceled, "atomic %t", atomic)
		assert.NotErrorIs(t, err, mq.ErrQueueFull, "atomic %t", atomic)
		assert.ErrorIs(t, e.b.PublishBatch(expired, b), context.DeadlineExceeded, "atomic %t", atomic)
	}
	e.publish(tp, "live")
}

func batchAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "t", "")
	e.publish(tp, "before")
	require.NoError(t, e.b.Close())
	for _, atomic := range []bool{false, true} {
		err := e.b.PublishBatch(e.ctx, batchOf(Acme, atomic, []mq.Topic{tp}, fmt.Sprint("after, atomic ", atomic)))
		assert.ErrorIs(t, err, mq.ErrClosed, "atomic %t", atomic)
	}
}
