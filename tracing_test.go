package mq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

var setPropagator sync.Once

// openTraced starts an embedded broker whose spans rec records, with the W3C trace
// context as the global propagator (a process's usual setup; the default carries
// nothing), and gives tenant acme a budget.
func openTraced(t *testing.T, mutate ...func(*EmbeddedOptions)) (*EmbeddedNATS, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	setPropagator.Do(func() { otel.SetTextMapPropagator(propagation.TraceContext{}) })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := openEmbedded(t, "", append([]func(*EmbeddedOptions){func(o *EmbeddedOptions) { o.TracerProvider = tp }}, mutate...)...)
	require.NoError(t, e.SetMaxBytes(testCtx(t), "acme", 1<<20))
	return e, rec, tp.Tracer("test")
}

// ended returns the ended spans named name, waiting until there are at least n.
func ended(t *testing.T, rec *tracetest.SpanRecorder, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	var got []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		got = got[:0]
		for _, s := range rec.Ended() {
			if s.Name() == name {
				got = append(got, s)
			}
		}
		return len(got) >= n
	}, 10*time.Second, 5*time.Millisecond, "waiting for %d %q spans", n, name)
	return got
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

type ctxKey struct{}

func TestTrace_WorkerMessageCtxCarriesThePublishersTraceInItsConsumerSpan(t *testing.T) {
	e, rec, tracer := openTraced(t)
	ctx := testCtx(t)
	reqCtx, req := tracer.Start(ctx, "api request")
	topic := Topic{Tenant: "acme", Table: "orders"}
	require.NoError(t, e.Publish(reqCtx, topic, []byte("x"), WithIdempotencyKey("k1")))
	req.End()

	type seen struct {
		span    trace.SpanContext
		headers Headers
		value   any
		ctxErr  error
	}
	got := make(chan seen, 1)
	consumerCtx := context.WithValue(ctx, ctxKey{}, "consumer")
	c, err := e.CreateConsumer(consumerCtx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error {
		select {
		case got <- seen{trace.SpanContextFromContext(m.Ctx), m.Headers, m.Ctx.Value(ctxKey{}), m.Ctx.Err()}:
		default:
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	var s seen
	select {
	case s = <-got:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}

	assert.Equal(t, req.SpanContext().TraceID(), s.span.TraceID(), "the handler's ctx is in the publisher's trace")
	assert.Equal(t, "consumer", s.value, "Message.Ctx is derived from the CreateConsumer ctx")
	assert.NoError(t, s.ctxErr)

	sends := ended(t, rec, "send wh.ingest.{partition}.{tenant}.{table}", 1)
	require.Len(t, sends, 1)
	send := sends[0]
	assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
	assert.Equal(t, req.SpanContext().SpanID(), send.Parent().SpanID(), "the producer span is the caller's child")
	carried := trace.SpanContextFromContext(otel.GetTextMapPropagator().Extract(context.Background(), headerCarrier(s.headers)))
	assert.True(t, carried.Equal(send.SpanContext().WithRemote(true)), "the headers carry the producer span: %v vs %v", carried, send.SpanContext())
	a := attrs(send)
	assert.Equal(t, "nats", a[semconv.MessagingSystemKey].AsString())
	assert.Equal(t, "send", a[semconv.MessagingOperationTypeKey].AsString())
	assert.Equal(t, opPublish, a[semconv.MessagingOperationNameKey].AsString())
	assert.Equal(t, "wh.ingest.{partition}.{tenant}.{table}", a[semconv.MessagingDestinationNameKey].AsString())
	assert.Equal(t, "k1", a[semconv.MessagingMessageIDKey].AsString())
	assert.Contains(t, a, semconv.MessagingDestinationPartitionIDKey)
	assert.Equal(t, codes.Unset, send.Status().Code)

	procs := ended(t, rec, "process wh.ingest.{partition}.{tenant}.{table}", 1)
	proc := procs[0]
	assert.Equal(t, trace.SpanKindConsumer, proc.SpanKind())
	assert.Equal(t, s.span.SpanID(), proc.SpanContext().SpanID(), "Message.Ctx carries the consumer span")
	assert.Equal(t, send.SpanContext().SpanID(), proc.Parent().SpanID(), "the producer span is the consumer span's parent")
	require.Len(t, proc.Links(), 1)
	assert.Equal(t, send.SpanContext().SpanID(), proc.Links()[0].SpanContext.SpanID(), "and its link")
	a = attrs(proc)
	assert.Equal(t, "process", a[semconv.MessagingOperationTypeKey].AsString())
	assert.Equal(t, e.topo.IngestConsumer, a[semconv.MessagingConsumerGroupNameKey].AsString())
	assert.Equal(t, int64(1), a[AttrDeliveryAttempt].AsInt64())
	assert.Equal(t, a[semconv.MessagingDestinationPartitionIDKey], attrs(send)[semconv.MessagingDestinationPartitionIDKey])
	assert.Equal(t, "k1", a[semconv.MessagingMessageIDKey].AsString())
	for _, sp := range append(sends, procs...) {
		for _, kv := range sp.Attributes() {
			assert.NotContains(t, kv.Value.String(), "acme", "%s: %s holds the tenant", sp.Name(), kv.Key)
		}
	}
}

func TestSpan_FailedHandlerMarksTheConsumerSpanAndItsParkIsAProducerSpan(t *testing.T) {
	e, rec, _ := openTraced(t)
	ctx := testCtx(t)
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte("poison")))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, MaxDeliveries: 1})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(*Message) error { return errors.New("bad row") }, 0)
	require.NoError(t, err)
	defer stop()

	parks := ended(t, rec, "send wh.dlq.{tenant}.{table}", 1)
	procs := ended(t, rec, "process wh.ingest.{partition}.{tenant}.{table}", 1)
	proc := procs[0]
	assert.Equal(t, codes.Error, proc.Status().Code)
	assert.Equal(t, "bad row", proc.Status().Description)
	assert.Equal(t, "_OTHER", attrs(proc)[semconv.ErrorTypeKey].AsString())
	park := parks[0]
	assert.Equal(t, trace.SpanKindProducer, park.SpanKind())
	assert.Equal(t, opDeadLetter, attrs(park)[semconv.MessagingOperationNameKey].AsString())
	assert.Equal(t, proc.SpanContext().SpanID(), park.Parent().SpanID(), "the park is part of the failed attempt")
	assert.Equal(t, codes.Unset, park.Status().Code)
}

