package mqtest

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wavehouse/mq"
)

// The worker's policy as ConsumerConfig and Consumer.Consume state it: per-tenant
// lanes run in parallel up to Concurrency, the poison policy (RetryDelay,
// MaxDeliveries, the park), the graceful stop, several Consumes sharing a durable, and
// the configs CreateConsumer refuses.

func workerCases() []testCase {
	return []testCase{
		{"AFailedEventComesBackWithAGrowingAttemptBeforeItsTenantsNextWhileOtherTenantsGoOn", always, aFailedEventHoldsOnlyItsTenant},
		{"AnEventThatFailsOnItsMaxDeliveriesthDeliveryIsParkedWithWhyAndAckedAndItsTenantGoesOn", always, aFailingEventIsParked},
		{"AHandlerPanicIsAFailureRetriedThenParked", always, aPanickingEventIsParked},
		{"DifferentTenantsRunAtOnceUpToConcurrencyAndATenantNeverTwice", always, differentTenantsRunAtOnce},
		{"StopHandsBackWhatWaitedSoANewConsumeGetsItAtOnceInOrder", always, stopHandsBackWhatWaited},
		{"TwoConsumesShareADurableEachTenantInOrderAndOneTakesOverWhenTheOtherStops", always, twoConsumesShareTheDurable},
		{"ANakByTheHandlerHoldsItsTenantUntilItComesBackAndNeverParks", always, aNakHoldsItsTenantAndNeverParks},
		{"StopWaitsForTheCallsInFlightUpToStopTimeout", always, stopWaitsForTheCallsInFlight},
		{"CreateConsumerRefusesAConfigThatCannotWorkWithErrInvalidConfig", always, invalidConsumerConfig},
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

// invalidConsumerConfig: a ConsumerConfig that cannot work (a negative duration or
// count, a partition claim that is empty, names a partition twice or one no broker
// has) is refused with mq.ErrInvalidConfig, never mistaken for a missing durable; a
// negative MaxDeliveries (never park) and a claim of the first unit are valid, and the
// durable still works after the refusals.
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
