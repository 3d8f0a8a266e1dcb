//go:build integration

package mq

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The coalescer's tests hold a partition's send in flight by hand (holdPartition), so
// which publishes wait together is decided by the test, not by the scheduler.

var fsync = func(o *EmbeddedOptions) { o.NoSync = false }

// openFsync opens a metered broker over dir with the default fsync per write, and
// acme's budget at 1 MiB.
func openFsync(t *testing.T, dir string) meteredBroker {
	t.Helper()
	b := openMetered(t, dir, fsync)
	require.NoError(t, b.SetMaxBytes(testCtx(t), "acme", 1<<20))
	return b
}

// holdPartition marks tenant's partition busy, as a send in flight does; the calls
// that publish meanwhile wait. release ends the "send" and lets them go.
func holdPartition(t *testing.T, e *EmbeddedNATS, tenant TenantID) (p int, release func()) {
	t.Helper()
	require.NotNil(t, e.commits, "the broker coalesces publishes")
	p = Partition(tenant, e.topo.Partitions)
	part := &e.commits.parts[p]
	part.mu.Lock()
	require.False(t, part.busy, "partition %d is idle", p)
	part.busy = true
	part.mu.Unlock()
	return p, func() { e.commits.handOff(p) }
}

// waitQueued waits until n calls wait on partition p.
func waitQueued(t *testing.T, e *EmbeddedNATS, p, n int) {
	t.Helper()
	part := &e.commits.parts[p]
	require.Eventually(t, func() bool {
		part.mu.Lock()
		defer part.mu.Unlock()
		return len(part.queue) == n
	}, 15*time.Second, 5*time.Millisecond, "%d publishes wait on partition %d", n, p)
}

// publishAll publishes each of events from a goroutine of its own and returns their
// errors, once all returned.
func publishAll(ctx context.Context, e *EmbeddedNATS, events []testEvent) func() []error {
	errs := make([]error, len(events))
	var wg sync.WaitGroup
	for i, ev := range events {
		wg.Go(func() { errs[i] = e.Publish(ctx, ev.topic, ev.data, ev.opts...) })
	}
	return func() []error { wg.Wait(); return errs }
}

// publishTogether publishes events while tenant's partition is held, so all of them
// wait together, runs beforeRelease (if any), releases the partition, and returns
// each call's error.
func publishTogether(t *testing.T, e *EmbeddedNATS, tenant TenantID, events []testEvent, beforeRelease ...func()) []error {
	t.Helper()
	p, release := holdPartition(t, e, tenant)
	wait := publishAll(testCtx(t), e, events)
	waitQueued(t, e, p, len(events))
	for _, f := range beforeRelease {
		f()
	}
	release()
	return wait()
}

// plainEvents are n events of acme on table t, their data "e0", "e1", ...
func plainEvents(n int) []testEvent {
	var events []testEvent
	for i := range n {
		events = append(events, testEvent{topic: Topic{Tenant: "acme", Table: "t"}, data: []byte("e" + strconv.Itoa(i))})
	}
	return events
}

type testEvent struct {
	topic Topic
	data  []byte
	opts  []PublishOpt
}

// storedBatchIDs maps each stored event's data to the atomic batch it came in ("" for
// none), and counts them. An event the stream lets go of meanwhile (acknowledged and
// copied to the history) is not in it.
func storedBatchIDs(t *testing.T, e *EmbeddedNATS, tenant TenantID) map[string]string {
	t.Helper()
	ctx := testCtx(t)
	s, err := e.js.Stream(ctx, e.topo.PartitionStream(Partition(tenant, e.topo.Partitions)))
	require.NoError(t, err)
	out := map[string]string{}
	if s.CachedInfo().State.Msgs == 0 {
		return out
	}
	for seq := s.CachedInfo().State.FirstSeq; seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		_, again := out[string(m.Data)]
		require.False(t, again, "%q stored twice", m.Data)
		out[string(m.Data)] = m.Header.Get("Nats-Batch-Id")
	}
	return out
}

