package mqtest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// The poison policy: a failed event comes back after RetryDelay, holding only its
// tenant; after MaxDeliveries it is parked with why; a Nak holds but never parks.

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

func aFailingEventIsParked(t *testing.T, h Harness) {
	long := strings.Repeat("x", 2048)
	parkedAfterMaxDeliveries(t, h, func(m *mq.Message) error {
		return fmt.Errorf("mqtest: cannot write row, attempt %d:\r\nconstraint violated %s", m.Attempt, long)
	}, func(t *testing.T, lastErr string) {
		assert.True(t, strings.HasPrefix(lastErr, "mqtest: cannot write row, attempt 3:"), "the last error: %.80q", lastErr)
		assert.Contains(t, lastErr, "constraint violated", "the last error, past its line break")
	})
}

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
		cfg.AckWait = ackWait // a parked event left unacked would come back
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
	require.Equal(t, []string{"naked", "naked", "naked", "naked", "after"}, datas(got),
		"the nak'ed event again and again past MaxDeliveries, then the tenant's next")
	assert.Equal(t, upTo(naks+1), attempts(got[:naks+1]), "the nak'ed event's attempts")
	assertOneAtATime(t, got, "acme")
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme: a nak is not a failure and never parks")
}
