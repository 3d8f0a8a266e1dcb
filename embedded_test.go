package mq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// openEmbedded starts a broker over dir (a new temp dir when empty) and closes it at
// cleanup.
func openEmbedded(t *testing.T, dir string, mutate ...func(*EmbeddedOptions)) *EmbeddedNATS {
	t.Helper()
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "store")
	}
	opts := EmbeddedOptions{StoreDir: dir, NoSync: true, Logger: quietLog}
	for _, m := range mutate {
		m(&opts)
	}
	e, err := NewEmbedded(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// drain consumes n events, acking each, and returns their payloads in order.
func drain(t *testing.T, e *EmbeddedNATS, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		require.NoError(t, m.DoubleAck(ctx))
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(m.Data))
		if len(got) == n {
			close(done)
		}
		return nil
	}, 16)
	require.NoError(t, err)
	defer stop()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("consumed %d of %d", len(got), n)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), got...)
}

func TestEmbeddedNATS_CreatesTheTopologyBeforeItAcceptsAPublish(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	for p := range e.topo.Partitions {
		s, err := e.js.Stream(ctx, e.topo.PartitionStream(p))
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		assert.Equal(t, jetstream.InterestPolicy, cfg.Retention)
		assert.Equal(t, jetstream.DiscardNew, cfg.Discard)
		assert.Equal(t, []string{e.subs.partitionFilter(p)}, cfg.Subjects)
		_, err = s.Consumer(ctx, e.topo.IngestConsumer)
		require.NoError(t, err, "partition %d has no durable", p)
	}
	h, err := e.js.Stream(ctx, e.topo.HistoryStream)
	require.NoError(t, err)
	assert.Len(t, h.CachedInfo().Config.Sources, e.topo.Partitions)
	_, err = e.js.Stream(ctx, e.topo.DeadLetterStream())
	require.NoError(t, err)
}

func TestEmbeddedNATS_ATenantWithoutABudgetIsRefusedAsFull(t *testing.T) {
	e := openEmbedded(t, "")
	err := e.Publish(testCtx(t), Topic{Tenant: "acme", Table: "t"}, []byte("x"))
	require.ErrorIs(t, err, ErrQueueFull)
	assert.Contains(t, err.Error(), "acme")
}

func TestEmbeddedNATS_BudgetRefusesPastItsBytesAndAcksFreeThem(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 4096))
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 4096))
	topic := Topic{Tenant: "acme", Table: "t"}
	payload := make([]byte, 1000)
	n := 0
	for ; n < 10; n++ {
		if err := e.Publish(ctx, topic, payload); err != nil {
			require.ErrorIs(t, err, ErrQueueFull)
			break
		}
	}
	require.Equal(t, 4, n, "4 events of ~1 KiB fit a 4 KiB budget")
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "globex", Table: "t"}, payload), "another tenant is unaffected")
	drain(t, e, 5)
	require.NoError(t, e.Publish(ctx, topic, payload), "acked events free the budget")
}

func TestEmbeddedNATS_ReopenedStoreLosesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 2500))
	topic := Topic{Tenant: "acme", Table: "t"}
	payload := make([]byte, 1000)
	require.NoError(t, e.Publish(ctx, topic, payload))
	require.NoError(t, e.Publish(ctx, topic, payload))
	require.NoError(t, e.Close())
	require.NoError(t, e.Close(), "Close is idempotent")
	require.ErrorIs(t, e.Publish(ctx, topic, payload), ErrClosed)

	e = openEmbedded(t, dir)
	assert.Equal(t, int64(2500), e.MaxBytes("acme"), "the budget is kept in the store")
	require.ErrorIs(t, e.Publish(ctx, topic, payload), ErrQueueFull, "the backlog is counted again after a reopen")
	assert.Len(t, drain(t, e, 2), 2, "both stored events are delivered after the reopen")
	require.NoError(t, e.Publish(ctx, topic, payload))
}

func TestEmbeddedNATS_MetricsReportEachTenantsBacklogAndBudget(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, make([]byte, 100)))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("tenant"))
				got[m.Name+"/"+v.AsString()] = dp.Value
			}
		}
	}
	assert.Equal(t, int64(1<<20), got["wavehouse_mq_tenant_budget_bytes/acme"])
	assert.Greater(t, got["wavehouse_mq_tenant_backlog_bytes/acme"], int64(100))
}

func TestEmbeddedNATS_FailedOnceWhenEveryPartitionsDurableIsDeleted(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, failed, err := c.Consume(func(m *Message) error { return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	for p := range e.topo.Partitions {
		require.NoError(t, e.js.DeleteConsumer(ctx, e.topo.PartitionStream(p), e.topo.IngestConsumer))
	}
	select {
	case err := <-failed:
		require.ErrorIs(t, err, ErrDeliveryEnded)
		require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	case <-ctx.Done():
		t.Fatal("no report on failed")
	}
	select {
	case err := <-failed:
		t.Fatalf("a second report: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestEmbeddedNATS_ReplayIsBoundedToWhatWasStoredAtItsStart(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "r"}
	for range 300 {
		require.NoError(t, e.Publish(ctx, topic, []byte("old")))
	}
	require.Eventually(t, func() bool { return replayCount(t, e, topic) == 300 }, 5*time.Second, 10*time.Millisecond)
	sent := 0
	err := e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		if sent == 0 {
			for range 50 {
				require.NoError(t, e.Publish(ctx, topic, []byte("new")))
			}
		}
		sent++
		return string(m.Data) == "old"
	})
	require.NoError(t, err)
	assert.Equal(t, 300, sent, "events published during the replay are not sent by it")
}

func replayCount(t *testing.T, e *EmbeddedNATS, topic Topic) int {
	n := 0
	err := e.ReplaySince(testCtx(t), topic, time.Time{}, func(*Message) bool { n++; return true })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("replay: %v", err)
	}
	return n
}
