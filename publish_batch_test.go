//go:build integration

package mq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// batchOf is n events of one table, "<prefix>-<i>" each, keyed by that when keyed.
func batchOf(tenant TenantID, atomic, keyed bool, prefix string, n int) Batch {
	b := Batch{Tenant: tenant, Atomic: atomic}
	for i := range n {
		data := fmt.Sprintf("%s-%d", prefix, i)
		e := BatchEvent{Table: "t", Scope: fmt.Sprintf("s%d", i%3), Data: []byte(data), Options: []PublishOpt{WithHeader("X-Row", data)}}
		if keyed {
			e.Options = append(e.Options, WithIdempotencyKey(data))
		}
		b.Events = append(b.Events, e)
	}
	return b
}

// partitionMsgs counts what tenant's partition holds.
func partitionMsgs(t *testing.T, js jetstream.JetStream, core *natsCore, tenant TenantID) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, core.partitions[Partition(tenant, core.topo.Partitions)])
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

// receiveAll takes n deliveries and returns their payloads in delivery order.
func receiveAll(t *testing.T, got <-chan *Message, failed <-chan error, n int) []string {
	t.Helper()
	var out []string
	for range n {
		m := receive(t, got, failed)
		assert.Equal(t, string(m.Data), m.Headers.Get("X-Row"), "the event's own headers arrive")
		out = append(out, string(m.Data))
	}
	return out
}

func payloads(b Batch) []string {
	var out []string
	for _, e := range b.Events {
		out = append(out, string(e.Data))
	}
	return out
}

func batchForms(t *testing.T, run func(t *testing.T, atomic bool)) {
	for _, atomic := range []bool{false, true} {
		t.Run(map[bool]string{false: "pipelined", true: "atomic"}[atomic], func(t *testing.T) { run(t, atomic) })
	}
}

func TestEmbeddedNATS_PublishBatchStoresEveryEventOnceInBatchOrder(t *testing.T) {
	batchForms(t, func(t *testing.T, atomic bool) {
		e := openEmbedded(t, "")
		ctx := testCtx(t)
		require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
		b := batchOf("acme", atomic, false, "row", 200)
		require.NoError(t, e.PublishBatch(ctx, b))
		assert.Equal(t, uint64(200), partitionMsgs(t, e.js, e.core, "acme"))
		got, failed := consumeAll(t, e)
		assert.Equal(t, payloads(b), receiveAll(t, got, failed, 200), "the tenant's events in batch order")
		assert.Eventually(t, func() bool {
			_, used := e.budgets.snapshot()
			return used["acme"] == 0
		}, 10*time.Second, 20*time.Millisecond, "each acked event gives its bytes back")
	})
}

// TestEmbeddedNATS_APublishBatchThatPanicsAfterReservingHoldsNothing is
// TestEmbeddedNATS_APublishThatPanicsAfterReservingHoldsNothing for a batch, in both
// forms and both sync settings: under fsync a batch that need not be atomic goes as
// atomic chunks, from minAtomicChunk events on. The ctx's Done is first called once
// the batch is reserved, as it is sent or its answers awaited. A pipelined batch may
// be stored before the panic: as for any publish whose outcome is unknown, its bytes
// are given back, and a reopen counts what was stored.
func TestEmbeddedNATS_APublishBatchThatPanicsAfterReservingHoldsNothing(t *testing.T) {
	for _, noSync := range []bool{true, false} {
		t.Run(map[bool]string{true: "NoSync", false: "fsync"}[noSync], func(t *testing.T) {
			batchForms(t, func(t *testing.T, atomic bool) {
				b := openMetered(t, "", func(o *EmbeddedOptions) { o.NoSync = noSync })
				ctx := testCtx(t)
				topic := Topic{Tenant: "acme", Table: "t"}
				data := []byte("payload")
				size := oneEventBytes(t, b, topic, data)
				batch := Batch{Tenant: topic.Tenant, Atomic: atomic,
					Events: slices.Repeat([]BatchEvent{{Table: topic.Table, Data: data}}, minAtomicChunk)}
				require.NoError(t, b.SetMaxBytes(ctx, "acme", size*minAtomicChunk))
				require.PanicsWithValue(t, "mq test: Done called", func() { _ = b.PublishBatch(panicOnDone{ctx}, batch) })
				assert.Zero(t, b.backlog(t, "acme"), "the panicked batch holds nothing")
				require.NoError(t, b.PublishBatch(ctx, batch), "the whole budget is free")
			})
		})
	}
}

