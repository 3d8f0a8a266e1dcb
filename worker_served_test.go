//go:build integration

package mq

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestWorker_AWorkerPinnedAgainCountsWhatIsPendingThen: the server unpins a partition
// from the worker consuming it (here an operator does; a stall longer than the pinned
// TTL does too) and pins it to the worker again under a new pin. Another worker may
// have been served meanwhile and handed events back, so the worker counts the
// partition's pending events again before it files the first delivery under the new
// pin, as it does at its first delivery, and goes on handling events.
func TestWorker_AWorkerPinnedAgainCountsWhatIsPendingThen(t *testing.T) {
	f := newExternalFixture(t)
	w, logs := debugLogged(t, f)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	_, p, err := w.core.subs.ingestTopic(tp)
	require.NoError(t, err)
	c, err := w.CreateConsumer(ctx, ConsumerConfig{Partitions: []int{p}})
	require.NoError(t, err)
	got := make(chan string, 4)
	stop, _, err := c.Consume(func(m *Message) error { got <- string(m.Data); return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	await := func(data string) {
		t.Helper()
		select {
		case d := <-got:
			require.Equal(t, data, d)
		case <-time.After(15 * time.Second):
			t.Fatalf("%q never came", data)
		}
	}
	require.NoError(t, w.Publish(ctx, tp, []byte("first")))
	await("first")
	require.NotContains(t, logs.String(), "pinned to this worker again")

	stream, err := f.admin.Stream(ctx, w.topo.PartitionStream(p))
	require.NoError(t, err)
	require.NoError(t, stream.UnpinConsumer(ctx, w.topo.IngestConsumer, w.topo.IngestGroup))
	require.NoError(t, w.Publish(ctx, tp, []byte("second")))
	await("second")
	assert.Contains(t, lastLogged(logs, "pinned to this worker again"), "ack_pending=1", "under the new pin the worker counts the one event pending, the one just delivered")
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
