package mqtest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// aFailedEventHoldsOnlyItsTenant: a failed event is delivered again, its Attempt one
// higher each time, and never while its previous call runs; its tenant's later events
// begin only once it was handled; the other tenants, published after it first failed,
// are handled meanwhile (it fails until they all were, so a broker that held them
// behind it never gets there). Eight tenants, so on a broker with a few delivery units
// some share acme's. With Caps.RetryPolicy each retry begins no sooner than RetryDelay
// after the failed call returned, doubling up to MaxRetryDelay, and under a negative
// MaxDeliveries nothing is parked, even past the default of 10 deliveries.
func aFailedEventHoldsOnlyItsTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	others := e.manyTenants(6)[1:]
	const delay, maxDelay = 20 * time.Millisecond, 40 * time.Millisecond
	const failures = 11      // one past the default MaxDeliveries
	var handled atomic.Int64 // calls for the other tenants
	var calls counter
	failed := make(chan struct{})
	handle, done := e.recorded(func(m *mq.Message) error {
		if m.Topic().Tenant != Acme {
			defer handled.Add(1)
			return e.ackEach(m)
		}
		if string(m.Data) != "poison" {
			return e.ackEach(m)
		}
		n := calls.inc("poison")
		if n == 1 {
			close(failed)
		}
		if n < failures || handled.Load() < int64(len(others)) {
			return fmt.Errorf("mqtest: failure %d of the poison event", n)
		}
		return e.ackEach(m)
	})
	e.consume(mq.ConsumerConfig{RetryDelay: delay, MaxRetryDelay: maxDelay, MaxDeliveries: -1}, handle)
	tp := topic(Acme, "t", "")
	for _, data := range []string{"poison", "after-1", "after-2"} {
		e.publish(tp, data)
	}
	select {
	case <-failed:
	case <-time.After(wait):
		t.Fatalf("the poison event reached no handler within %s", wait)
	}
	for _, id := range others {
		e.publish(topic(id, "t", ""), "other")
	}
	got := nextUntil(t, done, "acme's last event and every other tenant's", func(got []delivery) bool {
		byT := byTenant(got)
		for _, id := range others {
			if len(byT[id]) == 0 {
				return false
			}
		}
		return slices.Contains(byT[Acme], "after-2")
	})
	acme := callsOf(Acme, got)
	require.GreaterOrEqual(t, len(acme), failures+2, "acme's calls: %q", datas(acme))
	poison, later := acme[:len(acme)-2], acme[len(acme)-2:]
	assert.Equal(t, []string{"after-1", "after-2"}, datas(later), "acme's later events, after every call of the failed one")
	assert.Equal(t, slices.Repeat([]string{"poison"}, len(poison)), datas(poison), "the failed event, until it succeeded")
	assert.Equal(t, upTo(len(poison)), attempts(poison), "the failed event's attempts")
	assertOneAtATime(t, acme, "acme")
	for _, id := range others {
		assert.Equal(t, []string{"other"}, byTenant(got)[id], "tenant %s, while acme was held", id)
	}
	if !h.Caps.RetryPolicy {
		return
	}
	for i := 1; i < len(poison); i++ {
		want := min(delay<<(i-1), maxDelay)
		assert.GreaterOrEqual(t, poison[i].start.Sub(poison[i-1].end), want,
			"Caps.RetryPolicy: attempt %d began sooner than its retry delay after attempt %d failed", i+1, i)
	}
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme: Caps.RetryPolicy, a negative MaxDeliveries parks nothing")
}

// aFailingEventIsParked: an event whose handler returns an error on every delivery is
// parked on the failure of its MaxDeliveries-th; see parkedAfterMaxDeliveries. The
// parked error is the last one, on one line, cut to 1 KiB.
func aFailingEventIsParked(t *testing.T, h Harness) {
	long := strings.Repeat("x", 2048)
	parkedAfterMaxDeliveries(t, h, func(m *mq.Message) error {
		return fmt.Errorf("mqtest: cannot write row, attempt %d:\r\nconstraint violated %s", m.Attempt, long)
	}, func(t *testing.T, lastErr string) {
		assert.True(t, strings.HasPrefix(lastErr, "mqtest: cannot write row, attempt 3:"), "the last error: %.80q", lastErr)
		assert.Contains(t, lastErr, "constraint violated", "the last error, past its line break")
	})
}

