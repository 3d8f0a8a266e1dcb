package mqtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func consumeCases() []testCase {
	return []testCase{
		{
			name: "EachTenantInOrder",
			proves: "Interleaved publishes of two tenants reach the worker in publish order per " +
				"tenant.",
			publishes: "30 events each for acme and globex, interleaved",
			run:       eachTenantInOrder,
		},
		{
			name:      "NakRedelivers",
			proves:    "A nak'ed event comes back once and, acked, not again.",
			publishes: "1 event on acme/t",
			run:       nakRedelivers,
		},
		{
			name:      "NakWithDelayRedelivers",
			proves:    "An event nak'ed with a delay comes back.",
			publishes: "1 event on acme/t",
			run:       nakWithDelayRedelivers,
		},
		{
			name:      "HandlerErrorNaksForRedelivery",
			proves:    "A handler that returns an error (and settles nothing) gets the event again.",
			publishes: "1 event on acme/t",
			run:       handlerErrorNaks,
		},
		{
			name: "HandlerPanicNaksForRedeliveryAndDeliveryGoesOn",
			proves: "A handler that panics is treated as one that returned an error: the process " +
				"survives, the event comes back, and the events after it are delivered. The " +
				"consume helper records a delivery only once the handler returned, so the " +
				"panic itself is not among the deliveries.",
			publishes: "a few events on acme/t",
			run:       handlerPanicNaks,
		},
		{
			name: "AckWaitRedelivers",
			proves: "With AckWaitRedelivers, an event left unsettled under an AckWait of 200 ms (times the wait scale) " +
				"comes back and an acked one does not; without it, neither comes back within " +
				"the quiet window.",
			flags:     []string{"AckWaitRedelivers"},
			publishes: "1 event on acme/t",
			run:       ackWaitRedelivers,
		},
		{
			name: "CreateConsumerAppliesTheConfigExactlyWhenItConfiguresDurables",
			proves: "With ConfiguresDurables, CreateConsumer accepts any AckWait (1h) and " +
				"delivery follows cfg: MaxAckPending 1 holds the next event back until the " +
				"first is acked, and the 1h AckWait does not redeliver the held one. Without " +
				"it, an AckWait longer than the operator's durable (24h) is refused.",
			flags:     []string{"ConfiguresDurables"},
			publishes: "1 event on acme/t",
			run:       configuresDurables,
		},
		{
			name: "UnackedEventsComeBackToANewConsumeAndAckedOnesDoNot",
			proves: "After stop, a new Consume gets what was published meanwhile and, where " +
				"AckWait redelivers, what was left unsettled; never what was acked.",
			flags:     []string{"AckWaitRedelivers"},
			publishes: "events on acme/t and globex/t across a stop",
			run:       atLeastOnceAcrossStop,
		},
		{
			name: "PrefetchOneStillDeliversEveryTenant",
			proves: "A total prefetch of 1, split across every delivery unit (at least one each), " +
				"still delivers every tenant.",
			publishes: "3 events each for acme, globex and 10 more tenants",
			run:       prefetchOne,
		},
		{
			name:      "PrefetchZeroTakesTheDefault",
			proves:    "Prefetch 0 takes the broker's default and delivers every tenant.",
			publishes: "3 events each for acme, globex and 10 more tenants",
			run:       prefetchZero,
		},
		{
			name:      "ConsumeDeliversATenantBudgetedAfterItStarted",
			proves:    "A tenant budgeted after Consume started is delivered too.",
			publishes: "1 event on acme/t and 1 for a tenant budgeted later",
			run:       consumeSeesALaterTenant,
		},
		{
			name: "StopEndsDelivery",
			proves: "Stop returns at once and delivery ends after it; a handler may still run for " +
				"what was in flight, but not for events published afterwards.",
			publishes: "events on acme/t before and after stop",
			run:       stopEndsDelivery,
		},
		{
			name: "DeliveryCarriesTheEventIDTheAttemptAndItsSequence",
			proves: "A delivery carries the event's ID (the idempotency key as the caller gave " +
				"it, else an id of the broker's that differs between events), its attempt (1, " +
				"then 2 after a nak, with the same ID) and a sequence that grows in publish " +
				"order within a tenant; none of it shows up among the headers.",
			hooks:     []string{"ReservedHeaderPrefix"},
			publishes: "events on acme/meta, with and without an idempotency key",
			run:       deliveryMetadata,
		},
	}
}

