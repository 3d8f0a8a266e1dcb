//go:build integration

package mq

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorker_AWorkerServedAPartitionOnlyOnceAnotherHandedItOverCountsWhatIsPendingThen:
// two workers claim one partition. The server pins it to the first, which holds six
// events of acme; the second took it too, found six pending, got nothing, and its wait
// for them ran out. Then the first stops and hands back five. When the server first
// serves the second, it counts the partition's pending events again (five), so its
// tenants wait for every one of them, whatever order the server sends them in (a
// chaos probe saw it put some behind later ones: a tenant's event 209 ran before 207).
// The test cannot make the server send them out of order, so it proves the count; the
// five in order hold with or without it (the hand-back's confirmed naks keep order).
func TestWorker_AWorkerServedAPartitionOnlyOnceAnotherHandedItOverCountsWhatIsPendingThen(t *testing.T) {
	f := newExternalFixture(t)
	first := f.broker(t)
	second, logs := debugLogged(t, f)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	_, p, err := first.core.subs.ingestTopic(tp)
	require.NoError(t, err)
	for i := range 6 {
		require.NoError(t, first.Publish(ctx, tp, []byte(fmt.Sprint(i))))
	}

	cfg := ConsumerConfig{Partitions: []int{p}, AckWait: time.Minute, StopTimeout: 20 * time.Second}
	ca, err := first.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stopA, _, err := ca.Consume(func(m *Message) error {
		once.Do(func() { close(started) })
		<-release
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first worker was never served")
	}

	cb, err := second.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	var mu sync.Mutex
	var calls []string
	got := make(chan struct{}, 6)
	stopB, _, err := cb.Consume(func(m *Message) error {
		mu.Lock()
		calls = append(calls, string(m.Data))
		mu.Unlock()
		got <- struct{}{}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stopB()
	time.Sleep(1500 * time.Millisecond) // the second's wait for the six ran out meanwhile
	require.NotContains(t, logs.String(), "first delivery of a taken partition", "the server served the second worker while the first held the partition")

	stopped := make(chan struct{})
	go func() { defer close(stopped); stopA() }()
	time.Sleep(500 * time.Millisecond) // stop began: no call starts after event 0's
	close(release)
	<-stopped
	for range 5 {
		select {
		case <-got:
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the second worker handled only %v of the five handed over", calls)
		}
	}
	mu.Lock()
	assert.Equal(t, []string{"1", "2", "3", "4", "5"}, calls)
	mu.Unlock()
	assert.Contains(t, lastLogged(logs, "first delivery of a taken partition"), "ack_pending=5", "when first served, the second worker counts the five handed over as pending")
}

// TestWorker_AWorkerPinnedAgainAfterNobodyElseWasServedGoesOnWithoutACount: an
// operator unpins the partition from the worker consuming it, and the server pins it
// to the worker again. Its next delivery follows the last one it got in the durable's
// delivery sequence, so nobody else was served meanwhile: the worker goes on without
// counting again (a count would hold the partition's lanes).
func TestWorker_AWorkerPinnedAgainAfterNobodyElseWasServedGoesOnWithoutACount(t *testing.T) {
	f := newExternalFixture(t)
	w, logs := debugLogged(t, f)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	got, p := consumeRecorded(t, w, tp)
	require.NoError(t, w.Publish(ctx, tp, []byte("first")))
	awaitData(t, got, "first")

	unpin(t, f, w, p)
	require.NoError(t, w.Publish(ctx, tp, []byte("second")))
	awaitData(t, got, "second")
	assert.Empty(t, lastLogged(logs, "pinned to this worker again"), "the worker counted again though nobody else was served")
}

// TestWorker_AWorkerPinnedAgainAfterAnotherWasServedCountsWhatIsPendingThen: the
// worker stops pulling for a while (here a proxy holds what it sends; a stall or full
// lanes do the same), the server unpins it, and another puller is served an event and
// hands it back. When the server pins the partition to the worker again, the gap in
// the durable's delivery sequence shows another was served, so the worker counts the
// pending events again before it files the delivery, as at its first, and its tenant
// gets the handed-back event before the later one.
func TestWorker_AWorkerPinnedAgainAfterAnotherWasServedCountsWhatIsPendingThen(t *testing.T) {
	f := newExternalFixture(t)
	proxy := newLoopbackProxy(t, f.srv.Addr().String())
	var logs syncBuffer
	w := f.broker(t, func(c *NATSConfig) {
		c.URLs = []string{proxy.URL()}
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	pub := f.broker(t) // publishes on a connection of its own
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	got, p := consumeRecorded(t, w, tp)
	require.NoError(t, pub.Publish(ctx, tp, []byte("first")))
	awaitData(t, got, "first")

	proxy.holdFromClient() // the worker's pulls stop reaching the server
	stream := w.topo.PartitionStream(p)
	cons, err := f.admin.Consumer(ctx, stream, w.topo.IngestConsumer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting == 0
	}, 20*time.Second, 50*time.Millisecond, "the worker's pull never expired")
	unpin(t, f, w, p)
	require.NoError(t, pub.Publish(ctx, tp, []byte("between")))
	batch, err := cons.Fetch(1, jetstream.FetchPriorityGroup(w.topo.IngestGroup), jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for m := range batch.Messages() {
		require.Equal(t, "between", string(m.Data()))
		require.NoError(t, m.Nak()) // handed back
	}
	require.NoError(t, batch.Error())
	unpin(t, f, w, p)
	require.NoError(t, pub.Publish(ctx, tp, []byte("second")))
	proxy.release()

	awaitData(t, got, "between")
	awaitData(t, got, "second")
	assert.Contains(t, lastLogged(&logs, "pinned to this worker again"), "ack_pending=",
		"the worker did not count again though another puller was served meanwhile")
}

// consumeRecorded starts a worker on w claiming topic's partition, p, whose handler
// acks each event and sends its data to got.
func consumeRecorded(t *testing.T, w *ExternalNATS, topic Topic) (got chan string, p int) {
	t.Helper()
	_, p, err := w.core.subs.ingestTopic(topic)
	require.NoError(t, err)
	got = make(chan string, 16)
	startConsume(t, w, ConsumerConfig{Partitions: []int{p}}, func(m *Message) error { got <- string(m.Data); return m.Ack() })
	return got, p
}

// startConsume starts a worker of cfg on b with handle, stopped at cleanup if the
// test has not stopped it.
func startConsume(t *testing.T, b *ExternalNATS, cfg ConsumerConfig, handle Handler) (stop func()) {
	t.Helper()
	c, err := b.CreateConsumer(testCtx(t), cfg)
	require.NoError(t, err)
	stop, _, err = c.Consume(handle, 0)
	require.NoError(t, err)
	t.Cleanup(stop)
	return stop
}

// awaitData waits for the next data on got, which must be data.
func awaitData(t *testing.T, got <-chan string, data string) {
	t.Helper()
	select {
	case d := <-got:
		require.Equal(t, data, d)
	case <-time.After(15 * time.Second):
		t.Fatalf("%q never came", data)
	}
}

// unpin unpins partition p of w's ingest durable, as an operator would.
func unpin(t *testing.T, f *externalFixture, w *ExternalNATS, p int) {
	t.Helper()
	stream, err := f.admin.Stream(testCtx(t), w.topo.PartitionStream(p))
	require.NoError(t, err)
	require.NoError(t, stream.UnpinConsumer(testCtx(t), w.topo.IngestConsumer, w.topo.IngestGroup))
}

// debugLogged boots an ExternalNATS on f that logs at Debug into the buffer returned.
func debugLogged(t *testing.T, f *externalFixture) (*ExternalNATS, *syncBuffer) {
	t.Helper()
	logs := new(syncBuffer)
	return f.broker(t, func(c *NATSConfig) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}), logs
}

// lastLogged is the last line of logs that contains msg, or "".
func lastLogged(logs *syncBuffer, msg string) string {
	var last string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, msg) {
			last = line
		}
	}
	return last
}