// aPanickingEventIsParked: a handler that panics on every delivery of an event is a
// failure as an error is: retried, then parked with an error that says the panic's
// value; see parkedAfterMaxDeliveries.
func aPanickingEventIsParked(t *testing.T, h Harness) {
	parkedAfterMaxDeliveries(t, h, func(m *mq.Message) error {
		panic(fmt.Sprintf("mqtest: a handler that panics, attempt %d", m.Attempt))
	}, func(t *testing.T, lastErr string) {
		assert.Contains(t, lastErr, "mqtest: a handler that panics, attempt 3", "the last panic")
	})
}

// parkedAfterMaxDeliveries runs a poison event (with a header of its own) that fail
// fails on every delivery, and a later event of its tenant, under MaxDeliveries 3.
// With Caps.RetryPolicy, the event is handled three times (attempts 1 to 3), then
// parked, once, under its own topic with its data and headers and the mq.HeaderDead*
// ones (read back through Harness.DeadLetters when there is one); it is acked: never
// delivered again, not even to a new Consume; and its tenant's next event follows it.
// lastErr checks the parked error. Without the flag it is handed to the handler a
// fourth time and nothing is parked.
func parkedAfterMaxDeliveries(t *testing.T, h Harness, fail mq.Handler, lastErr func(t *testing.T, got string)) {
	e := setup(t, h)
	const maxDeliveries = 3
	cfg := mq.ConsumerConfig{MaxDeliveries: maxDeliveries, RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond}
	watch := quiet
	if h.Caps.AckWaitRedelivers {
		cfg.AckWait = 200 * time.Millisecond // a parked event left unacked would come back
		watch = 3 * quiet
	}
	handle, done := e.recorded(func(m *mq.Message) error {
		if string(m.Data) == "poison" {
			return fail(m)
		}
		return e.ackEach(m)
	})
	c := e.consume(cfg, handle)
	tp := topic(Acme, "rows", "s")
	published := time.Now()
	e.publish(tp, "poison", mq.WithHeader("X-Orig", "v1"))
	e.publish(tp, "after")
	got := callsOf(Acme, nextUntil(t, done, "acme's event after the poison one, or a delivery past MaxDeliveries", func(got []delivery) bool {
		return slices.Contains(datas(got), "after") || count(datas(got), "poison") > maxDeliveries
	}))
	if !h.Caps.RetryPolicy {
		assert.Greater(t, count(datas(got), "poison"), maxDeliveries,
			"Caps.RetryPolicy is false, yet the failing event stopped coming back after MaxDeliveries: %q", datas(got))
		assertCounts(t, nil, 0, e.counts(Acme, ""), "acme: Caps.RetryPolicy is false, yet the failing event was parked")
		return
	}
	require.Equal(t, []string{"poison", "poison", "poison", "after"}, datas(got),
		"Caps.RetryPolicy: MaxDeliveries failed deliveries, then the tenant's next event")
	assert.Equal(t, upTo(maxDeliveries), attempts(got[:maxDeliveries]), "the poison event's attempts")
	assertOneAtATime(t, got, "acme")
	noneFor(t, done, watch)
	assertCounts(t, map[string]uint64{"rows": 1}, 1, e.counts(Acme, ""), "acme: parked once, under its table")
	c.stop()
	again := e.consume(cfg, e.ackEach)
	e.publish(tp, "fence")
	assert.Equal(t, "fence", next(t, again.deliveries, 1)[0].data, "the parked event came back to a new Consume")

	if h.DeadLetters == nil {
		t.Log("Harness.DeadLetters is nil: parked contents not checked")
		return
	}
	parked := h.DeadLetters(t, e.b, Acme)
	require.Len(t, parked, 1, "acme's parked events")
	p := parked[0]
	assert.Equal(t, "poison", string(p.Data))
	assert.Equal(t, tp, p.Topic(), "parked under its own topic")
	assert.Equal(t, []string{"v1"}, p.Headers["X-Orig"], "the event's own header")
	hd := p.Headers
	assert.Equal(t, mq.DeadReasonHandlerFailed, hd.Get(mq.HeaderDeadReason), mq.HeaderDeadReason)
	assert.Equal(t, strconv.Itoa(maxDeliveries), hd.Get(mq.HeaderDeadAttempts), mq.HeaderDeadAttempts)
	why := hd.Get(mq.HeaderDeadError)
	assert.NotContains(t, why, "\n", "%s is one line", mq.HeaderDeadError)
	assert.NotContains(t, why, "\r", "%s is one line", mq.HeaderDeadError)
	assert.LessOrEqual(t, len(why), 1024, "%s is cut to 1 KiB", mq.HeaderDeadError)
	lastErr(t, why)
	unit, err := strconv.Atoi(hd.Get(mq.HeaderDeadPartition))
	assert.NoError(t, err, "%s is a decimal", mq.HeaderDeadPartition)
	assert.GreaterOrEqual(t, unit, 0, mq.HeaderDeadPartition)
	seq, err := strconv.ParseUint(hd.Get(mq.HeaderDeadSequence), 10, 64)
	assert.NoError(t, err, "%s is a decimal", mq.HeaderDeadSequence)
	if s := got[0].msg.Sequence; s != 0 {
		assert.Equal(t, s, seq, "%s is the sequence the event was delivered at", mq.HeaderDeadSequence)
	}
	first := parkedTime(t, hd, mq.HeaderDeadFirstAttempt)
	last := parkedTime(t, hd, mq.HeaderDeadLastAttempt)
	// The worker stamps an attempt between its delivery and its handler call.
	assert.False(t, first.Before(published) || first.After(got[0].start),
		"%s %s is not between the publish %s and the first call %s", mq.HeaderDeadFirstAttempt, first, published, got[0].start)
	assert.False(t, last.Before(got[1].end) || last.After(got[2].start),
		"%s %s is not between the second call's end %s and the third call %s", mq.HeaderDeadLastAttempt, last, got[1].end, got[2].start)
}