func eachTenantInOrder(t *testing.T, h Harness) {
	e := setup(t, h)
	const n = 30
	for i := range n {
		e.publish(topic(Acme, "a", ""), fmt.Sprint(i))
		e.publish(topic(Globex, "b", fmt.Sprintf("s%d", i%3)), fmt.Sprint(i))
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	got := byTenant(next(t, c.deliveries, 2*n))
	assert.Equal(t, seq("", n), got[Acme], "acme's order")
	assert.Equal(t, seq("", n), got[Globex], "globex's order")
	none(t, c.deliveries)
}

// redeliveredOnce consumes one Acme event whose first delivery settle rejects, and
// requires exactly one redelivery carrying the same data.
func redeliveredOnce(t *testing.T, h Harness, settle func(e *env, m *mq.Message) error) {
	e := setup(t, h)
	var calls counter
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if calls.inc(string(m.Data)) == 1 {
			return settle(e, m)
		}
		return e.ackEach(m)
	})
	e.publish(topic(Acme, "t", ""), "again")
	got := next(t, c.deliveries, 2)
	assert.Equal(t, []string{"again", "again"}, datas(got))
	assert.Equal(t, topic(Acme, "t", ""), got[1].topic)
	none(t, c.deliveries)
}

func nakRedelivers(t *testing.T, h Harness) {
	redeliveredOnce(t, h, func(e *env, m *mq.Message) error {
		if err := m.Nak(); err != nil {
			e.errorf("nak: %v", err)
		}
		return nil
	})
}

func nakWithDelayRedelivers(t *testing.T, h Harness) {
	redeliveredOnce(t, h, func(e *env, m *mq.Message) error {
		if err := m.NakWithDelay(100 * time.Millisecond); err != nil {
			e.errorf("nak with delay: %v", err)
		}
		return nil
	})
}

func handlerErrorNaks(t *testing.T, h Harness) {
	redeliveredOnce(t, h, func(*env, *mq.Message) error {
		return errors.New("mqtest: transient handler failure")
	})
}

func handlerPanicNaks(t *testing.T, h Harness) {
	e := setup(t, h)
	var calls counter
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if calls.inc(string(m.Data)) == 1 && string(m.Data) == "poison" {
			panic("mqtest: a handler that panics on one event")
		}
		return e.ackEach(m)
	})
	for _, data := range []string{"poison", "next-1", "next-2"} {
		e.publish(topic(Acme, "t", ""), data)
	}
	assert.ElementsMatch(t, []string{"poison", "next-1", "next-2"}, datas(next(t, c.deliveries, 3)),
		"the panicking event came back and the next ones arrived")
	none(t, c.deliveries)
	noFailure(t, c.failed)
}

func ackWaitRedelivers(t *testing.T, h Harness) {
	e := setup(t, h)
	e.publish(topic(Acme, "t", ""), "acked")
	e.publish(topic(Acme, "t", ""), "left")
	c := e.consume(mq.ConsumerConfig{AckWait: ackWait}, func(m *mq.Message) error {
		if string(m.Data) == "acked" {
			return e.ackEach(m)
		}
		return nil
	})
	if h.Caps.AckWaitRedelivers {
		assert.Equal(t, []string{"acked", "left", "left"},
			datas(nextBecause(t, c.deliveries, 3, "Caps.AckWaitRedelivers is true: the unsettled event comes back after AckWait")),
			"Caps.AckWaitRedelivers: the unsettled event comes back after AckWait")
		return
	}
	assert.Equal(t, []string{"acked", "left"}, datas(next(t, c.deliveries, 2)))
	noneBecause(t, c.deliveries, 3*quiet, "Caps.AckWaitRedelivers is false: AckWait does not govern redelivery")
}

