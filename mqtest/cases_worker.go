package mqtest

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// The worker's policy as ConsumerConfig and Consumer.Consume state it: per-tenant
// lanes run in parallel up to Concurrency, the poison policy (RetryDelay,
// MaxDeliveries, the park), the graceful stop, several Consumes sharing a durable, and
// the configs CreateConsumer refuses.

func workerCases() []testCase {
	return []testCase{
		{
			name: "AFailedEventComesBackWithAGrowingAttemptBeforeItsTenantsNextWhileOtherTenantsGoOn",
			proves: "A failed event is delivered again, its Attempt one higher each time, and " +
				"never while its previous call runs; its tenant's later events begin only " +
				"once it was handled; the other tenants, published after it first failed, are " +
				"handled meanwhile (it fails until they all were, so a broker that held them " +
				"behind it never gets there). Eight tenants, so on a broker with a few " +
				"delivery units some share acme's. With Caps.RetryPolicy each retry begins no " +
				"sooner than RetryDelay after the failed call returned, doubling up to " +
				"MaxRetryDelay, and under a negative MaxDeliveries nothing is parked, even " +
				"past the default of 10 deliveries.",
			flags:     []string{"RetryPolicy"},
			publishes: "a failing event and its successors on acme/t; events for other tenants",
			run:       aFailedEventHoldsOnlyItsTenant,
		},
		{
			name: "AnEventThatFailsOnItsMaxDeliveriesthDeliveryIsParkedWithWhyAndAckedAndItsTenantGoesOn",
			proves: "An event whose handler returns an error on every delivery is parked on the " +
				"failure of its MaxDeliveries-th. Under MaxDeliveries 3, with " +
				"Caps.RetryPolicy, it is handled three times (attempts 1 to 3), then parked " +
				"once under its own topic with its data, its headers and the mq.HeaderDead* " +
				"ones, and acked: never delivered again, not even to a new Consume; its " +
				"tenant's next event follows it. Without the flag it is handed to the handler " +
				"a fourth time and nothing is parked. The parked error is the last one, on " +
				"one line, cut to 1 KiB.",
			hooks:     []string{"DeadLetters"},
			flags:     []string{"AckWaitRedelivers", "RetryPolicy"},
			publishes: "a poison event and its successors on acme/rows/s",
			run:       aFailingEventIsParked,
		},
		{
			name: "AHandlerPanicIsAFailureRetriedThenParked",
			proves: "A handler that panics on every delivery of an event is a failure as an error " +
				"is: retried, then parked with an error that says the panic's value. Under " +
				"MaxDeliveries 3, with Caps.RetryPolicy, it is handled three times (attempts " +
				"1 to 3), then parked once under its own topic with its data, its headers and " +
				"the mq.HeaderDead* ones, and acked: never delivered again, not even to a new " +
				"Consume; its tenant's next event follows it. Without the flag it is handed " +
				"to the handler a fourth time and nothing is parked.",
			hooks:     []string{"DeadLetters"},
			flags:     []string{"AckWaitRedelivers", "RetryPolicy"},
			publishes: "a poison event and its successors on acme/rows/s",
			run:       aPanickingEventIsParked,
		},
		{
			name: "DifferentTenantsRunAtOnceUpToConcurrencyAndATenantNeverTwice",
			proves: "With Caps.ConcurrentTenants and Concurrency 3, three calls of different " +
				"tenants are in flight together (each waits until the case lets them go) and " +
				"a fourth does not begin meanwhile; without it, one call is. Eight tenants " +
				"with three events each, so on a broker with a few delivery units some share " +
				"one. Either way no tenant has two calls at once and each keeps its order.",
			flags:     []string{"ConcurrentTenants"},
			publishes: "3 events each for acme, globex and 6 more tenants",
			run:       differentTenantsRunAtOnce,
		},
		{
			name: "StopHandsBackWhatWaitedSoANewConsumeGetsItAtOnceInOrder",
			proves: "Two tenants are held by the worker, each with an event behind the held one: " +
				"acme's first event failed under an hour's RetryDelay (without " +
				"Caps.RetryPolicy its handler nak'ed it with an hour's delay instead), " +
				"globex's first the handler nak'ed with an hour's delay; meanwhile a third " +
				"tenant goes on, and the host keeps one of its events, returned unsettled, " +
				"for a batch. After stop the host still acks the kept event. With " +
				"Caps.HandsBackOnStop, a new Consume then gets both held tenants' events at " +
				"once (long before the hour, or the ack wait), each tenant in order, the held " +
				"event first and delivered again; without it, none of them within the quiet " +
				"window. Either way it never gets the kept event.",
			flags:     []string{"HandsBackOnStop", "RetryPolicy"},
			publishes: "events on acme/t, globex/t and a third tenant",
			run:       stopHandsBackWhatWaited,
		},
		{
			name: "TwoConsumesShareADurableEachTenantInOrderAndOneTakesOverWhenTheOtherStops",
			proves: "With Caps.SharedConsumers, two Consumes of one durable share its events: " +
				"rounds of three events for each of eight tenants go on until both were " +
				"handed some; then one stops with a round just published (part of its share " +
				"still waiting), and a last round follows. Every event is handled; no call of " +
				"the stopped one begins after its stop returned; a tenant's calls, across " +
				"both, never overlap and never go back to an earlier event. Without the flag, " +
				"a second Consume while the first runs is refused.",
			flags:     []string{"SharedConsumers"},
			publishes: "3 events each for acme, globex and 6 more tenants",
			run:       twoConsumesShareTheDurable,
		},
		{
			name: "ANakByTheHandlerHoldsItsTenantUntilItComesBackAndNeverParks",
			proves: "An event the handler nak'ed itself before returning holds its tenant as a " +
				"failure does (the tenant's next event begins only once the nak'ed one was " +
				"handled again, and acked) but is never parked: only a failure parks, so " +
				"under MaxDeliveries 2 it is handed to the handler a third time.",
			publishes: "a nak'ed event and its successors on acme/t",
			run:       aNakHoldsItsTenantAndNeverParks,
		},
		{
			name: "StopWaitsForTheCallsInFlightUpToStopTimeout",
			proves: "Stop does not return while a handler call runs; the call then settles its " +
				"event (a new Consume does not get it again) and stop returns. Under a " +
				"StopTimeout shorter than a call, stop returns while the call still runs.",
			publishes: "a few events on acme/t",
			run:       stopWaitsForTheCallsInFlight,
		},
		{
			name: "CreateConsumerRefusesAConfigThatCannotWorkWithErrInvalidConfig",
			proves: "A ConsumerConfig that cannot work (a negative duration or count, a partition " +
				"claim that is empty, names a partition twice or one no broker has) is " +
				"refused with mq.ErrInvalidConfig, never mistaken for a missing durable; a " +
				"negative MaxDeliveries (never park) and a claim of the first unit are valid, " +
				"and the durable still works after the refusals.",
			publishes: "1 event on acme/t after the refusals",
			run:       invalidConsumerConfig,
		},
		{
			name: "ConsumeAndSubscribeRefuseANilHandlerOrANegativePrefetchWithErrInvalidConfig",
			proves: "Consume with a nil handler or a negative prefetch, and Subscribe with a nil " +
				"handler, are refused with mq.ErrInvalidConfig, never a panic; the durable " +
				"still works after the refusals.",
			publishes: "1 event on acme/t after the refusals",
			run:       nilHandlerOrNegativePrefetch,
		},
	}
}

