package mqtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/wavehouse/mq"
)

// Redelivery on the worker path, as Message's settle methods and Consume state it:
// InProgress holds the ack wait, a redelivered event keeps its tenant's order, a stale
// delivery settled late neither loses nor revives its event; and the publisher's trace
// context reaches the handler.

func redeliveryCases() []testCase {
	return []testCase{
		{
			name: "InProgressKeepsAHeldEventFromComingBack",
			proves: "Only with AckWaitRedelivers: under an AckWait of the quiet window (300 ms, " +
				"times the wait scale), an event the handler returned unsettled (held for a " +
				"batch) and the host then keeps alive with InProgress every quarter of it " +
				"(each returning nil) for four ack waits does not come back, " +
				"nor after the host acks it; the tenant's next event is delivered meanwhile. " +
				"(Held without InProgress it does come back: see AckWaitRedelivers.)",
			flags:     []string{"AckWaitRedelivers"},
			publishes: "2 events on acme/held",
			skip:      needAckWaitRedelivers,
			run:       inProgressHoldsTheAckWait,
		},
		{
			name: "ARedeliveredEventKeepsItsTenantsOrder",
			proves: "The first event of each of two tenants is nak'ed once by its handler " +
				"(acme's with Nak, globex's with NakWithDelay of 100 ms): each comes back " +
				"(Attempt 2) before any later event of its tenant begins, and every later " +
				"event is then handled once, in publish order, never alongside another call " +
				"of its tenant.",
			publishes: "10 events each on acme/t and globex/t",
			run:       aRedeliveredEventKeepsItsTenantsOrder,
		},
		{
			name: "SettlingAStaleDeliveryLateNeitherLosesNorRevivesItsEvent",
			proves: "Only with AckWaitRedelivers: an event whose first two deliveries the handler " +
				"keeps unsettled comes back a third time; a Nak of the first (stale) " +
				"delivery meanwhile does not lose it. Once the third delivery is acked, " +
				"settling the stale ones (Ack, DoubleAck, Nak) returns nil or an error, " +
				"never panics, and the event is not delivered again; the tenant goes on.",
			flags:     []string{"AckWaitRedelivers"},
			publishes: "2 events on acme/stale",
			skip:      needAckWaitRedelivers,
			run:       settlingAStaleDeliveryLate,
		},
		{
			name: "ConsumeCarriesTheTraceContextAndCreateConsumersContext",
			proves: "On the worker path Message.Ctx carries a valid span context with the " +
				"publisher's trace id (Publish and PublishBatch under a span alike) and " +
				"keeps CreateConsumer's context values; the headers carry the trace context.",
			publishes: "1 event on acme/traced and a batch of 2 on acme/traced, under a span",
			run:       consumeCarriesTheTraceContext,
		},
	}
}

func needAckWaitRedelivers(h Harness) string {
	if !h.Caps.AckWaitRedelivers {
		return "Caps.AckWaitRedelivers is false: nothing comes back within the case"
	}
	return ""
}

func inProgressHoldsTheAckWait(t *testing.T, h Harness) {
	e := setup(t, h)
	// The quiet window scales with the harness's wait scale: a slow machine gets a
	// longer ack wait between two InProgress calls rather than a false redelivery.
	window := max(ackWait, quiet)
	tp := topic(Acme, "held", "")
	held := make(chan *mq.Message, 1)
	c := e.consume(mq.ConsumerConfig{AckWait: window}, func(m *mq.Message) error {
		if string(m.Data) == "held" {
			select {
			case held <- m:
			default:
			}
			return nil // the host's to settle, as for a batch
		}
		return e.ackEach(m)
	})
	e.publish(tp, "held")
	var m *mq.Message
	select {
	case m = <-held:
	case <-time.After(wait):
		t.Fatalf("the event was not delivered within %s", wait)
	}
	require.NoError(t, m.InProgress(), "InProgress on the held event")
	e.publish(tp, "next")
	for range 16 { // four times the ack wait
		require.NoError(t, m.InProgress(), "InProgress on the held event")
		time.Sleep(window / 4)
	}
	require.NoError(t, m.DoubleAck(e.ctx), "ack the held event")
	assert.Equal(t, []string{"held", "next"}, datas(next(t, c.deliveries, 2)), "the worker's calls")
	noneFor(t, c.deliveries, 2*window+quiet)
}

