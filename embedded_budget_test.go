package mq

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Budget accounting as a host sees it: through MaxBytes, the per-tenant gauges and
// which publishes fit, across restarts of one store.

// idleBeforeRestart is how long a test lets a broker run idle before closing it, as
// a host does between deploys.
const idleBeforeRestart = 2 * time.Second

// meteredBroker is an EmbeddedNATS with a manual reader on its gauges.
type meteredBroker struct {
	*EmbeddedNATS
	reader *sdkmetric.ManualReader
}

func openMetered(t *testing.T, dir string, mutate ...func(*EmbeddedOptions)) meteredBroker {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, dir, append([]func(*EmbeddedOptions){func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.MetricsTenants = true
	}}, mutate...)...)
	return meteredBroker{EmbeddedNATS: e, reader: reader}
}

// gauges returns the backlog and budget gauges by tenant.
func (m meteredBroker) gauges(t *testing.T) (backlog, budget map[TenantID]int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(t.Context(), &rm))
	backlog, budget = map[TenantID]int64{}, map[TenantID]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, metric := range sm.Metrics {
			var into map[TenantID]int64
			switch metric.Name {
			case metricTenantBacklog:
				into = backlog
			case metricTenantBudget:
				into = budget
			default:
				continue
			}
			for _, dp := range metric.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := dp.Attributes.Value(AttrTenant)
				into[TenantID(v.AsString())] = dp.Value
			}
		}
	}
	return backlog, budget
}

func (m meteredBroker) backlog(t *testing.T, tenant TenantID) int64 {
	t.Helper()
	backlog, _ := m.gauges(t)
	return backlog[tenant]
}

// restart closes b after it ran idle and opens its store again.
func restart(t *testing.T, b meteredBroker, dir string, mutate ...func(*EmbeddedOptions)) meteredBroker {
	t.Helper()
	time.Sleep(idleBeforeRestart)
	require.NoError(t, b.Close())
	return openMetered(t, dir, mutate...)
}

// partitionState is the state of tenant's partition.
func partitionState(t *testing.T, e *EmbeddedNATS, tenant TenantID) jetstream.StreamState {
	t.Helper()
	s, err := e.js.Stream(testCtx(t), e.topo.PartitionStream(Partition(tenant, e.topo.Partitions)))
	require.NoError(t, err)
	return s.CachedInfo().State
}

// oneEventBytes publishes data once on an otherwise empty broker, reads what it counts
// against the tenant, and acks it away again.
func oneEventBytes(t *testing.T, b meteredBroker, topic Topic, data []byte) int64 {
	t.Helper()
	require.NoError(t, b.SetMaxBytes(testCtx(t), topic.Tenant, 1<<20))
	require.NoError(t, b.Publish(testCtx(t), topic, data))
	n := b.backlog(t, topic.Tenant)
	require.Positive(t, n)
	drain(t, b.EmbeddedNATS, 1)
	require.Zero(t, b.backlog(t, topic.Tenant))
	return n
}

