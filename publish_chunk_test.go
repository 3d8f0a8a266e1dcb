//go:build integration

package mq

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_UnderFsyncABatchGoesAsAtomicChunksAndAChunkThatFailsEventByEvent:
// with the default fsync per write, a batch that need not be atomic is sent as atomic
// chunks of MaxAtomicBatch (the server syncs once per chunk); a chunk refused for a
// key already stored goes again event by event, and every event is stored once, in
// order. With NoSync the batch is pipelined, no chunk.
func TestEmbeddedNATS_UnderFsyncABatchGoesAsAtomicChunksAndAChunkThatFailsEventByEvent(t *testing.T) {
	t.Parallel()
	for _, noSync := range []bool{false, true} {
		t.Run("NoSync="+strconv.FormatBool(noSync), func(t *testing.T) {
			t.Parallel()
			e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.NoSync = noSync })
			ctx := testCtx(t)
			require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
			tp := Topic{Tenant: "acme", Table: "t"}
			// Stored before: the first chunk holds its key again.
			require.NoError(t, e.Publish(ctx, tp, []byte("500"), WithIdempotencyKey("k-500")))
			const n = MaxAtomicBatch + 500
			b := Batch{Tenant: "acme"}
			for i := range n {
				b.Events = append(b.Events, BatchEvent{Table: "t", Data: []byte(strconv.Itoa(i)),
					Options: []PublishOpt{WithIdempotencyKey("k-" + strconv.Itoa(i))}})
			}
			require.NoError(t, e.PublishBatch(ctx, b))

			s, err := e.core.js.Stream(ctx, e.core.partitions[Partition("acme", e.core.topo.Partitions)])
			require.NoError(t, err)
			require.EqualValues(t, n, s.CachedInfo().State.Msgs, "each event stored once")
			var order []string
			inChunks := 0
			for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
				m, err := s.GetMsg(ctx, seq)
				require.NoError(t, err)
				order = append(order, string(m.Data))
				if m.Header.Get("Nats-Batch-Id") != "" {
					inChunks++
				}
			}
			want := []string{"500"}
			for i := range n {
				if i != 500 {
					want = append(want, strconv.Itoa(i))
				}
			}
			assert.Equal(t, want, order, "in batch order")
			if noSync {
				assert.Zero(t, inChunks, "NoSync pipelines the batch")
			} else {
				assert.Equal(t, n-MaxAtomicBatch, inChunks, "the second chunk went as one atomic batch, the first event by event")
			}
		})
	}
}

// TestEmbeddedNATS_UnderFsyncAnEventOfTheLargestSizePublishTakesIsStoredOnEveryPath:
// an event at the exact size Publish takes is near the server's limit, an atomic
// batch's headers added (Publish keeps room for a park, which holds them). Under fsync a batch that need not be atomic, and publishes grouped while they wait,
// go as atomic chunks; one holding such an event still stores every event once,
// never refused with the client's own error.
func TestEmbeddedNATS_UnderFsyncAnEventOfTheLargestSizePublishTakesIsStoredOnEveryPath(t *testing.T) {
	b := openFsync(t, "")
	ctx := testCtx(t)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 64<<20))
	tp := Topic{Tenant: "acme", Table: "t"}
	_, p, err := b.subs.ingestTopic(tp)
	require.NoError(t, err)
	largest := func(key string, fill byte) testEvent {
		room := payloadRoom(b.core, b.core.partitions[p], "acme."+key) -
			b.core.parkGrowth(Headers{HeaderIdempotencyKey: {"acme." + key}}, "acme", b.core.partitions[p])
		data := bytes.Repeat([]byte{fill}, room)
		return testEvent{topic: tp, data: data, opts: []PublishOpt{WithIdempotencyKey(key)}}
	}
	events := plainEvents(minAtomicChunk)
	events[len(events)-1] = largest("largest-b", 'B')
	batch := Batch{Tenant: "acme"}
	for _, ev := range events {
		batch.Events = append(batch.Events, BatchEvent{Table: tp.Table, Data: ev.data, Options: ev.opts})
	}
	require.NoError(t, b.PublishBatch(ctx, batch), "a batch")
	assert.Len(t, storedBatchIDs(t, b.EmbeddedNATS, "acme"), len(events), "each event of the batch stored once")
	drain(t, b.EmbeddedNATS, len(events)) // the partition holds only what is not acknowledged

	events = plainEvents(minAtomicChunk)
	for i := range events {
		events[i].data = append([]byte("grouped-"), events[i].data...)
	}
	events[len(events)-1] = largest("largest-p", 'P')
	for i, err := range publishTogether(t, b.EmbeddedNATS, "acme", events) {
		require.NoError(t, err, "grouped publish %d", i)
	}
	assert.Len(t, storedBatchIDs(t, b.EmbeddedNATS, "acme"), len(events), "each grouped event stored once")
}
