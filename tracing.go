package mq

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Tracing follows the OpenTelemetry messaging semantic conventions (semconv v1.43.0):
// a producer span per Publish and DeadLetter, a consumer span per worker delivery,
// one client span per ReplaySince. The hub makes none. Destinations are named by
// their template, never by the subject: the subject holds the tenant id.

// tracerName is the instrumentation scope of the broker's spans.
const tracerName = "github.com/wavehouse/mq"

// AttrDeliveryAttempt is the delivery's attempt number (Message.Attempt) on a
// consumer span: the conventions name no NATS attribute for it.
const AttrDeliveryAttempt = attribute.Key("mq.delivery.attempt")

// natsSystem is messaging.system for NATS, which the conventions list no constant for.
var natsSystem = semconv.MessagingSystemKey.String("nats")

// Operation names of the broker's spans (messaging.operation.name).
const (
	opPublish    = "publish"
	opDeadLetter = "dead_letter"
	opProcess    = "process"
	opReplay     = "replay"
)

// newTracer is the broker's tracer from tp, the global provider when tp is nil.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp != nil {
		return tp.Tracer(tracerName)
	}
	tp = otel.GetTracerProvider()
	if !otelDefault(tp) {
		return tp.Tracer(tracerName)
	}
	return globalTracer{Tracer: tp.Tracer(tracerName), unset: tp}
}

// globalTracer is the tracer of otel's default global provider, taken before the host
// set one. Until the host does, that tracer makes spans that record nothing and only
// carry the parent's span context, which the context carries already: 3 allocations
// per publish and per handler call for nothing (measured). So while the global
// provider is still that default, a span is the no-op span and the context is the
// caller's, which inject the same headers. Once the host sets a provider, even after
// the broker started, every span comes from it.
type globalTracer struct {
	trace.Tracer
	unset trace.TracerProvider // otel's default global provider
}

func (t globalTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if otel.GetTracerProvider() == t.unset {
		return ctx, noSpan
	}
	return t.Tracer.Start(ctx, name, opts...)
}

// noSpan is a span that records nothing, held in an interface once so that returning
// it allocates nothing.
var noSpan = trace.SpanFromContext(context.Background())

// otelDefault reports whether tp is otel's own global provider, the one in place until
// otel.SetTracerProvider is called. Its type is internal to otel, so it is known by
// its name.
func otelDefault(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t != nil && t.Kind() == reflect.Pointer &&
		t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" && t.Elem().Name() == "tracerProvider"
}

// Destination templates: the subjects with their high-cardinality tokens named.
func (s subjects) ingestTemplate() string { return s.prefix + ".ingest.{partition}.{tenant}.{table}" }
func (s subjects) dlqTemplate() string    { return s.prefix + ".dlq.{tenant}.{table}" }

// measured are the attributes a span shares with its operation's metrics: the
// destination as its template and the partition, never the subject.
func measured(template string, partition int) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingDestinationName(template),
		semconv.MessagingDestinationTemplate(template),
	}
	if partition >= 0 {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(partition)))
	}
	return attrs
}

// destination is which of the topology's subjects a send goes to.
type destination int

const (
	toIngest destination = iota
	toDeadLetters
)

// template is d's destination template.
func (s subjects) template(d destination) string {
	if d == toDeadLetters {
		return s.dlqTemplate()
	}
	return s.ingestTemplate()
}

// sendKey names one kind of send: its operation, destination and partition.
type sendKey struct {
	op        string
	dest      destination
	partition int
}

// sendStart is what every send of one kind starts its span and records its metrics
// with. Built once per kind, so a publish builds none of it (measured: 7 allocations
// per Publish). measured has len == cap, so the appends of operation.end copy it.
type sendStart struct {
	name     string
	opts     []trace.SpanStartOption
	measured []attribute.KeyValue
	timed    []attribute.KeyValue // measured and the operation type (operation.timed)
}

// sendStarts caches the sendStart of each kind of send.
type sendStarts struct {
	mu sync.RWMutex
	m  map[sendKey]*sendStart
}

func (c *natsCore) sendStart(k sendKey) *sendStart {
	c.starts.mu.RLock()
	s := c.starts.m[k]
	c.starts.mu.RUnlock()
	if s != nil {
		return s
	}
	template := c.subs.template(k.dest)
	m := slices.Clip(measured(template, k.partition))
	attrs := append([]attribute.KeyValue{natsSystem, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName(k.op)}, m...)
	s = &sendStart{
		name:     "send " + template,
		opts:     []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)},
		measured: m,
		timed:    slices.Clip(append(slices.Clone(m), c.metrics.opDur.AttrOperationType(messagingconv.OperationTypeSend))),
	}
	c.starts.mu.Lock()
	defer c.starts.mu.Unlock()
	if c.starts.m == nil {
		c.starts.m = map[sendKey]*sendStart{}
	}
	c.starts.m[k] = s
	return s
}