func TestEmbeddedNATS_ABatchOverTheTenantsBudgetIsRefusedWholeAndStoresNothing(t *testing.T) {
	batchForms(t, func(t *testing.T, atomic bool) {
		e := openEmbedded(t, "")
		ctx := testCtx(t)
		b := batchOf("acme", atomic, false, "row", 50)
		size := int64(0)
		for _, ev := range b.Events {
			size += int64(len(ev.Data))
		}
		require.NoError(t, e.SetMaxBytes(ctx, "acme", size)) // the payloads alone fill it
		err := e.PublishBatch(ctx, b)
		require.ErrorIs(t, err, ErrQueueFull)
		var be *BatchError
		assert.False(t, errors.As(err, &be), "refused before sending, not a partial failure")
		assert.Zero(t, partitionMsgs(t, e.js, e.core, "acme"), "nothing stored")
		_, used := e.budgets.snapshot()
		assert.Zero(t, used["acme"], "nothing stays reserved")
		require.NoError(t, e.PublishBatch(ctx, batchOf("acme", atomic, false, "row", 1)), "a batch that fits still goes")
	})
}

// A pipelined batch (under fsync, one below minAtomicChunk events; under NoSync, any)
// whose caller already gave up sends nothing: its reservation is let go with its
// error, so what it sent would be stored beyond the tenant's budget.
func TestEmbeddedNATS_APipelinedBatchWhoseCtxIsDoneStoresNothing(t *testing.T) {
	for _, noSync := range []bool{true, false} {
		t.Run(map[bool]string{true: "NoSync", false: "fsync"}[noSync], func(t *testing.T) {
			e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.NoSync = noSync })
			ctx := testCtx(t)
			require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
			done, cancel := context.WithCancel(ctx)
			cancel()
			for range 3 {
				err := e.PublishBatch(done, batchOf("acme", false, false, "row", minAtomicChunk-1))
				require.ErrorIs(t, err, context.Canceled)
				var be *BatchError
				require.ErrorAs(t, err, &be)
				assert.Len(t, be.Failed, minAtomicChunk-1, "no event confirmed")
			}
			require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("after")))
			assert.Equal(t, uint64(1), partitionMsgs(t, e.js, e.core, "acme"), "only the publish after them is stored")
			_, used := e.budgets.snapshot()
			assert.Positive(t, used["acme"], "the stored event is counted")
		})
	}
}

func TestPublishBatch_AnInvalidEventRefusesTheBatchWithNothingSent(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	huge := make([]byte, 2<<20)
	for _, c := range []struct {
		name string
		edit func(*Batch)
		want error
	}{
		{"empty table", func(b *Batch) { b.Events[3].Table = "" }, ErrInvalidTopic},
		{"invalid tenant", func(b *Batch) { b.Tenant = "Acme!" }, ErrInvalidTenant},
		{"reserved header", func(b *Batch) { b.Events[5].Options = []PublishOpt{WithHeader("Nats-Rollup", "value-7f3a")} }, ErrInvalidHeader},
		{"event too large", func(b *Batch) { b.Events[9].Data = huge }, ErrPayloadTooLarge},
		{"atomic beyond the server's batch size", func(b *Batch) { *b = batchOf("acme", true, false, "x", MaxAtomicBatch+1) }, ErrPayloadTooLarge},
	} {
		for _, atomic := range []bool{false, true} {
			b := batchOf("acme", atomic, false, "row", 10)
			c.edit(&b)
			err := e.PublishBatch(ctx, b)
			require.ErrorIs(t, err, c.want, "%s (atomic %v)", c.name, atomic)
			assert.NotContains(t, err.Error(), "value-7f3a", "%s: a header value is never echoed", c.name)
		}
	}
	assert.Zero(t, partitionMsgs(t, e.js, e.core, "acme"), "nothing stored")
	_, used := e.budgets.snapshot()
	assert.Zero(t, used["acme"], "nothing reserved")
	assert.NoError(t, e.PublishBatch(ctx, Batch{Tenant: "acme"}), "an empty batch is a no-op")
	var nilCtx context.Context
	assert.Error(t, e.PublishBatch(nilCtx, batchOf("acme", false, false, "row", 1)), "a nil context is refused, never a panic")
}