// TestEmbeddedNATS_AKeyReusedAfterTheDuplicateWindowIsCheckedAgainstTheBudget is issue
// 7 (a): early in the partitions' duplicate window a repeated key is surely dropped by
// the stream, so it succeeds even at a full budget; after the window the stream
// stores it again, so it must fit the budget like any new event.
func TestEmbeddedNATS_AKeyReusedAfterTheDuplicateWindowIsCheckedAgainstTheBudget(t *testing.T) {
	// A short window, twice the shortest the topology allows: a repeat sent in its
	// first half reaches the stream within it, whatever its retries.
	topo := NATSTopology{PublishTimeout: 200 * time.Millisecond}
	topo.DuplicateWindow = 2 * topo.minDuplicateWindow()
	short := func(o *EmbeddedOptions) { o.Topology = topo }
	dir := filepath.Join(t.TempDir(), "store")
	b := openMetered(t, dir, short)
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	data := []byte("one event")
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, b.Publish(ctx, topic, data))
	size := b.backlog(t, "acme")
	require.Positive(t, size)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 2*size), "room for exactly one more event")

	key := WithIdempotencyKey("order-1")
	require.NoError(t, b.Publish(ctx, topic, data, key))
	require.NoError(t, b.Publish(ctx, topic, data, key), "a repeat within the window is dropped by the stream: it fits")
	time.Sleep(topo.DuplicateWindow + time.Second)
	err := b.Publish(ctx, topic, data, key)
	require.ErrorIs(t, err, ErrQueueFull, "after the window the key stores a second event, past the budget")
	assert.Equal(t, uint64(2), partitionState(t, b.EmbeddedNATS, "acme").LastSeq, "the partition stored two events, not three")
	assert.Equal(t, 2*size, b.backlog(t, "acme"))

	for range 2 {
		b = restart(t, b, dir, short)
		assert.Equal(t, 2*size, b.backlog(t, "acme"), "both events are held after a restart")
		require.ErrorIs(t, b.Publish(ctx, topic, []byte("x")), ErrQueueFull)
	}
	assert.Equal(t, []string{string(data), string(data)}, drain(t, b.EmbeddedNATS, 2))
	assert.Zero(t, b.backlog(t, "acme"))
	require.NoError(t, b.Publish(ctx, topic, data, key), "their acks freed the whole budget")
}

// TestEmbeddedNATS_OutOfOrderAcksHoldExactlyTheUnackedBytesAcrossRestarts is issue 7
// (b): events acknowledged out of order stay stored above the durable's ack floor
// (measured on nats-server v2.15.2: until the history's source has acknowledged them
// too, about a second later), yet they must not count again after a restart.
func TestEmbeddedNATS_OutOfOrderAcksHoldExactlyTheUnackedBytesAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	b := openMetered(t, dir)
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 1<<20))
	const n = 20
	for i := range n {
		require.NoError(t, b.Publish(ctx, topic, fmt.Appendf(nil, "e%02d", i)))
	}
	one := b.backlog(t, "acme") / n // every event has the same size
	require.Positive(t, one)

	c, err := b.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	var mu sync.Mutex
	var held []*Message
	stop, _, err := c.Consume(func(m *Message) error { mu.Lock(); held = append(held, m); mu.Unlock(); return nil }, 64)
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(held) == n }, 10*time.Second, 10*time.Millisecond)
	stop()
	for i := n - 1; i >= 0; i -= 2 { // every second event, last first
		require.NoError(t, held[i].DoubleAck(ctx))
	}
	want := int64(n/2) * one
	require.Equal(t, want, b.backlog(t, "acme"), "the unacked half is held")

	// The first restart follows the acks at once, before the history's source has
	// acknowledged them: that is when the acked events are still stored.
	require.NoError(t, b.Close())
	b = openMetered(t, dir)
	assert.Equal(t, want, b.backlog(t, "acme"), "after a prompt restart")
	for i := range 2 {
		b = restart(t, b, dir)
		assert.Equal(t, want, b.backlog(t, "acme"), "after idle restart %d", i+1)
	}

	// A short ack wait redelivers the unacked half, delivered before the restarts.
	c, err = b.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: time.Second})
	require.NoError(t, err)
	got := map[string]bool{}
	stop, _, err = c.Consume(func(m *Message) error {
		if err := m.DoubleAck(ctx); err != nil {
			return err
		}
		mu.Lock()
		got[string(m.Data)] = true
		mu.Unlock()
		return nil
	}, 64)
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == n/2 }, 15*time.Second, 10*time.Millisecond,
		"the unacked half is redelivered")
	stop()
	assert.Zero(t, b.backlog(t, "acme"), "everything is acknowledged")
	for i := range 2 {
		b = restart(t, b, dir)
		assert.Zero(t, b.backlog(t, "acme"), "nothing is held after restart %d", i+1)
	}
	require.NoError(t, b.SetMaxBytes(ctx, "acme", one))
	require.NoError(t, b.Publish(ctx, topic, []byte("e99")), "an event of the whole budget fits")
}

