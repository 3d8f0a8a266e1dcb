//go:build integration

package mq

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExternalNATS_StatusAsTheApplicationUserReportsTheConsumerListItMayNotRead: the
// restricted user reads the partitions, the history and the parked counts, and the
// consumer list it has no permission for is reported beside them, not as a failure.
func TestExternalNATS_StatusAsTheApplicationUserReportsTheConsumerListItMayNotRead(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte("row")))

	s, err := e.Status(ctx, StatusOptions{ListenWorkers: 100 * time.Millisecond})
	require.NoError(t, err, "what the user may read is read")
	require.Len(t, s.Partitions, shippedTopology.Partitions)
	var backlog uint64
	for _, p := range s.Partitions {
		backlog += p.Messages
	}
	assert.EqualValues(t, 1, backlog, "the published event is in the partitions' backlog")
	assert.Len(t, s.History.Sources, shippedTopology.Partitions)
	assert.Nil(t, s.Consumers)
	require.Error(t, s.ConsumersErr, "CONSUMER.LIST is not the application user's")
	assert.ErrorIs(t, s.ConsumersErr, nats.ErrPermissionViolation, "the server's refusal, not a timeout")

	// A live view refreshes: the refusal is remembered, not asked for again.
	again, err := e.Status(ctx, StatusOptions{ListenWorkers: 100 * time.Millisecond})
	require.NoError(t, err)
	assert.ErrorIs(t, again.ConsumersErr, nats.ErrPermissionViolation)
}

// TestStatus_ANegativeListenWorkersIsInvalidConfig: a negative listen window is refused
// as a negative duration is everywhere, not taken as "do not listen", on both brokers.
func TestStatus_ANegativeListenWorkersIsInvalidConfig(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	_, err := e.Status(t.Context(), StatusOptions{ListenWorkers: -time.Second})
	require.ErrorIs(t, err, ErrInvalidConfig)
	x := newExternalFixture(t).broker(t)
	_, err = x.Status(t.Context(), StatusOptions{ListenWorkers: -time.Second})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
