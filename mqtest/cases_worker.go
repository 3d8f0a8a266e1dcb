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

// upTo returns 1 ... n.
func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// aNakHoldsItsTenantAndNeverParks: an event the handler nak'ed itself before returning
// holds its tenant as a failure does (the tenant's next event begins only once the
// nak'ed one was handled again, and acked) but is never parked: only a failure parks,
// so under MaxDeliveries 2 it is handed to the handler a third time.
func aNakHoldsItsTenantAndNeverParks(t *testing.T, h Harness) {
	e := setup(t, h)
	const maxDeliveries, naks = 2, 3
	var calls counter
	handle, done := e.recorded(func(m *mq.Message) error {
		if string(m.Data) == "naked" && calls.inc("naked") <= naks {
			if err := m.Nak(); err != nil {
				e.errorf("nak: %v", err)
			}
			return nil
		}
		return e.ackEach(m)
	})
	e.consume(mq.ConsumerConfig{MaxDeliveries: maxDeliveries, RetryDelay: 50 * time.Millisecond}, handle)
	tp := topic(Acme, "t", "")
	e.publish(tp, "naked")
	e.publish(tp, "after")
	got := callsOf(Acme, nextUntil(t, done, "acme's event after the nak'ed one", func(got []delivery) bool {
		return slices.Contains(datas(got), "after")
	}))
	assert.Equal(t, []string{"naked", "naked", "naked", "naked", "after"}, datas(got),
		"the nak'ed event again and again past MaxDeliveries, then the tenant's next")
	assert.Equal(t, upTo(naks+1), attempts(got[:naks+1]), "the nak'ed event's attempts")
	assertOneAtATime(t, got, "acme")
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme: a nak is not a failure and never parks")
}

// stopWaitsForTheCallsInFlight: stop does not return while a handler call runs; the
// call then settles its event (a new Consume does not get it again) and stop returns.
// Under a StopTimeout shorter than a call, stop returns while the call still runs.
func stopWaitsForTheCallsInFlight(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "t", "")
	entered := make(chan string, 2)
	release := make(chan struct{})
	first := e.consume(mq.ConsumerConfig{StopTimeout: time.Minute}, func(m *mq.Message) error {
		entered <- string(m.Data)
		select {
		case <-release:
		case <-e.ctx.Done():
		}
		return e.ackEach(m)
	})
	e.publish(tp, "slow")
	requireEntered(t, entered, "slow")
	stopped := stopping(first)
	select {
	case <-stopped:
		t.Fatal("stop returned while a handler call was running")
	case <-time.After(quiet):
	}
	close(release)
	requireStopped(t, stopped, "once the call in flight returned")

	stuck := make(chan struct{})
	defer close(stuck)
	second := e.consume(mq.ConsumerConfig{StopTimeout: 50 * time.Millisecond}, func(m *mq.Message) error {
		entered <- string(m.Data)
		if string(m.Data) != "stuck" {
			return e.ackEach(m)
		}
		select {
		case <-stuck:
		case <-e.ctx.Done():
		}
		return nil
	})
	e.publish(tp, "stuck")
	requireEntered(t, entered, "stuck") // not "slow": the call that stop waited for acked it
	requireStopped(t, stopping(second), "under a StopTimeout of 50ms with a call still running")
}

// stopping calls c.stop in the background; the channel closes once it returned.
func stopping(c consumer) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		c.stop()
		close(stopped)
	}()
	return stopped
}

func requireStopped(t *testing.T, stopped <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatalf("stop did not return within %s %s", wait, what)
	}
}

// requireEntered requires the next handler call to be for data.
func requireEntered(t *testing.T, entered <-chan string, data string) {
	t.Helper()
	select {
	case got := <-entered:
		require.Equal(t, data, got, "the handler call")
	case <-time.After(wait):
		t.Fatalf("no handler call for %q within %s", data, wait)
	}
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