func configuresDurables(t *testing.T, h Harness) {
	e := setup(t, h)
	if !h.Caps.ConfiguresDurables {
		_, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable, AckWait: 24 * time.Hour})
		assert.Error(t, err, "Caps.ConfiguresDurables is false, yet a 24h AckWait the operator's durable lacks was accepted")
		c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
		assert.NoError(t, err, "the zero config takes the operator's durable")
		assert.NotNil(t, c)
		return
	}
	cfg := mq.ConsumerConfig{Durable: Durable, AckWait: time.Hour, MaxAckPending: 1}
	_, err := e.b.CreateConsumer(e.ctx, cfg)
	require.NoError(t, err, "Caps.ConfiguresDurables is true, but CreateConsumer refused %+v", cfg)
	held := make(chan *mq.Message, 1)
	c := e.consume(cfg, func(m *mq.Message) error {
		if string(m.Data) == "first" {
			select {
			case held <- m:
			default:
			}
			return nil
		}
		return e.ackEach(m)
	})
	e.publish(topic(Acme, "t", ""), "first")
	e.publish(topic(Acme, "t", ""), "second")
	assert.Equal(t, "first", next(t, c.deliveries, 1)[0].data)
	noneBecause(t, c.deliveries, 3*quiet, "Caps.ConfiguresDurables is true: MaxAckPending 1 holds \"second\" and AckWait 1h holds \"first\"")
	require.NoError(t, (<-held).DoubleAck(e.ctx), "ack the held event")
	assert.Equal(t, "second", next(t, c.deliveries, 1)[0].data)
	none(t, c.deliveries)
}

func atLeastOnceAcrossStop(t *testing.T, h Harness) {
	e := setup(t, h)
	cfg := mq.ConsumerConfig{}
	if h.Caps.AckWaitRedelivers {
		cfg.AckWait = ackWait
	}
	tp := topic(Acme, "t", "")
	for _, d := range []string{"acked-1", "acked-2", "left"} {
		e.publish(tp, d)
	}
	first := e.consume(cfg, func(m *mq.Message) error {
		if string(m.Data) != "left" {
			return e.ackEach(m)
		}
		return nil
	})
	assert.Equal(t, []string{"acked-1", "acked-2", "left"}, datas(next(t, first.deliveries, 3)))
	first.stop()
	e.publish(tp, "while-stopped")
	e.publish(topic(Globex, "t", ""), "globex-while-stopped")

	want := map[string]bool{"while-stopped": true, "globex-while-stopped": true}
	if h.Caps.AckWaitRedelivers {
		want["left"] = true
	}
	second := e.consume(cfg, e.ackEach)
	got := map[string]bool{}
	deadline := time.After(wait)
	for len(got) < len(want) {
		select {
		case d := <-second.deliveries:
			require.NotContains(t, []string{"acked-1", "acked-2"}, d.data, "an acked event came back")
			if want[d.data] {
				got[d.data] = true
			}
		case <-deadline:
			t.Fatalf("the new Consume got %v of %v within %s (Caps.AckWaitRedelivers %v)", got, want, wait, h.Caps.AckWaitRedelivers)
		}
	}
	select {
	case d := <-second.deliveries:
		assert.NotContains(t, []string{"acked-1", "acked-2"}, d.data, "an acked event came back")
	case <-time.After(quiet):
	}
}

// manyTenants budgets n more tenants and returns them with Acme and Globex.
func (e *env) manyTenants(n int) []mq.TenantID {
	e.t.Helper()
	tenants := []mq.TenantID{Acme, Globex}
	for i := range n {
		id := mq.TenantID(fmt.Sprintf("tenant-%d", i))
		e.budget(id)
		tenants = append(tenants, id)
	}
	return tenants
}

