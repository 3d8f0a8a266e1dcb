//go:build integration

package mq

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
)

// point is one data point: a counter's or gauge's value, or a histogram's sum and count.
type point struct {
	attrs attribute.Set
	value float64
	count uint64
}

// collectPoints reads every data point reader holds, by instrument name.
func collectPoints(t *testing.T, reader *sdkmetric.ManualReader) map[string][]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	out := map[string][]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: dp.Attributes, value: float64(dp.Value)})
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: dp.Attributes, value: float64(dp.Value)})
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: dp.Attributes, value: dp.Value})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: dp.Attributes, value: dp.Sum, count: dp.Count})
				}
			default:
				t.Fatalf("%s: unexpected aggregation %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// matching are the points holding every one of want; an attribute whose value is
// the empty string must be absent.
func matching(points []point, want ...attribute.KeyValue) []point {
	var out []point
	for _, p := range points {
		ok := true
		for _, w := range want {
			v, found := p.attrs.Value(w.Key)
			if w.Value.AsString() == "" && w.Value.Type() == attribute.STRING {
				ok = ok && !found
			} else {
				ok = ok && found && v == w.Value
			}
		}
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// total sums the matching points' values.
func total(points []point, want ...attribute.KeyValue) float64 {
	var n float64
	for _, p := range matching(points, want...) {
		n += p.value
	}
	return n
}

// samples sums the matching histogram points' counts.
func samples(points []point, want ...attribute.KeyValue) uint64 {
	var n uint64
	for _, p := range matching(points, want...) {
		n += p.count
	}
	return n
}

var (
	opName  = semconv.MessagingOperationNameKey.String
	noError = semconv.ErrorTypeKey.String("")
)

func errType(name string) attribute.KeyValue { return semconv.ErrorTypeKey.String(name) }

// meteredFlow runs the events every instrument counts through an embedded broker:
// three publishes (one poison), one refused for a tenant without a budget, an
// atomic batch of five, a worker that fails the poison event once and so parks it
// (MaxDeliveries 1), and a replay. It returns the reader and what the replay sent.
func meteredFlow(t *testing.T, tenants bool) (*sdkmetric.ManualReader, int) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.MetricsTenants = tenants
	})
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	orders := Topic{Tenant: "acme", Table: "orders"}
	for _, d := range []string{"1", "poison", "2"} {
		require.NoError(t, e.Publish(ctx, orders, []byte(d)))
	}
	require.ErrorIs(t, e.Publish(ctx, Topic{Tenant: "nobudget", Table: "orders"}, []byte("x")), ErrQueueFull)
	batch := Batch{Tenant: "acme", Atomic: true}
	for i := range 5 {
		batch.Events = append(batch.Events, BatchEvent{Table: "items", Data: []byte{byte('a' + i)}})
	}
	require.NoError(t, e.PublishBatch(ctx, batch))

	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, MaxDeliveries: 1})
	require.NoError(t, err)
	stop, failed, err := c.Consume(func(m *Message) error {
		if string(m.Data) == "poison" {
			return errors.New("bad row")
		}
		return m.DoubleAck(m.Ctx)
	}, 0)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool {
		p := collectPoints(t, reader)
		return total(p[messagingconv.ClientConsumedMessages{}.Name()]) == 8 && total(p[metricParked]) == 1
	}, 15*time.Second, 10*time.Millisecond, "every event handled and the poison one parked")
	select {
	case err := <-failed:
		t.Fatalf("delivery ended: %v", err)
	default:
	}
	return reader, replayCount(t, e, orders)
}

