//go:build integration

package mq

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracedConfig records an ExternalNATS's spans in a recorder of its own, as one process.
func tracedConfig(t *testing.T) (*tracetest.SpanRecorder, func(*NATSConfig), trace.Tracer) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, func(c *NATSConfig) { c.TracerProvider = tp }, tp.Tracer("test")
}

func TestTrace_PublishAndDeliveryShareATraceAcrossTwoBrokersConnections(t *testing.T) {
	setPropagator.Do(func() { otel.SetTextMapPropagator(propagation.TraceContext{}) })
	f := newExternalFixture(t)
	pubRec, pubCfg, tracer := tracedConfig(t)
	subRec, subCfg, _ := tracedConfig(t)
	publisher, worker := f.broker(t, pubCfg), f.broker(t, subCfg)
	ctx := testCtx(t)

	reqCtx, req := tracer.Start(ctx, "api request")
	require.NoError(t, publisher.Publish(reqCtx, Topic{Tenant: "acme", Table: "orders"}, []byte("x")))
	req.End()

	got := make(chan trace.SpanContext, 1)
	c, err := worker.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error {
		select {
		case got <- trace.SpanContextFromContext(m.Ctx):
		default:
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	var inHandler trace.SpanContext
	select {
	case inHandler = <-got:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}

	template := publisher.core.subs.ingestTemplate()
	send := ended(t, pubRec, "send "+template, 1)[0]
	proc := ended(t, subRec, "process "+template, 1)[0]
	assert.Equal(t, req.SpanContext().TraceID(), inHandler.TraceID(), "the worker's handler is in the publisher's trace")
	assert.Equal(t, send.SpanContext().TraceID(), proc.SpanContext().TraceID())
	assert.Equal(t, send.SpanContext().SpanID(), proc.Parent().SpanID())
	assert.True(t, proc.Parent().IsRemote(), "the parent came from the other connection, through the headers")
	assert.Empty(t, ended(t, subRec, "process "+template, 0)[1:], "one delivery, one consumer span")
}