// TestPublishBatch_RetriedWithKeysStoresEachEventOnce: a batch sent again (the caller
// retried after an error), and an atomic batch holding an event a single Publish
// already stored, each store every event exactly once.
func TestPublishBatch_RetriedWithKeysStoresEachEventOnce(t *testing.T) {
	batchForms(t, func(t *testing.T, atomic bool) {
		e := openEmbedded(t, "")
		ctx := testCtx(t)
		require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t", Scope: "s2"}, []byte("row-2"),
			WithHeader("X-Row", "row-2"), WithIdempotencyKey("row-2")))
		b := batchOf("acme", atomic, true, "row", 20)
		require.NoError(t, e.PublishBatch(ctx, b))
		require.NoError(t, e.PublishBatch(ctx, b), "the retry")
		assert.Equal(t, uint64(20), partitionMsgs(t, e.js, e.core, "acme"), "each event stored once")
		got, failed := consumeAll(t, e)
		delivered := receiveAll(t, got, failed, 20)
		assert.ElementsMatch(t, payloads(b), delivered)
		_, used := e.budgets.snapshot()
		assert.GreaterOrEqual(t, used["acme"], int64(0))
	})
}

func TestPublishBatch_AfterCloseIsClosed(t *testing.T) {
	e := openEmbedded(t, "")
	require.NoError(t, e.SetMaxBytes(testCtx(t), "acme", 1<<20))
	require.NoError(t, e.Close())
	for _, atomic := range []bool{false, true} {
		require.ErrorIs(t, e.PublishBatch(testCtx(t), batchOf("acme", atomic, false, "row", 3)), ErrClosed)
	}
}

func TestExternalNATS_PublishBatchWorksForTheRestrictedUserInBothForms(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	pipelined := batchOf("acme", false, true, "p", 100)
	atomic := batchOf("acme", true, true, "a", 100)
	require.NoError(t, e.PublishBatch(ctx, pipelined))
	require.NoError(t, e.PublishBatch(ctx, atomic))
	got, failed := consumeAll(t, e)
	assert.Equal(t, append(payloads(pipelined), payloads(atomic)...), receiveAll(t, got, failed, 200))
}

func TestExternalNATS_AnAtomicBatchWithoutAllowAtomicIsATopologyErrorAndStoresNothing(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	stream := shippedTopology.WithDefaults().PartitionStream(Partition("acme", shippedTopology.Partitions))
	f.updateStream(t, stream, func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = false })
	e := f.broker(t)
	ctx := testCtx(t)

	findings, err := VerifyNATSTopology(ctx, f.admin, shippedTopology)
	require.NoError(t, err)
	var found bool
	for _, fd := range findings {
		if fd.Object == "stream "+stream && fd.Field == "allow_atomic" {
			found = true
			assert.Equal(t, Recommended, fd.Severity, "pipelined batches still work")
		}
	}
	assert.True(t, found, "the verifier names allow_atomic on %s: %v", stream, findings)

	err = e.PublishBatch(ctx, batchOf("acme", true, false, "row", 10))
	require.ErrorIs(t, err, ErrTopology)
	assert.Contains(t, err.Error(), "allow_atomic")
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.Len(t, be.Failed, 10, "every event of an atomic batch failed")
	assert.Zero(t, f.streamMsgs(t, stream))
	require.NoError(t, e.PublishBatch(ctx, batchOf("acme", false, false, "row", 10)), "a pipelined batch needs no allow_atomic")
	assert.Equal(t, uint64(10), f.streamMsgs(t, stream))
}

func TestExternalNATS_PublishBatchOnAThreeNodeR3ClusterStoresEveryEvent(t *testing.T) {
	t.Parallel()
	c := newClusterFixture(t, 3)
	f := &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(t, 3)}
	e := f.broker(t)
	ctx := testCtx(t)
	require.NoError(t, e.PublishBatch(ctx, batchOf("acme", true, true, "a", 500)))
	require.NoError(t, e.PublishBatch(ctx, batchOf("acme", false, true, "p", 500)))
	stream := e.core.partitions[Partition("acme", e.topo.Partitions)]
	assert.Equal(t, uint64(1000), f.streamMsgs(t, stream))
}

func TestBatchError_NamesTheFailedEventsAndWrapsTheFirstFailure(t *testing.T) {
	results := []stored{{seq: 1}, {err: fmt.Errorf("x: %w", ErrQueueFull)}, {seq: 3}, {err: ErrUnavailable}}
	err := batchError(results)
	var be *BatchError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, []int{1, 3}, be.Failed)
	assert.ErrorIs(t, err, ErrQueueFull)
	assert.True(t, strings.HasPrefix(err.Error(), "mq: 2 of the batch's events not confirmed"))
	assert.NoError(t, batchError([]stored{{seq: 1}}))
}