// TestEmbeddedNATS_UnderFsyncPublishesThatWaitTogetherAreStoredAsOneAtomicBatch: the
// calls that queue behind a send in flight go as one atomic batch (one fsync), each
// confirmed to its own caller, across tables and scopes, with the budget counting
// each exactly as a reopen of the store does.
func TestEmbeddedNATS_UnderFsyncPublishesThatWaitTogetherAreStoredAsOneAtomicBatch(t *testing.T) {
	dir := t.TempDir()
	b := openFsync(t, dir)
	const n = 40
	var events []testEvent
	for i := range n {
		events = append(events, testEvent{topic: Topic{Tenant: "acme", Table: "t" + strconv.Itoa(i%3), Scope: strconv.Itoa(i % 2)},
			data: []byte("e" + strconv.Itoa(i)), opts: []PublishOpt{WithHeader("X-I", strconv.Itoa(i))}})
	}
	for i, err := range publishTogether(t, b.EmbeddedNATS, "acme", events) {
		require.NoError(t, err, "publish %d", i)
	}
	batches := storedBatchIDs(t, b.EmbeddedNATS, "acme")
	require.Len(t, batches, n, "each event stored once")
	ids := map[string]int{}
	for _, id := range batches {
		ids[id]++
	}
	assert.Equal(t, map[string]int{batches["e0"]: n}, ids, "all in one atomic batch")
	assert.NotEmpty(t, batches["e0"], "an atomic batch")

	held := b.backlog(t, "acme")
	assert.Positive(t, held)
	b = restart(t, b, dir, fsync)
	assert.Equal(t, held, b.backlog(t, "acme"), "the reopened store counts what was enforced")
	drain(t, b.EmbeddedNATS, n)
	assert.Zero(t, b.backlog(t, "acme"), "all acknowledged")
}

// TestEmbeddedNATS_UnderFsyncWaitingPublishesWithRepeatedKeysAreEachStoredOnce: a batch
// the server refuses whole (two waiting calls share a key, a third repeats a key
// stored before) goes again event by event: every caller is told nil, each key is
// stored once, and the budget counts each stored event once.
func TestEmbeddedNATS_UnderFsyncWaitingPublishesWithRepeatedKeysAreEachStoredOnce(t *testing.T) {
	dir := t.TempDir()
	b := openFsync(t, dir)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, b.Publish(ctx, tp, []byte("k-0"), WithIdempotencyKey("k-0")))
	var events []testEvent
	for i := range 30 {
		key := "k-" + strconv.Itoa(i%20) // k-0 .. k-9 twice; k-0 stored before
		events = append(events, testEvent{topic: tp, data: []byte(key), opts: []PublishOpt{WithIdempotencyKey(key)}})
	}
	for i, err := range publishTogether(t, b.EmbeddedNATS, "acme", events) {
		require.NoError(t, err, "publish %d", i)
	}
	batches := storedBatchIDs(t, b.EmbeddedNATS, "acme")
	assert.Len(t, batches, 20, "k-0 .. k-19, each once")

	held := b.backlog(t, "acme")
	b = restart(t, b, dir, fsync)
	assert.Equal(t, held, b.backlog(t, "acme"), "the reopened store counts what was enforced")
	drain(t, b.EmbeddedNATS, 20)
	assert.Zero(t, b.backlog(t, "acme"), "all acknowledged")
}

// TestEmbeddedNATS_UnderFsyncTheCallersOfASendThatEndedJoinWhatQueuedBehindIt: after
// a send, the flush waits for its callers to publish again before it sends what
// queued meanwhile, so callers that publish in a loop go as one atomic batch instead
// of taking turns in two. The wait is made long here, so the test does not race it.
func TestEmbeddedNATS_UnderFsyncTheCallersOfASendThatEndedJoinWhatQueuedBehindIt(t *testing.T) {
	b := openFsync(t, "")
	b.commits.lingerFor = time.Minute
	ctx := testCtx(t)
	p, release := holdPartition(t, b.EmbeddedNATS, "acme")
	wait := publishAll(ctx, b.EmbeddedNATS, plainEvents(minAtomicChunk-1)) // one short of an atomic batch
	waitQueued(t, b.EmbeddedNATS, p, minAtomicChunk-1)
	release() // the send in flight ends; its caller publishes again below
	part := &b.commits.parts[p]
	require.Eventually(t, func() bool { part.mu.Lock(); defer part.mu.Unlock(); return part.full != nil },
		15*time.Second, time.Millisecond, "the flush waits for the send's caller")
	require.NoError(t, b.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("back")))
	for i, err := range wait() {
		require.NoError(t, err, "publish %d", i)
	}
	batches := storedBatchIDs(t, b.EmbeddedNATS, "acme")
	require.Len(t, batches, minAtomicChunk, "every event stored once")
	assert.NotEmpty(t, batches["back"], "an atomic batch")
	for data, id := range batches {
		assert.Equal(t, batches["back"], id, "%s in the one batch", data)
	}
}

// TestEmbeddedNATS_UnderFsyncAFewWaitingPublishesArePipelinedNotBatched: fewer waiting
// calls than minAtomicChunk go pipelined (an atomic batch's staging costs more than
// their fsyncs), each stored and confirmed.
func TestEmbeddedNATS_UnderFsyncAFewWaitingPublishesArePipelinedNotBatched(t *testing.T) {
	b := openFsync(t, "")
	events := plainEvents(minAtomicChunk - 1)
	for i, err := range publishTogether(t, b.EmbeddedNATS, "acme", events) {
		require.NoError(t, err, "publish %d", i)
	}
	batches := storedBatchIDs(t, b.EmbeddedNATS, "acme")
	require.Len(t, batches, len(events))
	for data, id := range batches {
		assert.Empty(t, id, "%s went on its own", data)
	}
}

