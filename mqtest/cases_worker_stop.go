package mqtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// The graceful stop: it waits for the calls in flight and hands back what waited.

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
		noneBecause(t, second.deliveries, quiet, "Caps.HandsBackOnStop is false: the held events wait for their hour")
		return
	}
	got := nextBecause(t, second.deliveries, 5, "Caps.HandsBackOnStop is true: stop hands back what waited")
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
