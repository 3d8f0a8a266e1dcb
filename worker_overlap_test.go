//go:build integration

package mq

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_TwoWorkersClaimingOnePartitionAfterARestartGoOnOnceTheServedOneStops:
// the broker restarts with events of two tenants pending, and two workers both claim
// their partition at once. The server serves one; it runs the pending events and acks
// them, then stops. The other, served from then on, must not wait for the events it
// took as pending at its take, which its peer settled meanwhile: the tenants' new
// events run at once, not an ack wait later.
func TestEmbeddedNATS_TwoWorkersClaimingOnePartitionAfterARestartGoOnOnceTheServedOneStops(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	tenants := tenantsOn(t, e, 2)
	topic := func(i int) Topic { return Topic{Tenant: tenants[i%2], Table: "t"} }
	for i := range 4 {
		require.NoError(t, e.Publish(ctx, topic(i), fmt.Appendf(nil, "old:%d", i)))
	}
	// Held by the host, unsettled, when the broker closes: pending at the next open.
	c, err := e.CreateConsumer(ctx, ConsumerConfig{})
	require.NoError(t, err)
	var held arrivals
	stop, _, err := c.Consume(func(m *Message) error { held.add(string(m.Data)); return nil }, 0)
	require.NoError(t, err)
	held.await(t, 4)
	stop()
	time.Sleep(idleBeforeRestart)
	require.NoError(t, e.Close())

	e = openEmbedded(t, dir)
	_, p, err := e.core.subs.ingestTopic(topic(0))
	require.NoError(t, err)
	// The ack wait far beyond the bound below: a worker that waited for it fails.
	cfg := ConsumerConfig{Partitions: []int{p}, AckWait: time.Minute}
	bothTook := make(chan struct{})
	type worker struct {
		calls arrivals
		stop  func()
	}
	workers := make([]*worker, 2)
	for i := range workers {
		w := &worker{}
		c, err := e.CreateConsumer(ctx, cfg)
		require.NoError(t, err)
		w.stop, _, err = c.Consume(func(m *Message) error {
			<-bothTook // acked only once both took the partition with the events pending
			w.calls.add(string(m.Data))
			return m.Ack()
		}, 0)
		require.NoError(t, err)
		workers[i] = w
	}
	close(bothTook)

	// The served worker runs every old event; the other gets nothing meanwhile.
	var served, other *worker
	require.Eventually(t, func() bool {
		for i, w := range workers {
			w.calls.mu.Lock()
			n := len(w.calls.got)
			w.calls.mu.Unlock()
			if n >= 4 {
				served, other = w, workers[1-i]
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "no worker ran the four pending events")
	served.stop()
	defer other.stop()

	for i := range 2 {
		require.NoError(t, e.Publish(ctx, topic(i), fmt.Appendf(nil, "new:%d", i)))
	}
	// A quarter of the ack wait.
	require.Eventually(t, func() bool {
		other.calls.mu.Lock()
		defer other.calls.mu.Unlock()
		return slices.Contains(other.calls.got, "new:0") && slices.Contains(other.calls.got, "new:1")
	}, 15*time.Second, 10*time.Millisecond, "the remaining worker did not run its tenants' new events")
}