func TestMetrics_EveryInstrumentMovesAsEventsFlowWithErrorTypeFromTheSentinel(t *testing.T) {
	reader, replayed := meteredFlow(t, false)
	p := collectPoints(t, reader)
	nats := semconv.MessagingSystemKey.String("nats")
	ingest := semconv.MessagingDestinationNameKey.String("wh.ingest.{partition}.{tenant}.{table}")
	dlq := semconv.MessagingDestinationNameKey.String("wh.dlq.{tenant}.{table}")

	sent := p[messagingconv.ClientSentMessages{}.Name()]
	assert.Equal(t, 8.0, total(sent, nats, ingest, opName(opPublish), noError), "3 publishes and a batch of 5")
	assert.Equal(t, 1.0, total(sent, opName(opPublish), errType("mq.ErrQueueFull")), "the refused publish")
	assert.Equal(t, 1.0, total(sent, dlq, opName(opDeadLetter), noError), "the park")

	ops := p[messagingconv.ClientOperationDuration{}.Name()]
	send := semconv.MessagingOperationTypeKey.String("send")
	assert.Equal(t, uint64(4), samples(ops, send, opName(opPublish), noError), "one per Publish, one per PublishBatch")
	assert.Equal(t, uint64(1), samples(ops, send, opName(opPublish), errType("mq.ErrQueueFull")))
	assert.Equal(t, uint64(1), samples(ops, send, opName(opDeadLetter)))
	assert.Equal(t, uint64(1), samples(ops, semconv.MessagingOperationTypeKey.String("receive"), opName(opReplay)))

	proc := p[messagingconv.ProcessDuration{}.Name()]
	group := semconv.MessagingConsumerGroupNameKey.String(defaultIngestConsumer)
	assert.Equal(t, uint64(7), samples(proc, nats, group, opName(opProcess), noError))
	assert.Equal(t, uint64(1), samples(proc, opName(opProcess), errType("_OTHER")), "the handler's error")

	consumed := p[messagingconv.ClientConsumedMessages{}.Name()]
	assert.Equal(t, 8.0, total(consumed, group, opName(opProcess)))
	assert.Equal(t, float64(replayed), total(consumed, opName(opReplay)))
	assert.Positive(t, replayed)

	assert.Equal(t, 1.0, total(p[metricParked], AttrTable.String("orders")))
	assert.Equal(t, 1.0, total(p[metricConnected]))
	acme := AttrPartition.Int(Partition("acme", 4))
	assert.Equal(t, float64(1<<20), total(p[metricTenantBudget], acme))
	assert.Zero(t, total(p[metricTenantBacklog], acme), "every event acknowledged or parked")

	for name, points := range p {
		for _, pt := range points {
			for _, kv := range pt.attrs.ToSlice() {
				assert.NotEqual(t, AttrTenant, kv.Key, "%s: a tenant attribute without MetricsTenants", name)
				assert.NotContains(t, kv.Value.String(), "acme", "%s: %s holds the tenant", name, kv.Key)
			}
		}
	}
}

func TestMetrics_MetricsTenantsAddsTheTenantToCountersAndTenantGaugesOnly(t *testing.T) {
	reader, _ := meteredFlow(t, true)
	p := collectPoints(t, reader)
	acme := AttrTenant.String("acme")
	assert.Equal(t, 8.0, total(p[messagingconv.ClientSentMessages{}.Name()], acme, opName(opPublish), noError))
	assert.Equal(t, 1.0, total(p[messagingconv.ClientSentMessages{}.Name()], AttrTenant.String("nobudget")))
	assert.Equal(t, 8.0, total(p[messagingconv.ClientConsumedMessages{}.Name()], acme, opName(opProcess)))
	assert.Equal(t, 1.0, total(p[metricParked], acme, AttrTable.String("orders")))
	assert.Equal(t, float64(1<<20), total(p[metricTenantBudget], acme))
	for _, name := range []string{messagingconv.ClientOperationDuration{}.Name(), messagingconv.ProcessDuration{}.Name()} {
		require.NotEmpty(t, p[name], name)
		for _, pt := range p[name] {
			assert.False(t, pt.attrs.HasValue(AttrTenant), "%s: histograms never carry the tenant", name)
		}
	}
}

func TestMetrics_WorkerViewShowsPendingAckPendingAndRedeliveredOfItsPartition(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for _, d := range []string{"held", "2", "3"} {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte(d)))
	}
	// One unsettled event at a time: while "held" is held the other two stay pending.
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, MaxAckPending: 1,
		RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond})
	require.NoError(t, err)
	holding, release := make(chan struct{}), make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		if string(m.Data) == "held" {
			if m.Attempt == 1 {
				return errors.New("fail once, so it is redelivered")
			}
			close(holding)
			<-release
		}
		return m.DoubleAck(m.Ctx)
	}, 0)
	require.NoError(t, err)
	defer stop()
	<-holding

	acme := AttrPartition.Int(Partition("acme", e.topo.Partitions))
	view := func() [3]float64 {
		p := collectPoints(t, reader)
		return [3]float64{total(p[metricWorkerPending], acme), total(p[metricWorkerAckPend], acme), total(p[metricWorkerRedeliver], acme)}
	}
	// The server counts a stored event into the durable's pending asynchronously.
	var seen [3]float64
	require.Eventually(t, func() bool { seen = view(); return seen == [3]float64{2, 1, 1} }, 10*time.Second, 10*time.Millisecond,
		"pending, ack pending, redelivered while the retried event is held")
	assert.Equal(t, [3]float64{2, 1, 1}, seen, "pending, ack pending, redelivered while the retried event is held")
	close(release)
	require.Eventually(t, func() bool { return view() == [3]float64{} }, 10*time.Second, 10*time.Millisecond,
		"all zero once everything is acknowledged")
}

func TestMetrics_DefaultMeterProviderIsTheGlobalOne(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(noop.NewMeterProvider()) })
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte("x")))
	p := collectPoints(t, reader)
	assert.Equal(t, 1.0, total(p[messagingconv.ClientSentMessages{}.Name()], opName(opPublish)))
	assert.Equal(t, 1.0, total(p[metricConnected]))
}