func TestSpan_DeadLetterAndAFailedPublishMakeProducerSpans(t *testing.T) {
	e, rec, tracer := openTraced(t)
	ctx := testCtx(t)
	callCtx, call := tracer.Start(ctx, "operator")
	msg := NewMessage(ctx, Topic{Tenant: "acme", Table: "orders"}, []byte("x"))
	require.NoError(t, e.DeadLetter(callCtx, msg))
	call.End()
	park := ended(t, rec, "send wh.dlq.{tenant}.{table}", 1)[0]
	assert.Equal(t, call.SpanContext().TraceID(), park.SpanContext().TraceID())
	assert.Equal(t, "dead_letter", attrs(park)[semconv.MessagingOperationNameKey].AsString())
	assert.NotContains(t, attrs(park), semconv.MessagingDestinationPartitionIDKey)

	err := e.Publish(ctx, Topic{Tenant: "nobudget", Table: "orders"}, []byte("x"))
	require.ErrorIs(t, err, ErrQueueFull)
	sends := ended(t, rec, "send wh.ingest.{partition}.{tenant}.{table}", 1)
	assert.Equal(t, codes.Error, sends[0].Status().Code)
	assert.Equal(t, "mq.ErrQueueFull", attrs(sends[0])[semconv.ErrorTypeKey].AsString())
}

func TestSpan_ReplayMakesOneSpanPerCall(t *testing.T) {
	e, rec, _ := openTraced(t)
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "orders"}
	for range 3 {
		require.NoError(t, e.Publish(ctx, topic, []byte("x")))
	}
	require.Eventually(t, func() bool { return replayCount(t, e, topic) == 3 }, 30*time.Second, 10*time.Millisecond)
	rec.Reset()
	var inReplay []trace.SpanContext
	require.NoError(t, e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		inReplay = append(inReplay, trace.SpanContextFromContext(m.Ctx))
		return true
	}))
	replays := ended(t, rec, "replay wh.ingest.{partition}.{tenant}.{table}", 1)
	require.Len(t, replays, 1)
	r := replays[0]
	assert.Equal(t, trace.SpanKindClient, r.SpanKind())
	assert.Equal(t, int64(3), attrs(r)[semconv.MessagingBatchMessageCountKey].AsInt64())
	assert.Equal(t, "receive", attrs(r)[semconv.MessagingOperationTypeKey].AsString())
	require.Len(t, inReplay, 3)
	for _, sc := range inReplay {
		assert.Equal(t, r.SpanContext().SpanID(), sc.SpanID(), "the messages sent carry the replay's span")
	}
}