// prefetchDeliversAll publishes per events for many tenants and requires a Consume
// with prefetch to deliver all of them, each tenant in order.
func prefetchDeliversAll(t *testing.T, h Harness, prefetch int) {
	e := setup(t, h)
	tenants := e.manyTenants(10)
	const per = 3
	for i := range per {
		for _, id := range tenants {
			e.publish(topic(id, "t", ""), fmt.Sprint(i))
		}
	}
	c := e.consumeCtx(e.ctx, mq.ConsumerConfig{}, prefetch, e.ackEach)
	got := byTenant(next(t, c.deliveries, per*len(tenants)))
	for _, id := range tenants {
		assert.Equal(t, seq("", per), got[id], "tenant %s with prefetch %d", id, prefetch)
	}
	none(t, c.deliveries)
}

func prefetchOne(t *testing.T, h Harness) { prefetchDeliversAll(t, h, 1) }

func prefetchZero(t *testing.T, h Harness) { prefetchDeliversAll(t, h, 0) }

func consumeSeesALaterTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.publish(topic(Acme, "t", ""), "prime")
	assert.Equal(t, "prime", next(t, c.deliveries, 1)[0].data)
	const later mq.TenantID = "initech"
	e.budget(later)
	e.publish(topic(later, "t", ""), "later")
	d := next(t, c.deliveries, 1)[0]
	assert.Equal(t, "later", d.data)
	assert.Equal(t, later, d.topic.Tenant)
}

func stopEndsDelivery(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	tp := topic(Acme, "t", "")
	e.publish(tp, "prime")
	assert.Equal(t, "prime", next(t, c.deliveries, 1)[0].data)
	stopped := make(chan struct{})
	go func() {
		c.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatalf("stop did not return within %s", wait)
	}
	c.stop() // a second stop is harmless
	e.quiesces(tp, c.deliveries, "stop")
	noFailure(t, c.failed)
}

func deliveryMetadata(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "meta", "")
	e.publish(tp, "keyed", mq.WithIdempotencyKey("row-1"))
	e.publish(tp, "plain-1")
	e.publish(tp, "plain-2")
	var calls counter
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if string(m.Data) == "keyed" && calls.inc("keyed") == 1 {
			if err := m.Nak(); err != nil {
				e.errorf("nak: %v", err)
			}
			return nil
		}
		return e.ackEach(m)
	})
	byData := map[string][]*mq.Message{}
	for _, d := range next(t, c.deliveries, 4) {
		byData[d.data] = append(byData[d.data], d.msg)
	}
	require.Len(t, byData["keyed"], 2, "the nak'ed event twice")
	first, again := byData["keyed"][0], byData["keyed"][1]
	assert.Equal(t, "row-1", first.ID, "the ID is the idempotency key as given")
	assert.Equal(t, first.ID, again.ID, "a redelivery carries the same ID")
	assert.Equal(t, 1, first.Attempt, "the first delivery is attempt 1")
	assert.Equal(t, 2, again.Attempt, "the redelivery after a nak is attempt 2")
	p1, p2 := byData["plain-1"][0], byData["plain-2"][0]
	assert.NotEmpty(t, p1.ID, "an event published without a key still has an ID")
	assert.NotEqual(t, p1.ID, p2.ID, "two events without a key have different IDs")
	if first.Sequence != 0 || p1.Sequence != 0 {
		assert.Less(t, first.Sequence, p1.Sequence, "sequences grow in publish order within a tenant")
		assert.Less(t, p1.Sequence, p2.Sequence, "sequences grow in publish order within a tenant")
		assert.Equal(t, first.Sequence, again.Sequence, "a redelivery is read at the same sequence")
	}
	for _, m := range []*mq.Message{first, again, p1, p2} {
		assert.Empty(t, h.reservedHeaderIn(m.Headers), "a broker header among the user headers (Harness.ReservedHeaderPrefix %q): %v",
			h.ReservedHeaderPrefix, m.Headers)
	}
	sub := e.subscribe("meta")
	e.publish(tp, "live", mq.WithIdempotencyKey("row-2"))
	live := next(t, sub, 1)[0].msg
	assert.Equal(t, "row-2", live.ID, "the hub gives the ID too")
	assert.Equal(t, 1, live.Attempt, "the hub's delivery is attempt 1")
}
