//go:build integration

package mq

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An ack wait under keepAlive's default period of a second: the event waiting behind a
// call longer than the ack wait is extended in time from the first delivery on, not
// only after keepAlive's first tick learned the partitions' ack waits (before that, it
// came a second time while the first was still held).
func TestWorker_AnAckWaitUnderASecondIsExtendedFromTheFirstEventsOn(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenant := tenantsOn(t, e, 1)[0]
	topic := Topic{Tenant: tenant, Table: "t"}
	require.NoError(t, e.Publish(ctx, topic, []byte("slow")))
	require.NoError(t, e.Publish(ctx, topic, []byte("held")))
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: 600 * time.Millisecond})
	require.NoError(t, err)
	type call struct {
		data    string
		attempt int
	}
	var mu sync.Mutex
	var calls []call
	done := make(chan struct{})
	stop, _, err := cons.Consume(func(m *Message) error {
		if string(m.Data) == "slow" && m.Attempt == 1 {
			time.Sleep(1500 * time.Millisecond) // past the ack wait, holding "held" in its lane
		}
		mu.Lock()
		calls = append(calls, call{string(m.Data), m.Attempt})
		if string(m.Data) == "held" {
			close(done)
		}
		mu.Unlock()
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the held event never reached the handler")
	}
	// Long enough for a second delivery of either event to arrive, were one made.
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, calls)
	assert.Equal(t, call{"slow", 1}, calls[0], "the tenant's first event went first")
	var held []call
	for _, c := range calls {
		if c.data == "held" {
			held = append(held, c)
		}
	}
	assert.Equal(t, []call{{"held", 1}}, held, "the event that waited behind the slow call was delivered once: its ack wait was extended")
}
