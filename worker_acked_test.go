//go:build integration

package mq

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorker_ACopyThatWaitedBehindALongCallWhileTheHostAckedItsEventIsNotHandled: the
// handler returns a tenant's first event unsettled (the host keeps it for a batch) and
// spends longer than the ack wait on the next one. The first event's ack wait runs out,
// so its copy arrives and waits behind that call; meanwhile the host acks the event.
// The copy must not reach the handler after the tenant's later event.
func TestWorker_ACopyThatWaitedBehindALongCallWhileTheHostAckedItsEventIsNotHandled(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for _, data := range []string{"kept", "long", "last"} {
		require.NoError(t, e.Publish(ctx, topic, []byte(data)))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	var calls []string
	last := make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		mu.Lock()
		calls = append(calls, string(m.Data))
		mu.Unlock()
		switch string(m.Data) {
		case "kept":
			if m.Attempt == 1 {
				// Acked by the host after the copy came (an ack wait, 1 s) and
				// before the long call ends.
				time.AfterFunc(2500*time.Millisecond, func() { _ = m.Ack() })
				return nil
			}
		case "long":
			time.Sleep(4 * time.Second)
		case "last":
			defer close(last)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	select {
	case <-last:
	case <-ctx.Done():
		t.Fatal("the tenant's last event never came")
	}
	time.Sleep(2 * time.Second) // for a copy still to come
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"kept", "long", "last"}, calls, "an event the host acked reached the handler again after a later one")
}