// TestEmbeddedNATS_ConcurrentSetMaxBytesSurviveARestartAsEnforced is issue 7 (c):
// whichever of several concurrent SetMaxBytes calls for a tenant wins, the budget
// enforced is the one the store keeps, so a restart brings back exactly it.
func TestEmbeddedNATS_ConcurrentSetMaxBytesSurviveARestartAsEnforced(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	b := openMetered(t, dir)
	ctx := testCtx(t)
	const tenants, writers = 64, 8
	var wg sync.WaitGroup
	for i := range tenants {
		for w := range writers {
			wg.Go(func() {
				assert.NoError(t, b.SetMaxBytes(ctx, TenantID(fmt.Sprintf("t%02d", i)), int64(1000+100*i+w)))
			})
		}
	}
	wg.Wait()
	enforced := map[TenantID]int64{}
	for i := range tenants {
		tenant := TenantID(fmt.Sprintf("t%02d", i))
		enforced[tenant] = b.MaxBytes(tenant)
		require.GreaterOrEqual(t, enforced[tenant], int64(1000+100*i), "tenant %s", tenant)
	}
	_, budget := b.gauges(t)
	require.Equal(t, enforced, budget)
	for r := range 2 {
		b = restart(t, b, dir)
		_, budget := b.gauges(t)
		var differ []string
		for tenant, n := range enforced {
			if got := b.MaxBytes(tenant); got != n || budget[tenant] != n {
				differ = append(differ, fmt.Sprintf("%s: enforced %d, now %d (gauge %d)", tenant, n, got, budget[tenant]))
			}
		}
		slices.Sort(differ)
		assert.Empty(t, differ, "after restart %d, %d of %d tenants differ", r+1, len(differ), tenants)
	}
}

// panicOnErr is a context whose Err panics: a stand-in for any panic on the publish
// path after the budget was reserved.
type panicOnErr struct{ context.Context }

func (panicOnErr) Err() error { panic("mq test: Err called") }

// TestEmbeddedNATS_APublishThatPanicsAfterReservingHoldsNothing is issue 7 (d): a
// publish that panics once its bytes are reserved must give them back.
func TestEmbeddedNATS_APublishThatPanicsAfterReservingHoldsNothing(t *testing.T) {
	b := openMetered(t, "")
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	data := []byte("payload")
	size := oneEventBytes(t, b, topic, data)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", size))
	require.Panics(t, func() { _ = b.Publish(panicOnErr{ctx}, topic, data) })
	assert.Zero(t, b.backlog(t, "acme"), "the panicked publish holds nothing")
	require.NoError(t, b.Publish(ctx, topic, data), "the whole budget is free")
}

// TestEmbeddedNATS_ANilContextIsRefusedAndHoldsNothing is issue 7 (d): a nil context
// is an error, not a panic, and neither Publish nor SetMaxBytes changes anything.
func TestEmbeddedNATS_ANilContextIsRefusedAndHoldsNothing(t *testing.T) {
	b := openMetered(t, "")
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	data := []byte("payload")
	size := oneEventBytes(t, b, topic, data)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", size))
	last := partitionState(t, b.EmbeddedNATS, "acme").LastSeq
	var noCtx context.Context
	require.NotPanics(t, func() {
		err := b.Publish(noCtx, topic, data)
		require.ErrorContains(t, err, "nil context")
		err = b.SetMaxBytes(noCtx, "acme", 1)
		require.ErrorContains(t, err, "nil context")
	})
	assert.Equal(t, size, b.MaxBytes("acme"), "the budget stays as it was")
	assert.Zero(t, b.backlog(t, "acme"))
	assert.Equal(t, last, partitionState(t, b.EmbeddedNATS, "acme").LastSeq, "nothing was stored")
	require.NoError(t, b.Publish(ctx, topic, data), "the whole budget is free")
}
