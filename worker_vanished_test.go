//go:build integration

package mq

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A failed event its partition loses while it waits for its retry (here an operator's
// delete; on a cluster, nats-server's leader-change race can do the same: README) is
// parked from the worker's copy, as the restricted application user, rather than
// ending in nothing; the tenant's next event still runs.
func TestWorker_AFailedEventItsPartitionLostBeforeItsRetryIsParkedFromTheWorkersCopy(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	// The shipped partitions deny deletes; this operator's allow them.
	allowDeletes := func(s *shape) {
		for p := range s.topo.Partitions {
			s.stream(t, s.topo.PartitionStream(p)).DenyDelete = false
		}
	}
	ef := &externalFixture{natsFixture: f, shape: f.applyShipped(t, 1, withMatrixAckWait(t), allowDeletes)}
	e := ef.broker(t, func(c *NATSConfig) { c.AckWait = matrixAckWait })
	ctx := t.Context()
	topic := Topic{Tenant: "acme", Table: "vanished"}
	failed := make(chan *Message, 1)
	next := make(chan *Message, 1)
	startConsume(t, e, ConsumerConfig{MaxDeliveries: 5, RetryDelay: time.Hour}, func(m *Message) error {
		if string(m.Data) == "fails" {
			select {
			case failed <- m:
			default:
			}
			return assert.AnError
		}
		next <- m
		return m.Ack()
	})
	require.NoError(t, e.Publish(ctx, topic, []byte("fails")))
	var m *Message
	select {
	case m = <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the event never reached the handler")
	}
	require.NoError(t, e.Publish(ctx, topic, []byte("next")))
	_, part, err := e.core.subs.ingestTopic(topic)
	require.NoError(t, err)
	stream, err := f.admin.Stream(ctx, e.topo.PartitionStream(part))
	require.NoError(t, err)
	require.NoError(t, stream.DeleteMsg(ctx, m.Sequence), "the operator's delete of the failed event")

	// The wait for the retry is the retry delay (capped by the ack wait), the ack wait
	// and the publish timeout: about 9 s here.
	select {
	case got := <-next:
		assert.Equal(t, "next", string(got.Data))
	case <-time.After(45 * time.Second):
		t.Fatal("the tenant's next event never ran")
	}
	var parked *Message
	require.Eventually(t, func() bool {
		counts, err := e.DeadLetterCounts(ctx, topic.Tenant, topic.Table)
		if err != nil || counts.Total == 0 {
			return false
		}
		list, _, err := e.DeadLetters(ctx, topic.Tenant, DeadLetterQuery{Table: topic.Table})
		if err != nil || len(list) == 0 {
			return false
		}
		parked = list[0]
		return true
	}, 30*time.Second, 50*time.Millisecond, "the vanished event was never parked")
	assert.Equal(t, "fails", string(parked.Data), "parked from the worker's copy")
	assert.Equal(t, DeadReasonVanished, parked.Headers.Get(HeaderDeadReason))
	assert.Equal(t, strconv.FormatUint(m.Sequence, 10), parked.Headers.Get(HeaderDeadSequence))
	assert.Equal(t, strconv.Itoa(part), parked.Headers.Get(HeaderDeadPartition))
	assert.Equal(t, assert.AnError.Error(), parked.Headers.Get(HeaderDeadError), "the handler's last error")
	counts, err := e.DeadLetterCounts(ctx, topic.Tenant, topic.Table)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), counts.Total, "parked once")
}