func TestMetrics_EveryRegisteredInstrumentIsInTheCatalogWithItsUnit(t *testing.T) {
	reader, _ := meteredFlow(t, false)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	units := map[string]string{}
	for _, i := range instrumentCatalog {
		units[i.name] = i.unit
	}
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, tracerName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			unit, ok := units[m.Name]
			if assert.True(t, ok, "%s is not in instrumentCatalog", m.Name) {
				assert.Equal(t, unit, m.Unit, m.Name)
			}
			assert.True(t, strings.HasPrefix(m.Name, "mq.") || strings.HasPrefix(m.Name, "messaging."), m.Name)
			seen++
		}
	}
	// The worker view reports only while a Consume runs; the flow has stopped its own.
	assert.Equal(t, 8, seen, "the embedded broker's instruments but the worker view")
}

func TestMetrics_ExternalNATSCountsWhatItSendsAndConsumesAndTheWorkerViewOfEachPartition(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	reader := sdkmetric.NewManualReader()
	e := f.broker(t, func(c *NATSConfig) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	ctx := testCtx(t)
	got, failed := consumeAll(t, e)
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte("1")))
	require.NoError(t, e.PublishBatch(ctx, Batch{Tenant: "acme", Events: []BatchEvent{{Table: "orders", Data: []byte("2")}}}))
	receive(t, got, failed)
	receive(t, got, failed)
	require.Eventually(t, func() bool {
		return total(collectPoints(t, reader)[messagingconv.ClientConsumedMessages{}.Name()], opName(opProcess)) == 2
	}, 10*time.Second, 10*time.Millisecond)

	p := collectPoints(t, reader)
	assert.Equal(t, 2.0, total(p[messagingconv.ClientSentMessages{}.Name()], opName(opPublish), noError))
	assert.Equal(t, uint64(2), samples(p[messagingconv.ClientOperationDuration{}.Name()], opName(opPublish), noError))
	assert.Equal(t, 1.0, total(p[metricConnected]))
	assert.Equal(t, 1.0, total(p[metricTopologyOK]))
	acme := AttrPartition.Int(Partition("acme", e.topo.Partitions))
	assert.Len(t, matching(p[metricWorkerAckPend], acme), 1, "the worker's partition of acme is in its view")
	assert.Zero(t, total(p[metricWorkerPending], acme))
	require.Len(t, p[metricHeldForHistory], e.topo.Partitions)
	for _, pt := range p[metricHeldForHistory] {
		assert.True(t, pt.attrs.HasValue(AttrPartition) && pt.attrs.HasValue(AttrStream), "held gauges name the partition and stream")
	}
}

// TestMetrics_AParkRetriedUnderItsKeyCountsOnceAndABinaryTableIsValidUTF8: a host
// retrying a DeadLetter whose answer it lost (same idempotency key) parks once and
// the parked counter says once; a table that is not UTF-8 is counted under a valid
// attribute, which an OTLP exporter can send.
func TestMetrics_AParkRetriedUnderItsKeyCountsOnceAndABinaryTableIsValidUTF8(t *testing.T) {
	t.Parallel()
	m := openMetered(t, "")
	ctx := testCtx(t)
	require.NoError(t, m.SetMaxBytes(ctx, "acme", 1<<20))
	const table = "\xff\xfe-bin"
	key, err := Topic{Tenant: "acme", Table: table}.Key()
	require.NoError(t, err)
	msg := &Message{Data: []byte("poison"), key: key}
	for range 3 {
		require.NoError(t, m.DeadLetter(ctx, msg, WithIdempotencyKey("park-1")))
	}
	counts, err := m.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	require.Equal(t, uint64(1), counts.Total, "parked once")

	parked := collectPoints(t, m.reader)[metricParked]
	assert.Equal(t, 1.0, total(parked), "the parked counter counts the park, not its retries")

	// A park whose first answer was lost is sent again under its id: the Duplicate
	// answer is this call's own store, and counts.
	lossy := &lossyRequests{send: m.core.request, lose: 1}
	m.core.request = lossy.request
	require.NoError(t, m.DeadLetter(ctx, msg, WithIdempotencyKey("park-2")))
	require.Len(t, lossy.ids, 2, "sent again after the lost answer")
	counts, err = m.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	require.Equal(t, uint64(2), counts.Total, "parked once more")
	assert.Equal(t, 2.0, total(collectPoints(t, m.reader)[metricParked]), "the park whose answer was lost counts")
	for _, pt := range parked {
		for _, kv := range pt.attrs.ToSlice() {
			assert.True(t, utf8.ValidString(kv.Value.String()), "%s is not UTF-8: %q", kv.Key, kv.Value.String())
		}
	}
}
