//go:build integration

package mq

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExternalNATS_AServerDownLongerThanARetrysWaitStillGetsTheRetriedEventFirst: a
// tenant's first event fails and its lane waits for it to come back, at most its retry
// delay, an ack wait and PublishTimeout (4 s here). The server is then down for 8 s.
// Nothing could come back meanwhile, so the wait must not run out: once the server is
// back, the failed event is the tenant's next call.
func TestExternalNATS_AServerDownLongerThanARetrysWaitStillGetsTheRetriedEventFirst(t *testing.T) {
	f := newValuesFixture(t)
	ef := &externalFixture{natsFixture: f, shape: f.applyShipped(t, 1, withMatrixAckWait(t))}
	e := ef.broker(t, func(c *NATSConfig) {
		c.AckWait = matrixAckWait
		c.PublishTimeout = time.Second
	})
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, e.SetMaxBytes(ctx, topic.Tenant, 1<<20))
	for i := range 5 {
		require.NoError(t, e.Publish(ctx, topic, []byte(strconv.Itoa(i))))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: matrixAckWait, RetryDelay: time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	var calls []string
	failed, last := make(chan struct{}), make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		mu.Lock()
		calls = append(calls, string(m.Data)+"@"+strconv.Itoa(m.Attempt))
		mu.Unlock()
		switch {
		case string(m.Data) == "0" && m.Attempt == 1:
			defer time.AfterFunc(200*time.Millisecond, func() { close(failed) }) // after its nak
			return errors.New("fails once")
		case string(m.Data) == "4":
			defer close(last)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	<-failed
	f.stop(t)
	time.Sleep(8 * time.Second)
	f.restart(t)
	select {
	case <-last:
	case <-time.After(time.Minute):
		t.Fatal("the tenant's last event did not come within a minute of the restart")
	}
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(calls), 2)
	assert.True(t, strings.HasPrefix(calls[1], "0@"), "after its first event failed the tenant's next call must be that event again; calls: %v", calls)
}
