package mqtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/wavehouse/mq"
)

func hubCases() []testCase {
	return []testCase{
		{
			name: "SubscribeCarriesTheTraceContext",
			proves: "The hub's Message.Ctx carries the publisher's span context, extracted from " +
				"the event's headers (so it is remote), and the trace context is among " +
				"Message.Headers next to the option headers.",
			publishes: "1 event on acme/traced, under a span",
			run:       subscribeCarriesTheTraceContext,
		},
		{
			name:      "SubscribeSeesEveryTenant",
			proves:    "One subscription sees every tenant's events.",
			publishes: "1 event each on acme/t and globex/t",
			run:       subscribeSeesEveryTenant,
		},
		{
			name: "SubscribeDeliversEachTenantInOrder",
			proves: "Each tenant's events reach the hub in publish order, across its tables and " +
				"scopes.",
			publishes: "50 events each for acme and globex, interleaved over tables and scopes",
			run:       subscribeEachTenantInOrder,
		},
		{
			name:      "SubscribeSeesOnlyEventsPublishedAfterItReturns",
			proves:    "An event stored before Subscribe returned is not delivered.",
			publishes: "1 event on acme/t before Subscribe and 1 after",
			run:       subscribeOnlyAfter,
		},
		{
			name:      "TwoSubscribersBothGetEveryEvent",
			proves:    "Two subscriptions (same name or not) each get every event.",
			publishes: "5 events on acme/t",
			run:       twoSubscribers,
		},
		{
			name: "SubscribeStopsDeliveringWhenItsContextIsDone",
			proves: "Once Subscribe's context is done, delivery ends; another subscription goes " +
				"on.",
			publishes: "events on acme/t before and after the subscription's context ends",
			run:       subscribeStopsWithItsContext,
		},
		{
			name:      "SubscribeHandlerErrorNeitherRedeliversNorStops",
			proves:    "A hub handler's error is not redelivered and does not end the subscription.",
			publishes: "a few events on acme/t",
			run:       subscribeHandlerError,
		},
		{
			name: "SubscribeHandlerPanicNeitherRedeliversNorStops",
			proves: "A hub handler that panics is treated as one that returned an error: the " +
				"process survives, the event is not redelivered, and the hub goes on.",
			publishes: "a few events on acme/t",
			run:       subscribeHandlerPanic,
		},
		{
			name:      "SubscribeSeesATenantBudgetedAfterItStarted",
			proves:    "A tenant budgeted after Subscribe started reaches it.",
			publishes: "1 event on acme/t and 1 for a tenant budgeted later",
			run:       subscribeSeesALaterTenant,
		},
	}
}

func subscribeCarriesTheTraceContext(t *testing.T, h Harness) {
	e := setup(t, h)
	sc := testSpanContext(t)
	traceID, spanID := sc.TraceID(), sc.SpanID()
	hub := e.subscribe("hub-bridge")
	pctx := trace.ContextWithSpanContext(e.ctx, sc)
	require.NoError(t, e.b.Publish(pctx, topic(Acme, "traced", ""), []byte("traced"), mq.WithHeader("X-Custom", "yes")))

	d := next(t, hub, 1)[0]
	require.NotNil(t, d.msg.Ctx)
	got := trace.SpanContextFromContext(d.msg.Ctx)
	assert.Equal(t, traceID, got.TraceID(), "trace id")
	assert.Equal(t, spanID, got.SpanID(), "span id")
	assert.True(t, got.IsSampled(), "sampled flag")
	assert.True(t, got.IsRemote(), "the span context was not extracted from the headers")
	assert.NotEmpty(t, d.msg.Headers.Get("traceparent"), "trace context header: %v", d.msg.Headers)
	assert.Equal(t, "yes", d.msg.Headers.Get("X-Custom"))
}

func subscribeSeesEveryTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("every-tenant")
	e.publish(topic(Acme, "t", ""), "acme")
	e.publish(topic(Globex, "t", ""), "globex")
	got := next(t, hub, 2)
	assert.ElementsMatch(t, []mq.Topic{topic(Acme, "t", ""), topic(Globex, "t", "")}, []mq.Topic{got[0].topic, got[1].topic})
	assert.ElementsMatch(t, []string{"acme", "globex"}, datas(got))
	none(t, hub)
}

