package mq

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Metrics follow the OpenTelemetry messaging conventions (semconv v1.43.0) for what
// the conventions name: messages sent and consumed, operation and process durations.
// The broker's own state is reported by gauges in the mq.* namespace (gauges.go).
// Every attribute is bounded: destinations are named by their template, partitions
// by their index, error.type by the sentinel; a tenant id appears only with
// MetricsTenants, and a table name (bounded by the host's schema) only on parks.

// Attributes of the broker's own instruments.
const (
	AttrPartition = attribute.Key("mq.partition")
	AttrTenant    = attribute.Key("mq.tenant")
	AttrTable     = attribute.Key("mq.table")
	AttrStream    = attribute.Key("mq.stream")
)

// The broker's own instruments (the conventions' ones are named by messagingconv).
const (
	metricParked          = "mq.dead_letter.parked"
	metricConnected       = "mq.connected"
	metricTopologyOK      = "mq.topology.ok"
	metricTenantBacklog   = "mq.tenant.backlog"
	metricTenantBudget    = "mq.tenant.budget"
	metricSourceLag       = "mq.history.source.lag"
	metricSourceActive    = "mq.history.source.last_active"
	metricHeldForHistory  = "mq.partition.held_for_history"
	metricWorkerPending   = "mq.worker.pending"
	metricWorkerAckPend   = "mq.worker.ack_pending"
	metricWorkerRedeliver = "mq.worker.redelivered"
)

// instrumentKind is how an instrument aggregates, which decides its Prometheus name.
type instrumentKind int

const (
	kindCounter instrumentKind = iota
	kindHistogram
	kindGauge
)

// instrumentInfo names one instrument the broker may register.
type instrumentInfo struct {
	name string
	kind instrumentKind
	unit string
}

// instrumentCatalog is every instrument either broker registers: the README's table
// and the dashboard are checked against it.
var instrumentCatalog = []instrumentInfo{
	{messagingconv.ClientSentMessages{}.Name(), kindCounter, messagingconv.ClientSentMessages{}.Unit()},
	{messagingconv.ClientConsumedMessages{}.Name(), kindCounter, messagingconv.ClientConsumedMessages{}.Unit()},
	{messagingconv.ClientOperationDuration{}.Name(), kindHistogram, messagingconv.ClientOperationDuration{}.Unit()},
	{messagingconv.ProcessDuration{}.Name(), kindHistogram, messagingconv.ProcessDuration{}.Unit()},
	{metricParked, kindCounter, "{message}"},
	{metricConnected, kindGauge, "1"},
	{metricTopologyOK, kindGauge, "1"},
	{metricTenantBacklog, kindGauge, "By"},
	{metricTenantBudget, kindGauge, "By"},
	{metricSourceLag, kindGauge, "{message}"},
	{metricSourceActive, kindGauge, "s"},
	{metricHeldForHistory, kindGauge, "{message}"},
	{metricWorkerPending, kindGauge, "{message}"},
	{metricWorkerAckPend, kindGauge, "{message}"},
	{metricWorkerRedeliver, kindGauge, "{message}"},
}

// unitOf is the catalog's unit of name, so registration and catalog cannot disagree.
func unitOf(name string) string {
	for _, i := range instrumentCatalog {
		if i.name == name {
			return i.unit
		}
	}
	panic("mq: instrument " + name + " is not in the catalog")
}

// durationBuckets are the conventions' recommended boundaries for messaging durations.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// newMeter is the broker's meter from mp, the global provider when mp is nil.
func newMeter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(tracerName)
}

// instruments are the synchronous instruments of the data path.
type instruments struct {
	meter    metric.Meter
	tenants  bool // MetricsTenants: counters carry mq.tenant
	sent     messagingconv.ClientSentMessages
	consumed messagingconv.ClientConsumedMessages
	opDur    messagingconv.ClientOperationDuration
	procDur  messagingconv.ProcessDuration
	parked   metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider, tenants bool) (*instruments, error) {
	m := &instruments{meter: newMeter(mp), tenants: tenants}
	var err error
	if m.sent, err = messagingconv.NewClientSentMessages(m.meter); err != nil {
		return nil, err
	}
	if m.consumed, err = messagingconv.NewClientConsumedMessages(m.meter); err != nil {
		return nil, err
	}
	buckets := metric.WithExplicitBucketBoundaries(durationBuckets...)
	if m.opDur, err = messagingconv.NewClientOperationDuration(m.meter, buckets); err != nil {
		return nil, err
	}
	if m.procDur, err = messagingconv.NewProcessDuration(m.meter, buckets); err != nil {
		return nil, err
	}
	m.parked, err = m.meter.Int64Counter(metricParked, metric.WithUnit(unitOf(metricParked)),
		metric.WithDescription("Events parked on the dead-letter queue, by the worker or by DeadLetter, per table."))
	if err != nil {
		return nil, err
	}
	return m, nil
}

