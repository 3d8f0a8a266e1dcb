//go:build integration

package mq

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// fillBatchSlots opens the server's default limit of atomic batches (50 a stream) on
// topic's partition, each its first event and no commit, as senders that gave up
// mid-batch leave them: the server keeps them until its batch timeout.
func fillBatchSlots(t *testing.T, c *natsCore, topic Topic) {
	t.Helper()
	subject, _, err := c.subs.ingestTopic(topic)
	require.NoError(t, err)
	for i := range 50 {
		msg := nats.NewMsg(subject)
		msg.Header.Set(jetstreamext.BatchIDHeader, nuid.Next())
		msg.Header.Set(jetstreamext.BatchSeqHeader, "1")
		require.NoError(t, c.nc.PublishMsg(msg), "open batch %d", i)
	}
	require.NoError(t, c.nc.Flush())
}

// TestPublishBatch_AnAtomicBatchRefusedForTooManyOpenBatchesIsErrUnavailable: the
// server refuses a new atomic batch while a partition holds its limit of open ones
// (429, "atomic publish too many inflight"), a transient state that wrapped no
// sentinel, so a host could not tell it should retry.
func TestPublishBatch_AnAtomicBatchRefusedForTooManyOpenBatchesIsErrUnavailable(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	fillBatchSlots(t, e.core, Topic{Tenant: "acme", Table: "t"})
	err := e.PublishBatch(ctx, Batch{Tenant: "acme", Atomic: true, Events: []BatchEvent{{Table: "t", Data: []byte("x")}}})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrUnavailable, "the server's refusal: %v", err)
	assert.Contains(t, err.Error(), strconv.Itoa(jsErrAtomicTooManyInflight))
}

// TestEmbeddedNATS_UnderFsyncABatchWhileThePartitionHasNoBatchSlotIsStoredEventByEvent:
// a batch that need not be atomic goes as atomic chunks under fsync; a chunk the
// server refuses for its open batches goes again one by one, which takes no slot,
// rather than failing as the atomic batch's ErrUnavailable does.
func TestEmbeddedNATS_UnderFsyncABatchWhileThePartitionHasNoBatchSlotIsStoredEventByEvent(t *testing.T) {
	b := openFsync(t, "")
	ctx := testCtx(t)
	fillBatchSlots(t, b.core, Topic{Tenant: "acme", Table: "t"})
	batch := Batch{Tenant: "acme"}
	for i := range minAtomicChunk {
		batch.Events = append(batch.Events, BatchEvent{Table: "t", Data: fmt.Appendf(nil, "e%d", i)})
	}
	require.NoError(t, b.PublishBatch(ctx, batch))
	assert.Len(t, drain(t, b.EmbeddedNATS, minAtomicChunk), minAtomicChunk)
}