// startSend starts the producer span of one send of messages events to dest;
// partition < 0 when the destination has none. The context it returns is what the
// headers must carry; the operation's end records the send's metrics.
func (c *natsCore) startSend(ctx context.Context, op string, dest destination, partition int, tenant TenantID, messages int) (context.Context, *operation) {
	s := c.sendStart(sendKey{op: op, dest: dest, partition: partition})
	ctx, span := c.tracer.Start(ctx, s.name, s.opts...)
	o := c.metrics.startOp(span, op, messagingconv.OperationTypeSend, s.measured)
	o.tenant, o.messages, o.timed = tenant, messages, s.timed
	return ctx, o
}

// processStart is what every handler call of one Consume on one partition starts its
// consumer span and records its metrics with. Built once per partition when the
// Consume starts, so a delivery builds none of it (measured: 17 allocations per
// delivery with a no-op provider). measured has len == cap, so the appends of
// operation.end copy it.
type processStart struct {
	name     string
	opts     []trace.SpanStartOption // the span kind and the attributes every call shares
	measured []attribute.KeyValue
}

// processStarts builds the processStart of each partition for the durable.
func (c *natsCore) processStarts(durable string) []*processStart {
	template := c.subs.ingestTemplate()
	starts := make([]*processStart, len(c.partitions))
	for p := range starts {
		m := slices.Clip(append(measured(template, p), semconv.MessagingConsumerGroupName(durable)))
		attrs := append([]attribute.KeyValue{natsSystem, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName(opProcess)}, m...)
		starts[p] = &processStart{
			name:     "process " + template,
			opts:     []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)},
			measured: m,
		}
	}
	return starts
}

// startProcess starts the consumer span of one handler call on a worker delivery: its
// parent is the producer's span carried by the headers, linked as well; the context
// it returns keeps base's cancellation and values. The delivery's own attributes (its
// attempt and message id) are set only on a span that records: a sampler sees the
// ones every call shares. The call's duration counts from start, the time the worker
// read as it took the event: a clock read per delivery fewer.
func (c *natsCore) startProcess(base context.Context, s *processStart, msg *Message, o *operation, start time.Time) context.Context {
	producer := trace.SpanContextFromContext(otel.GetTextMapPropagator().Extract(context.Background(), headerCarrier(msg.Headers)))
	parent, opts := base, s.opts
	if producer.IsValid() {
		parent = trace.ContextWithRemoteSpanContext(base, producer)
		opts = append(opts[:len(opts):len(opts)], trace.WithLinks(trace.Link{SpanContext: producer}))
	}
	_, span := c.tracer.Start(parent, s.name, opts...)
	if span.IsRecording() {
		span.SetAttributes(AttrDeliveryAttempt.Int(msg.Attempt))
		if msg.ID != "" {
			span.SetAttributes(semconv.MessagingMessageID(msg.ID))
		}
	}
	c.metrics.initOp(o, span, start, opProcess, messagingconv.OperationTypeProcess, s.measured)
	o.messages = 1
	if c.metrics.tenants {
		o.tenant = msg.Topic().Tenant // only counters with MetricsTenants carry it
	}
	// The handler's ctx is base with the span: the producer's context is its parent
	// only, so cancellation stays the consumer's. Without a span (globalTracer) it
	// carries the producer's span context as a span that records nothing would.
	if span == noSpan {
		return parent
	}
	return trace.ContextWithSpan(base, span)
}

// startReplay starts the client span of one ReplaySince on partition's topics, read
// from the history.
// Its operation counts the messages the replay sent as consumed.
func (c *natsCore) startReplay(ctx context.Context, topic Topic, partition int) (context.Context, *operation) {
	template := c.subs.ingestTemplate()
	m := measured(template, partition)
	attrs := append([]attribute.KeyValue{natsSystem, semconv.MessagingOperationTypeReceive, semconv.MessagingOperationName(opReplay)}, m...)
	ctx, span := c.tracer.Start(ctx, "replay "+template,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	o := c.metrics.startOp(span, opReplay, messagingconv.OperationTypeReceive, m)
	o.tenant = topic.Tenant
	return ctx, o
}

// endSpan ends span with err as its status and error.type.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// errorType is error.type of err: the name of the package's sentinel it wraps, a
// context error's, or "_OTHER". Always low-cardinality.
func errorType(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

var sentinels = []struct {
	err  error
	name string
}{
	{ErrClosed, "mq.ErrClosed"},
	{ErrQueueFull, "mq.ErrQueueFull"},
	{ErrUnavailable, "mq.ErrUnavailable"},
	{ErrPayloadTooLarge, "mq.ErrPayloadTooLarge"},
	{ErrInvalidHeader, "mq.ErrInvalidHeader"},
	{ErrInvalidTopic, "mq.ErrInvalidTopic"},
	{ErrInvalidTenant, "mq.ErrInvalidTenant"},
	{ErrTopology, "mq.ErrTopology"},
	{ErrNoDeadLetterQueue, "mq.ErrNoDeadLetterQueue"},
	{ErrConsumerNotFound, "mq.ErrConsumerNotFound"},
	{ErrDeliveryEnded, "mq.ErrDeliveryEnded"},
	{ErrInvalidConfig, "mq.ErrInvalidConfig"},
	{errHandlerPanicked, "panic"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
}