// operation is one traced and metered broker operation: its span, and what its end
// records. The helper that ends the span records the metrics, so both always agree.
type operation struct {
	trace.Span
	m     *instruments
	start time.Time
	name  string // messaging.operation.name
	typ   messagingconv.OperationTypeAttr
	attrs []attribute.KeyValue // destination, partition, consumer group
	// timed, when set, is attrs with the operation type: what the duration of a send
	// that succeeded is recorded with, built once per kind of send (sendStart).
	timed    []attribute.KeyValue
	tenant   TenantID
	messages int // events sent (send) or handed to the application (process, replay)
}

// system is messaging.system on every instrument.
const system messagingconv.SystemAttr = "nats"

func (m *instruments) startOp(span trace.Span, name string, typ messagingconv.OperationTypeAttr, attrs []attribute.KeyValue) *operation {
	o := new(operation)
	m.initOp(o, span, time.Now(), name, typ, attrs)
	return o
}

// initOp starts operation o, which the caller allocated, at start.
func (m *instruments) initOp(o *operation, span trace.Span, start time.Time, name string, typ messagingconv.OperationTypeAttr, attrs []attribute.KeyValue) {
	*o = operation{Span: span, m: m, start: start, name: name, typ: typ, attrs: attrs}
}

// end ends the span with err and records the operation: its duration, and its
// messages as sent or consumed, with error.type from err.
func (o *operation) end(err error) {
	endSpan(o.Span, err)
	// Recorded under the span alone, not the caller's ctx: a cancelled request still
	// counts, and an exemplar points at this operation's span.
	ctx := context.Background()
	if o.SpanContext().IsValid() { // else there is no span for an exemplar to name
		ctx = trace.ContextWithSpan(ctx, o.Span)
	}
	elapsed := time.Since(o.start).Seconds()
	attrs := o.attrs
	if err != nil {
		attrs = append(attrs[:len(attrs):len(attrs)], semconv.ErrorTypeKey.String(errorType(err)))
	}
	counted := attrs
	if o.m.tenants && o.tenant != "" {
		counted = append(attrs[:len(attrs):len(attrs)], AttrTenant.String(string(o.tenant)))
	}
	opType := o.m.opDur.AttrOperationType(o.typ)
	switch o.typ {
	case messagingconv.OperationTypeSend:
		timed := o.timed
		if err != nil || timed == nil {
			timed = append(attrs, opType)
		}
		o.m.opDur.Record(ctx, elapsed, o.name, system, timed...)
		o.m.sent.Add(ctx, int64(o.messages), o.name, system, counted...)
	case messagingconv.OperationTypeProcess:
		o.m.procDur.Record(ctx, elapsed, o.name, system, attrs...)
		if o.m.consumed.Enabled(ctx) { // dropError copies, for a no-op meter too
			o.m.consumed.Add(ctx, int64(o.messages), o.name, system, dropError(counted)...)
		}
	default: // receive: a replay
		o.m.opDur.Record(ctx, elapsed, o.name, system, append(attrs, opType)...)
		if o.messages > 0 {
			o.m.consumed.Add(ctx, int64(o.messages), o.name, system, dropError(counted)...)
		}
	}
}

// dropError removes error.type: a delivery counts as consumed whatever its handler
// returned, which the process duration reports.
func dropError(attrs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(attrs))
	for _, a := range attrs {
		if a.Key != semconv.ErrorTypeKey {
			out = append(out, a)
		}
	}
	return out
}

// park counts one event parked on the dead-letter queue under topic's table; a topic
// this package could not have written counts as "_OTHER", so a foreign subject never
// becomes an attribute.
func (m *instruments) park(topic Topic) {
	// A table may be any bytes; an attribute that is not UTF-8 makes an OTLP exporter
	// refuse the whole request it is in, every other metric with it.
	table := strings.ToValidUTF8(topic.Table, "\uFFFD")
	if topic.Tenant == "" {
		table = semconv.ErrorTypeOther.Value.AsString()
	}
	attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String(string(system)), AttrTable.String(table)}
	if m.tenants && topic.Tenant != "" {
		attrs = append(attrs, AttrTenant.String(string(topic.Tenant)))
	}
	m.parked.Add(context.Background(), 1, metric.WithAttributes(attrs...))
}
