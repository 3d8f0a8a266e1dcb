package mqtest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func deliveryEndCases() []testCase {
	return []testCase{
		{
			name: "FailedOnceWhenDeliveryEnds",
			proves: "Delivery ended from outside is reported on failed exactly once, however many " +
				"delivery units it ended on, with an error wrapping ErrDeliveryEnded.",
			hooks:     []string{"EndDelivery"},
			publishes: "1 event each on acme/prime and globex/prime",
			skip:      needEndDelivery,
			run:       failedOnceWhenDeliveryEnds,
		},
		{
			name: "FailedNeverAfterStop",
			proves: "A stop by the caller is never a failure, even when delivery then ends from " +
				"outside.",
			hooks:     []string{"EndDelivery"},
			publishes: "1 event each on acme/prime and globex/prime",
			skip:      needEndDelivery,
			run:       failedNeverAfterStop,
		},
	}
}

func closeCases() []testCase {
	return []testCase{
		{
			name:      "CloseIsIdempotent",
			proves:    "Close twice returns nil twice.",
			publishes: "1 event on acme/t",
			run:       closeIsIdempotent,
		},
		{
			name: "EveryMethodAfterCloseReturnsErrClosed",
			proves: "After Close, every method that returns an error returns one wrapping " +
				"ErrClosed.",
			publishes: "1 event on acme/t; refused calls after Close",
			run:       everyMethodAfterClose,
		},
		{
			name:      "StatsAfterCloseReturnsErrClosed",
			proves:    "Stats after Close returns an error wrapping ErrClosed.",
			publishes: "nothing",
			run:       statsAfterClose,
		},
		{
			name:      "ConsumeAfterCloseReturnsErrClosed",
			proves:    "A consumer created before Close cannot start delivery after it.",
			publishes: "nothing",
			run:       consumeAfterClose,
		},
		{
			name:      "CloseStopsConsumeWithoutReportingFailed",
			proves:    "Close stops a running Consume; it reports nothing on failed.",
			publishes: "1 event each on acme/prime and globex/prime",
			run:       closeStopsConsume,
		},
		{
			name: "NoHandlerStartsAfterCloseReturns",
			proves: "Once Close returned, no Subscribe or Consume handler call begins, even with " +
				"deliveries in flight when it was called.",
			publishes: "200 events on acme/t",
			run:       noHandlerAfterClose,
		},
		{
			name: "NoRetryOrQueuedCallStartsAfterCloseReturns",
			proves: "Close while one tenant's event waits for its retry (RetryDelay 100 ms) with " +
				"events queued behind it, and another tenant's call is in flight with events " +
				"behind it: Close returns (it may or may not wait for that call, which the " +
				"case lets go soon after Close began), and once it returned no handler call " +
				"begins, neither the retry nor a queued event, and failed reports nothing.",
			publishes: "4 events each on acme/t and globex/t",
			run:       noRetryAfterClose,
		},
		{
			name: "SettlingAHeldMessageAfterCloseReturnsErrClosed",
			proves: "A message the worker delivered and the handler held unsettled (as for a " +
				"batch) cannot be settled once the broker is closed: every settle method " +
				"returns an error wrapping ErrClosed.",
			publishes: "1 event on acme/held",
			run:       settleAfterClose,
		},
	}
}

// prime publishes once per tenant and waits for both deliveries, proving that
// delivery is live on every tenant before anything ends it.
func (e *env) prime(c consumer) {
	e.t.Helper()
	e.publish(topic(Acme, "prime", ""), "acme")
	e.publish(topic(Globex, "prime", ""), "globex")
	assert.ElementsMatch(e.t, []string{"acme", "globex"}, datas(next(e.t, c.deliveries, 2)))
}

func failedOnceWhenDeliveryEnds(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.prime(c)
	h.EndDelivery(t, e.b)
	select {
	case err, ok := <-c.failed:
		require.True(t, ok, "failed was closed instead of carrying an error")
		require.Error(t, err)
		assert.ErrorIs(t, err, mq.ErrDeliveryEnded)
	case <-time.After(wait):
		t.Fatalf("failed reported nothing within %s of EndDelivery", wait)
	}
	select {
	case err, ok := <-c.failed:
		if ok {
			t.Fatalf("failed reported a second time: %v", err)
		}
	case <-time.After(quiet):
	}
}

func failedNeverAfterStop(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.prime(c)
	c.stop()
	h.EndDelivery(t, e.b)
	noFailure(t, c.failed)
}

func closeIsIdempotent(t *testing.T, h Harness) {
	e := setup(t, h)
	e.publish(topic(Acme, "t", ""), "x")
	require.NoError(t, e.b.Close(), "first Close")
	assert.NoError(t, e.b.Close(), "second Close")
	assert.NoError(t, e.b.Close(), "third Close")
}

func everyMethodAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "t", "")
	e.publish(tp, "before")
	require.NoError(t, e.b.Close())

	assert.ErrorIs(t, e.b.Publish(e.ctx, tp, []byte("after")), mq.ErrClosed, "Publish")
	assert.ErrorIs(t, e.b.Subscribe(e.ctx, "after-close", func(*mq.Message) error { return nil }), mq.ErrClosed, "Subscribe")
	_, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	assert.ErrorIs(t, err, mq.ErrClosed, "CreateConsumer")
	sent := 0
	err = e.b.ReplaySince(e.ctx, tp, time.Time{}, func(*mq.Message) bool { sent++; return true })
	assert.ErrorIs(t, err, mq.ErrClosed, "ReplaySince")
	assert.Zero(t, sent, "ReplaySince sent after Close")
	assert.ErrorIs(t, e.b.DeadLetter(e.ctx, mq.NewMessage(e.ctx, tp, []byte("parked"))), mq.ErrClosed, "DeadLetter")
	_, err = e.b.DeadLetterCounts(e.ctx, Acme, "")
	assert.ErrorIs(t, err, mq.ErrClosed, "DeadLetterCounts")
	assert.ErrorIs(t, e.b.SetMaxBytes(e.ctx, Acme, 1<<20), mq.ErrClosed, "SetMaxBytes")
	_, err = e.b.PurgeAcked(e.ctx, Durable, map[mq.TenantID]time.Time{Acme: time.Now()})
	assert.ErrorIs(t, err, mq.ErrClosed, "PurgeAcked")
}

func statsAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	_, err := e.b.Stats()
	require.NoError(t, err, "Stats before Close")
	require.NoError(t, e.b.Close())
	_, err = e.b.Stats()
	assert.ErrorIs(t, err, mq.ErrClosed, "Stats")
}

func consumeAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	require.NoError(t, err)
	require.NoError(t, e.b.Close())
	stop, _, err := c.Consume(func(*mq.Message) error { return nil }, 16)
	if stop != nil {
		t.Cleanup(stop)
	}
	assert.ErrorIs(t, err, mq.ErrClosed, "Consume after Close")
}

func closeStopsConsume(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.prime(c)
	require.NoError(t, e.b.Close())
	noFailure(t, c.failed)
}

func noHandlerAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	var closed atomic.Bool
	var late, hubCalls, workerCalls atomic.Int64
	require.NoError(t, e.b.Subscribe(e.ctx, "closing", func(*mq.Message) error {
		if closed.Load() {
			late.Add(1)
		}
		hubCalls.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	}))
	cons, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	require.NoError(t, err)
	stop, failed, err := cons.Consume(func(m *mq.Message) error {
		if closed.Load() {
			late.Add(1)
		}
		workerCalls.Add(1)
		time.Sleep(time.Millisecond)
		return nil // left unsettled on purpose: nothing acks after Close
	}, 16)
	require.NoError(t, err)
	t.Cleanup(stop)
	for i := range 200 {
		e.publish(topic(Acme, "t", ""), fmt.Sprint(i))
	}
	require.True(t, eventually(func() bool { return hubCalls.Load() > 0 && workerCalls.Load() > 0 }),
		"no handler ran before Close")
	require.NoError(t, e.b.Close())
	closed.Store(true)
	time.Sleep(quiet)
	assert.Zero(t, late.Load(), "handler calls began after Close returned")
	noFailure(t, failed)
}

func settleAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	c := e.consume(mq.ConsumerConfig{}, func(*mq.Message) error { return nil })
	e.publish(topic(Acme, "held", ""), "held")
	m := next(t, c.deliveries, 1)[0].msg
	require.NoError(t, e.b.Close())
	for _, s := range []struct {
		name   string
		settle func() error
	}{
		{"Ack", m.Ack},
		{"DoubleAck", func() error { return m.DoubleAck(e.ctx) }},
		{"Nak", m.Nak},
		{"NakWithDelay", func() error { return m.NakWithDelay(time.Second) }},
		{"InProgress", m.InProgress},
	} {
		err := s.settle()
		assert.ErrorIs(t, err, mq.ErrClosed, "%s after Close: %v", s.name, err)
	}
}

func noRetryAfterClose(t *testing.T, h Harness) {
	e := setup(t, h)
	var closed atomic.Bool
	var late, failures atomic.Int64
	inFlight, release := make(chan struct{}, 1), make(chan struct{})
	cons, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond})
	require.NoError(t, err)
	stop, failed, err := cons.Consume(func(m *mq.Message) error {
		if closed.Load() {
			late.Add(1)
		}
		switch string(m.Data) {
		case "fails":
			failures.Add(1)
			return errors.New("mqtest: fails until the broker closes")
		case "in flight":
			select {
			case inFlight <- struct{}{}:
			default:
			}
			<-release
		}
		return nil // left unsettled: nothing acks after Close
	}, 16)
	require.NoError(t, err)
	t.Cleanup(stop)
	for _, tenant := range []mq.TenantID{Acme, Globex} {
		first := "fails"
		if tenant == Globex {
			first = "in flight"
		}
		e.publish(topic(tenant, "t", ""), first)
		for i := range 3 {
			e.publish(topic(tenant, "t", ""), fmt.Sprint("queued ", i))
		}
	}
	select {
	case <-inFlight:
	case <-time.After(wait):
		t.Fatalf("globex's call never began within %s", wait)
	}
	require.True(t, eventually(func() bool { return failures.Load() > 0 }), "acme's event never failed")
	closing := make(chan error, 1)
	go func() { closing <- e.b.Close() }()
	time.Sleep(quiet / 3) // let Close begin while globex's call runs
	close(release)
	select {
	case err := <-closing:
		require.NoError(t, err)
	case <-time.After(3 * wait):
		t.Fatalf("Close did not return within %s of the call in flight returning", 3*wait)
	}
	closed.Store(true)
	time.Sleep(quiet) // three retry delays
	assert.Zero(t, late.Load(), "handler calls began after Close returned")
	noFailure(t, failed)
}