func aRedeliveredEventKeepsItsTenantsOrder(t *testing.T, h Harness) {
	e := setup(t, h)
	const n = 10
	var calls counter
	handle, recorded := e.recorded(func(m *mq.Message) error {
		tenant := m.Topic().Tenant
		if string(m.Data) == "0" && calls.inc(string(tenant)) == 1 {
			var err error
			if tenant == Acme {
				err = m.Nak()
			} else {
				err = m.NakWithDelay(100 * time.Millisecond)
			}
			if err != nil {
				e.errorf("nak %s's first event: %v", tenant, err)
			}
			return nil
		}
		return e.ackEach(m)
	})
	e.consume(mq.ConsumerConfig{}, handle)
	for i := range n {
		e.publish(topic(Acme, "t", ""), fmt.Sprint(i))
		e.publish(topic(Globex, "t", ""), fmt.Sprint(i))
	}
	got := next(t, recorded, 2*(n+1))
	for _, tenant := range []mq.TenantID{Acme, Globex} {
		mine := callsOf(tenant, got)
		assert.Equal(t, append([]string{"0"}, seq("", n)...), datas(mine), "%s's calls, in the order they began", tenant)
		assertOneAtATime(t, mine, string(tenant))
		if len(mine) > 1 && mine[1].msg.Attempt != 0 {
			assert.Equal(t, []int{1, 2}, attempts(mine[:2]), "%s's first event, nak'ed once", tenant)
		}
	}
	none(t, recorded)
}

func settlingAStaleDeliveryLate(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "stale", "")
	kept := make(chan *mq.Message, 2)
	var calls counter
	c := e.consume(mq.ConsumerConfig{AckWait: ackWait}, func(m *mq.Message) error {
		if string(m.Data) == "stale" && calls.inc("stale") <= 2 {
			kept <- m
			return nil // kept unsettled: the ack wait brings it back
		}
		return e.ackEach(m)
	})
	e.publish(tp, "stale")
	var stale []*mq.Message
	for len(stale) < 2 {
		select {
		case m := <-kept:
			stale = append(stale, m)
		case <-time.After(wait):
			t.Fatalf("the kept event came back %d times within %s, want 2", len(stale), wait)
		}
	}
	_ = stale[0].Nak() // stale: the second delivery is the live one; nil or an error
	got := next(t, c.deliveries, 3)
	assert.Equal(t, []string{"stale", "stale", "stale"}, datas(got), "the event came back until acked")

	_ = stale[0].Ack()
	_ = stale[0].DoubleAck(e.ctx)
	_ = stale[1].Nak()
	_ = stale[1].DoubleAck(e.ctx)
	e.publish(tp, "next")
	assert.Equal(t, "next", next(t, c.deliveries, 1)[0].data, "the tenant after the stale settles")
	noneFor(t, c.deliveries, 2*quiet) // a stale Nak revived nothing
}

// testSpanContext is a sampled span context with fixed ids, as a caller's span.
func testSpanContext(t *testing.T) trace.SpanContext {
	t.Helper()
	traceID, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	spanID, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
}

func consumeCarriesTheTraceContext(t *testing.T, h Harness) {
	e := setup(t, h)
	sc := testSpanContext(t)
	tp := topic(Acme, "traced", "")
	pctx := trace.ContextWithSpanContext(e.ctx, sc)
	require.NoError(t, e.b.Publish(pctx, tp, []byte("published")))
	require.NoError(t, e.b.PublishBatch(pctx, batchOf(Acme, false, []mq.Topic{tp}, "batched 1", "batched 2")))
	ctx := context.WithValue(e.ctx, markerKey{}, "marked")
	c := e.consumeCtx(ctx, mq.ConsumerConfig{}, 16, e.ackEach)
	for _, d := range next(t, c.deliveries, 3) {
		require.NotNil(t, d.msg.Ctx, "Message.Ctx of %q", d.data)
		got := trace.SpanContextFromContext(d.msg.Ctx)
		assert.True(t, got.IsValid(), "%q: Message.Ctx carries no span context", d.data)
		assert.Equal(t, sc.TraceID(), got.TraceID(), "%q: the trace id", d.data)
		assert.Equal(t, "marked", d.msg.Ctx.Value(markerKey{}), "%q: Message.Ctx is not CreateConsumer's", d.data)
		assert.NotEmpty(t, d.msg.Headers.Get("traceparent"), "%q: trace context header: %v", d.data, d.msg.Headers)
	}
}