func subscribeEachTenantInOrder(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("order")
	const n = 50
	for i := range n {
		e.publish(topic(Acme, fmt.Sprintf("t%d", i%3), ""), fmt.Sprint(i))
		e.publish(topic(Globex, "t", fmt.Sprintf("s%d", i%2)), fmt.Sprint(i))
	}
	got := byTenant(next(t, hub, 2*n))
	assert.Equal(t, seq("", n), got[Acme], "acme's order")
	assert.Equal(t, seq("", n), got[Globex], "globex's order")
}

func subscribeOnlyAfter(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "t", "")
	e.publish(tp, "before")
	e.replayReaches(tp, 1)
	hub := e.subscribe("only-after")
	e.publish(tp, "after")
	assert.Equal(t, "after", next(t, hub, 1)[0].data)
	none(t, hub)
}

func twoSubscribers(t *testing.T, h Harness) {
	e := setup(t, h)
	a := e.subscribe("pod")
	b := e.subscribe("pod")
	c := e.subscribe("other-pod")
	for i := range 5 {
		e.publish(topic(Acme, "t", ""), fmt.Sprint(i))
	}
	for name, ch := range map[string]<-chan delivery{"first": a, "second": b, "third": c} {
		assert.Equal(t, seq("", 5), datas(next(t, ch, 5)), "%s subscriber", name)
		none(t, ch)
	}
}

func subscribeStopsWithItsContext(t *testing.T, h Harness) {
	e := setup(t, h)
	ctx, cancel := context.WithCancel(e.ctx)
	hub := e.subscribeCtx(ctx, "cancelled")
	other := e.subscribe("still-running")
	tp := topic(Acme, "t", "")
	e.publish(tp, "live")
	assert.Equal(t, "live", next(t, hub, 1)[0].data)
	assert.Equal(t, "live", next(t, other, 1)[0].data)
	cancel()
	e.quiesces(tp, hub, "Subscribe's context was cancelled")
	e.publish(tp, "after")
	var last string
	for last != "after" {
		last = next(t, other, 1)[0].data
	}
}

func subscribeHandlerError(t *testing.T, h Harness) {
	e := setup(t, h)
	put, ch := e.mailbox()
	var mu sync.Mutex
	calls := map[string]int{}
	require.NoError(t, e.b.Subscribe(e.ctx, "erring", func(m *mq.Message) error {
		mu.Lock()
		calls[string(m.Data)]++
		mu.Unlock()
		put(newDelivery(m))
		if string(m.Data) == "fails" {
			return errors.New("mqtest: handler failure")
		}
		return nil
	}))
	tp := topic(Acme, "t", "")
	e.publish(tp, "fails")
	e.publish(tp, "next")
	e.publish(tp, "last")
	assert.Equal(t, []string{"fails", "next", "last"}, datas(next(t, ch, 3)))
	none(t, ch)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"fails": 1, "next": 1, "last": 1}, calls)
}

func subscribeHandlerPanic(t *testing.T, h Harness) {
	e := setup(t, h)
	put, ch := e.mailbox()
	require.NoError(t, e.b.Subscribe(e.ctx, "panicking", func(m *mq.Message) error {
		put(newDelivery(m))
		if string(m.Data) == "boom" {
			panic("mqtest: a hub handler that panics on one event")
		}
		return nil
	}))
	tp := topic(Acme, "t", "")
	for _, data := range []string{"boom", "next", "last"} {
		e.publish(tp, data)
	}
	assert.Equal(t, []string{"boom", "next", "last"}, datas(next(t, ch, 3)))
	none(t, ch)
}

func subscribeSeesALaterTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("later-tenant")
	e.publish(topic(Acme, "t", ""), "prime")
	assert.Equal(t, "prime", next(t, hub, 1)[0].data)
	const later mq.TenantID = "initech"
	e.budget(later)
	e.publish(topic(later, "t", ""), "later")
	d := next(t, hub, 1)[0]
	assert.Equal(t, "later", d.data)
	assert.Equal(t, later, d.topic.Tenant)
}