// TestEmbeddedNATS_UnderFsyncAPublishWhoseCtxEndsWhileWaitingIsNotSent: a caller that
// stops waiting gets its ctx's error; its event, not yet sent, is never stored and
// holds no budget, while the calls beside it are stored.
func TestEmbeddedNATS_UnderFsyncAPublishWhoseCtxEndsWhileWaitingIsNotSent(t *testing.T) {
	b := openFsync(t, "")
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	p, release := holdPartition(t, b.EmbeddedNATS, "acme")
	gone, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Publish(gone, tp, []byte("gone")) }()
	waitQueued(t, b.EmbeddedNATS, p, 1)
	wait := publishAll(ctx, b.EmbeddedNATS, []testEvent{{topic: tp, data: []byte("kept")}})
	waitQueued(t, b.EmbeddedNATS, p, 2)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	release()
	require.NoError(t, wait()[0])
	assert.Equal(t, map[string]string{"kept": ""}, storedBatchIDs(t, b.EmbeddedNATS, "acme"))
	drain(t, b.EmbeddedNATS, 1)
	assert.Zero(t, b.backlog(t, "acme"), "the abandoned event holds nothing")
}

// TestEmbeddedNATS_UnderFsyncPublishesWaitingAtCloseReturnErrClosed: calls that wait
// when the broker closes are told ErrClosed, and hold no budget.
func TestEmbeddedNATS_UnderFsyncPublishesWaitingAtCloseReturnErrClosed(t *testing.T) {
	e := openFsync(t, "").EmbeddedNATS
	errs := publishTogether(t, e, "acme", plainEvents(minAtomicChunk+3), func() { require.NoError(t, e.Close()) })
	for i, err := range errs {
		require.ErrorIs(t, err, ErrClosed, "publish %d", i)
	}
	e.budgets.mu.Lock()
	defer e.budgets.mu.Unlock()
	assert.Zero(t, e.budgets.used["acme"], "nothing held")
}

// TestEmbeddedNATS_UnderFsyncAPublishThatPanicsGivesItsPartitionBack: a send that
// panics (here in its caller's ctx) gives back its reservation and leaves its
// partition free for the next call.
func TestEmbeddedNATS_UnderFsyncAPublishThatPanicsGivesItsPartitionBack(t *testing.T) {
	b := openFsync(t, "")
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	require.PanicsWithValue(t, "mq test: Done called", func() { _ = b.Publish(panicOnDone{ctx}, topic, []byte("x")) })
	assert.Zero(t, b.backlog(t, "acme"), "the panicked publish holds nothing")
	p := Partition("acme", b.topo.Partitions)
	b.commits.parts[p].mu.Lock()
	busy := b.commits.parts[p].busy
	b.commits.parts[p].mu.Unlock()
	assert.False(t, busy, "the partition is free")
	require.NoError(t, b.Publish(ctx, topic, []byte("y")))
}

// TestEmbeddedNATS_UnderFsyncAWaitingCallersDataIsItsOwnAfterItLeft: a caller whose ctx
// ends while its event waits may reuse its buffer at once; what is stored, if the
// event went, is what it published, never what the buffer held later.
func TestEmbeddedNATS_UnderFsyncAWaitingCallersDataIsItsOwnAfterItLeft(t *testing.T) {
	b := openFsync(t, "")
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	p, release := holdPartition(t, b.EmbeddedNATS, "acme")
	buf := []byte("published")
	gone, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Publish(gone, tp, buf) }()
	waitQueued(t, b.EmbeddedNATS, p, 1)
	// Taken for sending as if the flush had it already: the caller leaves after.
	part := &b.commits.parts[p]
	part.mu.Lock()
	batch := part.queue
	part.queue = nil
	part.mu.Unlock()
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	copy(buf, "overwrite")
	// The flush read "still waiting" just before the caller left: the event goes.
	batch[0].left.Store(false)
	b.commits.sendQueued(p, batch)
	release()
	assert.Equal(t, map[string]string{"published": ""}, storedBatchIDs(t, b.EmbeddedNATS, "acme"),
		"what the caller published, not what its buffer held later")
	held := b.backlog(t, "acme")
	assert.Positive(t, held, "the stored event is counted though its caller left")
	drain(t, b.EmbeddedNATS, 1)
	assert.Zero(t, b.backlog(t, "acme"), "the budget is exact")
}
