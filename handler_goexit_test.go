package mq

import (
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_AWorkerHandlerThatEndsItsGoroutineIsRetriedAndThePoolGoesOn: a
// handler that calls runtime.Goexit (t.FailNow, require) used to crash the process
// ("sync: unlock of unlocked mutex"). Now its event counts as failed and comes back,
// and with Concurrency 1 the pool's one goroutine is replaced, so every other event
// of every tenant is still handled.
func TestEmbeddedNATS_AWorkerHandlerThatEndsItsGoroutineIsRetriedAndThePoolGoesOn(t *testing.T) {
	var logs syncBuffer
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	var want []string
	for _, tenant := range []TenantID{"acme", "globex"} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
		for i := range 5 {
			data := string(tenant) + "-" + string(rune('0'+i))
			require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte(data)))
			want = append(want, data)
		}
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Concurrency: 1, RetryDelay: 10 * time.Millisecond, AckWait: time.Hour})
	require.NoError(t, err)
	var mu sync.Mutex
	attempts := map[string][]int{}
	acked := map[string]bool{}
	stop, failed, err := c.Consume(func(m *Message) error {
		mu.Lock()
		attempts[string(m.Data)] = append(attempts[string(m.Data)], m.Attempt)
		first := len(attempts[string(m.Data)]) == 1
		mu.Unlock()
		if string(m.Data) == "acme-1" && first {
			runtime.Goexit()
		}
		mu.Lock()
		acked[string(m.Data)] = true
		mu.Unlock()
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) == len(want) },
		10*time.Second, 10*time.Millisecond, "handled: %v", attempts)
	mu.Lock()
	assert.Equal(t, []int{1, 2}, attempts["acme-1"], "the event that ended its goroutine came back once")
	for _, data := range want {
		assert.True(t, acked[data], data)
	}
	mu.Unlock()
	assert.Contains(t, logs.String(), "a handler ended its goroutine")
	assert.Empty(t, failed)
}

// TestEmbeddedNATS_AWorkerHandlerThatEndsItsGoroutineOnItsLastDeliveryIsParked: on the
// last delivery MaxDeliveries allows, such a call parks the event as a failure does,
// naming why.
func TestEmbeddedNATS_AWorkerHandlerThatEndsItsGoroutineOnItsLastDeliveryIsParked(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("exits")))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("after")))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{MaxDeliveries: 1})
	require.NoError(t, err)
	var after atomic.Bool
	stop, _, err := c.Consume(func(m *Message) error {
		if string(m.Data) == "exits" {
			runtime.Goexit()
		}
		after.Store(true)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, after.Load, 10*time.Second, 10*time.Millisecond, "the tenant moved on after the park")
	page, _, err := e.DeadLetters(ctx, "acme", DeadLetterQuery{})
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, "exits", string(page[0].Data))
	assert.Equal(t, DeadReasonHandlerFailed, page[0].Headers.Get(HeaderDeadReason))
	assert.Contains(t, page[0].Headers.Get(HeaderDeadError), "runtime.Goexit")
}

// TestEmbeddedNATS_AHubHandlerThatEndsItsGoroutineEndsThatHubVisibly: nats.go's
// delivery goroutine is gone with such a call, so that hub can get nothing more. It
// used to go silent while Health said all was well; now Health names it with
// ErrDeliveryEnded, and the other hubs still get every event.
func TestEmbeddedNATS_AHubHandlerThatEndsItsGoroutineEndsThatHubVisibly(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Subscribe(ctx, "exits", func(*Message) error {
		runtime.Goexit()
		return nil
	}))
	var other atomic.Int64
	require.NoError(t, e.Subscribe(ctx, "other", func(*Message) error { other.Add(1); return nil }))
	for range 10 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("x")))
	}
	require.Eventually(t, func() bool { return other.Load() == 10 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return e.Health(ctx) != nil }, 10*time.Second, 10*time.Millisecond)
	err := e.Health(ctx)
	require.ErrorIs(t, err, ErrDeliveryEnded)
	assert.True(t, strings.Contains(err.Error(), `hub "exits"`) && !strings.Contains(err.Error(), `hub "other"`), "%v", err)
	require.NoError(t, e.Close())
}