// parkedTime parses a parked time header: RFC 3339 with nanoseconds, in UTC.
func parkedTime(t *testing.T, hd mq.Headers, key string) time.Time {
	t.Helper()
	v := hd.Get(key)
	at, err := time.Parse(time.RFC3339Nano, v)
	assert.NoError(t, err, "%s %q is RFC 3339", key, v)
	assert.True(t, strings.HasSuffix(v, "Z"), "%s %q is in UTC", key, v)
	return at
}

// differentTenantsRunAtOnce: with Caps.ConcurrentTenants and Concurrency 3, three
// calls of different tenants are in flight together (each waits until the case lets
// them go) and a fourth does not begin meanwhile; without it, one call is. Eight
// tenants with three events each, so on a broker with a few delivery units some share
// one. Either way no tenant has two calls at once and each keeps its order.
func differentTenantsRunAtOnce(t *testing.T, h Harness) {
	e := setup(t, h)
	tenants := e.manyTenants(6)
	const concurrency, per = 3, 3
	var mu sync.Mutex
	inFlight := map[mq.TenantID]int{}
	running, peak, twice := 0, 0, 0
	release := make(chan struct{})
	letGo := sync.OnceFunc(func() { close(release) })
	defer letGo()
	c := e.consume(mq.ConsumerConfig{Concurrency: concurrency}, func(m *mq.Message) error {
		tenant := m.Topic().Tenant
		mu.Lock()
		if inFlight[tenant] > 0 {
			twice++
		}
		inFlight[tenant]++
		running++
		peak = max(peak, running)
		mu.Unlock()
		select {
		case <-release:
		case <-e.ctx.Done():
		}
		mu.Lock()
		inFlight[tenant]--
		running--
		mu.Unlock()
		return e.ackEach(m)
	})
	for i := range per {
		for _, id := range tenants {
			e.publish(topic(id, "t", ""), fmt.Sprint(i))
		}
	}
	want := 1
	if h.Caps.ConcurrentTenants {
		want = concurrency
	}
	peakIs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
	assert.True(t, eventually(func() bool { return peakIs() >= want }),
		"%d calls in flight at once, want %d (Caps.ConcurrentTenants %v)", peakIs(), want, h.Caps.ConcurrentTenants)
	time.Sleep(quiet) // for a call beyond the first want to begin
	assert.Equal(t, want, peakIs(), "calls in flight at once (Caps.ConcurrentTenants %v, Concurrency %d)",
		h.Caps.ConcurrentTenants, concurrency)
	letGo()
	got := byTenant(next(t, c.deliveries, per*len(tenants)))
	for _, id := range tenants {
		assert.Equal(t, seq("", per), got[id], "tenant %s's order", id)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, twice, "calls that began while their tenant had one in flight")
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

// stopHandsBackWhatWaited: two tenants are held by the worker, each with an event
// behind the held one: acme's first event failed under an hour's RetryDelay (without
// Caps.RetryPolicy its handler nak'ed it with an hour's delay instead), globex's first
// the handler nak'ed with an hour's delay; meanwhile a third tenant goes on, and the
// host keeps one of its events, returned unsettled, for a batch. After stop the host
// still acks the kept event. With Caps.HandsBackOnStop, a new Consume then gets both
// held tenants' events at once (long before the hour, or the ack wait), each tenant in
// order, the held event first and delivered again; without it, none of them within the
// quiet window. Either way it never gets the kept event.
func stopHandsBackWhatWaited(t *testing.T, h Harness) {
	e := setup(t, h)
	third := e.manyTenants(1)[2]
	cfg := mq.ConsumerConfig{RetryDelay: time.Hour, MaxRetryDelay: time.Hour}
	kept := make(chan *mq.Message, 1)
	nakHour := func(m *mq.Message) error {
		if err := m.NakWithDelay(time.Hour); err != nil {
			e.errorf("nak with delay: %v", err)
		}
		return nil
	}
	first := e.consume(cfg, func(m *mq.Message) error {
		switch string(m.Data) {
		case "failed":
			if h.Caps.RetryPolicy {
				return fmt.Errorf("mqtest: a failure retried in an hour")
			}
			return nakHour(m)
		case "nak'ed":
			return nakHour(m)
		case "kept":
			kept <- m
			return nil
		}
		return e.ackEach(m)
	})
	acme, globex := topic(Acme, "t", ""), topic(Globex, "t", "")
	e.publish(acme, "failed")
	e.publish(acme, "after-1")
	e.publish(acme, "after-2")
	e.publish(globex, "nak'ed")
	e.publish(globex, "after")
	e.publish(topic(third, "t", ""), "kept")
	e.publish(topic(third, "t", ""), "goes on")
	assert.ElementsMatch(t, []string{"failed", "nak'ed", "kept", "goes on"}, datas(next(t, first.deliveries, 4)),
		"the first event of each tenant, and the third tenant's next: returning unsettled holds nothing")
	none(t, first.deliveries) // the held events wait for the hour, their tenants behind them
	first.stop()
	require.NoError(t, (<-kept).DoubleAck(e.ctx), "the host acks, after stop, the event its handler returned unsettled")

	second := e.consume(cfg, e.ackEach)
	if !h.Caps.HandsBackOnStop {
		none(t, second.deliveries)
		return
	}
	got := next(t, second.deliveries, 5)
	byT := byTenant(got)
	assert.Equal(t, []string{"failed", "after-1", "after-2"}, byT[Acme], "Caps.HandsBackOnStop: acme, at once, in order")
	assert.Equal(t, []string{"nak'ed", "after"}, byT[Globex], "Caps.HandsBackOnStop: globex, at once, in order")
	for _, d := range got {
		if d.data == "failed" || d.data == "nak'ed" {
			assert.GreaterOrEqual(t, d.msg.Attempt, 2, "%q is delivered again", d.data)
		}
	}
	none(t, second.deliveries) // nor the kept event, acked after stop
}

// twoConsumesShareTheDurable: with Caps.SharedConsumers, two Consumes of one durable
// share its events: rounds of three events for each of eight tenants go on until both
// were handed some; then one stops with a round just published (part of its share
// still waiting), and a last round follows. Every event is handled; no call of the
// stopped one begins after its stop returned; a tenant's calls, across both, never
// overlap and never go back to an earlier event. Without the flag, a second Consume
// while the first runs is refused.
func twoConsumesShareTheDurable(t *testing.T, h Harness) {
	e := setup(t, h)
	if !h.Caps.SharedConsumers {
		e.consume(mq.ConsumerConfig{}, e.ackEach)
		c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
		if err == nil {
			var stop func()
			stop, _, err = c.Consume(e.ackEach, 16)
			if stop != nil {
				t.Cleanup(stop)
			}
		}
		assert.Error(t, err, "Caps.SharedConsumers is false, yet a second Consume of a running durable started")
		return
	}
	tenants := e.manyTenants(6)
	handleA, callsA := e.recorded(e.ackEach)
	handleB, callsB := e.recorded(e.ackEach)
	a := e.consume(mq.ConsumerConfig{}, handleA)
	e.consume(mq.ConsumerConfig{}, handleB)

	const per = 3
	rounds := 0
	publishRound := func() {
		for i := range per {
			for _, id := range tenants {
				e.publish(topic(id, "t", ""), strconv.Itoa(rounds*per+i))
			}
		}
		rounds++
	}
	byWorker := map[string][]delivery{}
	handled := map[string]bool{} // tenant/data
	drain := func(what string) {
		t.Helper()
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for len(handled) < rounds*per*len(tenants) {
			var d delivery
			var worker string
			select {
			case d = <-callsA:
				worker = "A"
			case d = <-callsB:
				worker = "B"
			case <-timer.C:
				t.Fatalf("%s: %d of %d events handled, then nothing for %s", what, len(handled), rounds*per*len(tenants), wait)
			}
			byWorker[worker] = append(byWorker[worker], d)
			handled[string(d.topic.Tenant)+"/"+d.data] = true
			timer.Reset(wait)
		}
	}
	deadline := time.Now().Add(wait)
	for len(byWorker["A"]) == 0 || len(byWorker["B"]) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds only one Consume was handed events: %d and %d calls", rounds, len(byWorker["A"]), len(byWorker["B"]))
		}
		publishRound()
		drain("a round with both running")
	}
	publishRound()
	a.stop()
	stopped := time.Now()
	publishRound()
	drain("the rounds around the stop")

	var all []delivery
	for _, d := range byWorker["A"] {
		assert.False(t, d.start.After(stopped), "a call for %s %q began after its Consume's stop returned", d.topic.Tenant, d.data)
		all = append(all, d)
	}
	all = append(all, byWorker["B"]...)
	for _, id := range tenants {
		calls := callsOf(id, all)
		assertOneAtATime(t, calls, string(id))
		for i := 1; i < len(calls); i++ {
			prev, _ := strconv.Atoi(calls[i-1].data)
			cur, _ := strconv.Atoi(calls[i].data)
			assert.GreaterOrEqual(t, cur, prev, "tenant %s: event %d after event %d", id, cur, prev)
		}
	}
	if extra := len(all) - len(handled); extra > 0 {
		t.Logf("%d events, %d handled again", len(handled), extra)
	}
	if t.Failed() {
		worker := map[*mq.Message]string{}
		for w, ds := range byWorker {
			for _, d := range ds {
				worker[d.msg] = w
			}
		}
		for _, id := range tenants {
			for _, d := range callsOf(id, all) {
				t.Logf("%s %s at %s, attempt %d, %s to %s", id, d.data, worker[d.msg], d.msg.Attempt,
					d.start.Format(time.StampMicro), d.end.Format(time.StampMicro))
			}
		}
	}
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