func TestErrorType_NamesTheSentinel(t *testing.T) {
	assert.Equal(t, "mq.ErrUnavailable", errorType(errors.Join(errors.New("x"), ErrUnavailable)))
	assert.Equal(t, "context.Canceled", errorType(context.Canceled))
	assert.Equal(t, "_OTHER", errorType(errors.New("handler")))
}

// TestSpan_AnInputRefusalMakesNoSpanForPublishOrABatch: an invalid topic is refused
// before a send begins, by Publish and by PublishBatch alike, and leaves no span; a
// batch that fails after it began has one.
func TestSpan_AnInputRefusalMakesNoSpanForPublishOrABatch(t *testing.T) {
	e, rec, _ := openTraced(t)
	ctx := testCtx(t)
	require.ErrorIs(t, e.Publish(ctx, Topic{Tenant: "acme"}, []byte("x")), ErrInvalidTopic)
	bad := Batch{Tenant: "acme", Events: []BatchEvent{{Table: "t", Data: []byte("ok")}, {Data: []byte("no table")}}}
	require.ErrorIs(t, e.PublishBatch(ctx, bad), ErrInvalidTopic)
	assert.Empty(t, rec.Ended(), "a refused topic made a span")

	full := Batch{Tenant: "nobudget", Events: []BatchEvent{{Table: "t", Data: []byte("x")}}}
	require.ErrorIs(t, e.PublishBatch(ctx, full), ErrQueueFull)
	sends := ended(t, rec, "send wh.ingest.{partition}.{tenant}.{table}", 1)
	assert.Equal(t, "mq.ErrQueueFull", attrs(sends[0])[semconv.ErrorTypeKey].AsString())
}

// A broker on the global provider, opened before the host set one, passes the
// caller's trace through to the handler without spans of its own, and records its
// spans once the host sets a provider. Only this test sets the global provider.
func TestTrace_GlobalProviderPassesTheTraceOnUntilSetThenRecordsSpans(t *testing.T) {
	if !otelDefault(otel.GetTracerProvider()) {
		t.Skip("a global tracer provider was set earlier in this process")
	}
	setPropagator.Do(func() { otel.SetTextMapPropagator(propagation.TraceContext{}) })
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "orders"}
	got := make(chan trace.SpanContext, 2)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error {
		got <- trace.SpanContextFromContext(m.Ctx)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	delivered := func() trace.SpanContext {
		t.Helper()
		select {
		case sc := <-got:
			return sc
		case <-ctx.Done():
			t.Fatal("no delivery")
			return trace.SpanContext{}
		}
	}

	// The caller's trace, as an incoming request carries it.
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	require.NoError(t, e.Publish(trace.ContextWithRemoteSpanContext(ctx, caller), topic, []byte("before")))
	sc := delivered()
	assert.Equal(t, caller.TraceID(), sc.TraceID(), "the handler's ctx is in the caller's trace")
	assert.Equal(t, caller.SpanID(), sc.SpanID(), "with no span of the broker's between them")

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider()) // nothing records for later tests
	})
	require.NoError(t, e.Publish(trace.ContextWithRemoteSpanContext(ctx, caller), topic, []byte("after")))
	sc = delivered()
	sends := ended(t, rec, "send wh.ingest.{partition}.{tenant}.{table}", 1)
	require.Len(t, sends, 1, "a publish after the provider was set makes its producer span")
	assert.Equal(t, caller.SpanID(), sends[0].Parent().SpanID())
	procs := ended(t, rec, "process wh.ingest.{partition}.{tenant}.{table}", 1)
	assert.Equal(t, procs[0].SpanContext().SpanID(), sc.SpanID(), "the handler's ctx carries the consumer span")
	assert.Equal(t, sends[0].SpanContext().SpanID(), procs[0].Parent().SpanID())
}

func TestOtelDefault_KnowsOnlyOtelsOwnGlobalProvider(t *testing.T) {
	assert.False(t, otelDefault(noop.NewTracerProvider()))
	assert.False(t, otelDefault(sdktrace.NewTracerProvider()))
	assert.False(t, otelDefault(nil))
}
