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

// TestStatus_ACtxEndedWhileListeningIsAnErrorNotASnapshotWithoutWorkers: an operator's
// Ctrl-C during the listen for heartbeats printed a table with every partition owned by
// no worker, while a worker held them all.
func TestStatus_ACtxEndedWhileListeningIsAnErrorNotASnapshotWithoutWorkers(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx, cancel := context.WithCancel(t.Context())
	// Most likely in the hour's listen, after the reads; an end during the reads,
	// on a loaded machine, is an error too.
	time.AfterFunc(time.Second, cancel)
	s, err := e.Status(ctx, StatusOptions{ListenWorkers: time.Hour})
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, s.Partitions, "no partial snapshot")
	_, err = e.Status(t.Context(), StatusOptions{ListenWorkers: 50 * time.Millisecond})
	require.NoError(t, err, "the broker still answers")
}

// TestStatus_TheHistoryShowsHowFarBackAReplayReaches: Oldest is the stored time of the
// history's oldest event (zero while it holds none) and MaxAge its limit, so an
// operator can tell a window cut short by max_bytes.
func TestStatus_TheHistoryShowsHowFarBackAReplayReaches(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	s, err := e.Status(ctx, StatusOptions{})
	require.NoError(t, err)
	assert.True(t, s.History.Oldest.IsZero(), "an empty history reaches nothing")
	assert.Equal(t, e.topo.HistoryMaxAge, s.History.MaxAge)

	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "orders"}
	before := time.Now()
	publishReplayable(t, e, topic, 1)
	var replayed []*Message
	require.NoError(t, e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		replayed = append(replayed, m)
		return true
	}))
	require.Len(t, replayed, 1)
	s, err = e.Status(ctx, StatusOptions{})
	require.NoError(t, err)
	assert.True(t, s.History.Oldest.Equal(replayed[0].Timestamp), "Oldest %v is the oldest event's Timestamp %v", s.History.Oldest, replayed[0].Timestamp)
	assert.False(t, s.History.Oldest.Before(before), "Oldest %v is before the publish", s.History.Oldest)
}