// callsOf returns tenant's recorded calls in the order they began.
func callsOf(tenant mq.TenantID, got []delivery) []delivery {
	var out []delivery
	for _, d := range got {
		if d.topic.Tenant == tenant {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, byStart)
	return out
}

// assertOneAtATime requires calls, one tenant's in the order they began, never to
// overlap: each began once the previous one had returned.
func assertOneAtATime(t *testing.T, calls []delivery, what string) {
	t.Helper()
	for i := 1; i < len(calls); i++ {
		assert.False(t, calls[i].start.Before(calls[i-1].end),
			"%s: the call for %q (attempt %d) began before the one for %q (attempt %d) returned",
			what, calls[i].data, calls[i].msg.Attempt, calls[i-1].data, calls[i-1].msg.Attempt)
	}
}

// attempts returns the Attempt of each call.
func attempts(calls []delivery) []int {
	out := make([]int, len(calls))
	for i, d := range calls {
		out[i] = d.msg.Attempt
	}
	return out
}

// count is how often s occurs in ss.
func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// upTo returns 1 ... n.
func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func nilHandlerOrNegativePrefetch(t *testing.T, h Harness) {
	e := setup(t, h)
	c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	require.NoError(t, err)
	_, _, err = c.Consume(nil, 0)
	assert.ErrorIs(t, err, mq.ErrInvalidConfig, "Consume with a nil handler")
	_, _, err = c.Consume(e.ackEach, -1)
	assert.ErrorIs(t, err, mq.ErrInvalidConfig, "Consume with a negative prefetch")
	assert.ErrorIs(t, e.b.Subscribe(e.ctx, "nil-handler", nil), mq.ErrInvalidConfig, "Subscribe with a nil handler")
	w := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.publish(topic(Acme, "t", ""), "after the refusals")
	assert.Equal(t, "after the refusals", next(t, w.deliveries, 1)[0].data)
}

func invalidConsumerConfig(t *testing.T, h Harness) {
	e := setup(t, h)
	for name, cfg := range map[string]mq.ConsumerConfig{
		"negative AckWait":          {AckWait: -time.Second},
		"negative MaxAckPending":    {MaxAckPending: -1},
		"negative Concurrency":      {Concurrency: -1},
		"negative RetryDelay":       {RetryDelay: -time.Second},
		"negative MaxRetryDelay":    {MaxRetryDelay: -time.Second},
		"negative StopTimeout":      {StopTimeout: -time.Second},
		"negative MemberTimeout":    {MemberTimeout: -time.Second},
		"an empty claim":            {Partitions: []int{}},
		"a negative partition":      {Partitions: []int{-1}},
		"a partition no broker has": {Partitions: []int{math.MaxInt32}},
		"a partition named twice":   {Partitions: []int{0, 0}},
	} {
		cfg.Durable = Durable
		c, err := e.b.CreateConsumer(e.ctx, cfg)
		assert.ErrorIs(t, err, mq.ErrInvalidConfig, "%s: %+v", name, cfg)
		assert.NotErrorIs(t, err, mq.ErrConsumerNotFound, name)
		assert.Nil(t, c, "%s: a consumer besides the error", name)
	}
	for name, cfg := range map[string]mq.ConsumerConfig{
		"a negative MaxDeliveries":  {MaxDeliveries: -1},
		"a claim of the first unit": {Partitions: []int{0}},
	} {
		cfg.Durable = Durable
		_, err := e.b.CreateConsumer(e.ctx, cfg)
		assert.NoError(t, err, name)
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.publish(topic(Acme, "t", ""), "after the refusals")
	assert.Equal(t, "after the refusals", next(t, c.deliveries, 1)[0].data)
}
