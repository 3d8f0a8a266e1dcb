package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// demoTelemetry holds what the demo's broker recorded: its metrics, read through a
// manual reader, and its spans, kept in memory.
type demoTelemetry struct {
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tracer *sdktrace.TracerProvider
}

// newDemoTelemetry sets the W3C trace context as the global propagator, so an
// event's headers carry its publisher's span to the worker.
func newDemoTelemetry() *demoTelemetry {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t := &demoTelemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	t.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(t.reader))
	t.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(t.spans))
	return t
}

func (t *demoTelemetry) shutdown() {
	_ = t.meters.Shutdown(context.Background())
	_ = t.tracer.Shutdown(context.Background())
}

// demoSeries is one instrument's totals: a counter's sum, a histogram's samples, a
// gauge's points summed, by the operation (and error.type) they carry.
type demoSeries struct {
	name, kind string
	by         map[string]float64
}

func (s demoSeries) total() float64 {
	var n float64
	for _, v := range s.by {
		n += v
	}
	return n
}

// collect reads every instrument's totals now, by name.
func (t *demoTelemetry) collect(ctx context.Context) (map[string]demoSeries, error) {
	var rm metricdata.ResourceMetrics
	if err := t.reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	out := map[string]demoSeries{}
	add := func(name, kind string, attrs attribute.Set, v float64) {
		s, ok := out[name]
		if !ok {
			s = demoSeries{name: name, kind: kind, by: map[string]float64{}}
			out[name] = s
		}
		s.by[seriesKey(attrs)] += v
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, "counter", p.Attributes, float64(p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(m.Name, "histogram", p.Attributes, float64(p.Count))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, "gauge", p.Attributes, float64(p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					add(m.Name, "gauge", p.Attributes, p.Value)
				}
			}
		}
	}
	return out, nil
}

// seriesKey names a point by its operation and error.type, or its table: the
// breakdown the summary prints.
func seriesKey(attrs attribute.Set) string {
	var parts []string
	if v, ok := attrs.Value(semconv.MessagingOperationNameKey); ok {
		parts = append(parts, v.AsString())
	}
	if v, ok := attrs.Value("mq.table"); ok {
		parts = append(parts, v.AsString())
	}
	if v, ok := attrs.Value(semconv.ErrorTypeKey); ok {
		parts = append(parts, "["+v.AsString()+"]")
	}
	return strings.Join(parts, " ")
}

// demoTraces is what the spans show: how many of each name, and one publish whose
// delivery's span is its child in the same trace.
type demoTraces struct {
	counts              map[string]int
	shared              trace.TraceID
	sendName, procName  string
	sharedBySendAndProc bool
}

func (t *demoTelemetry) traces() demoTraces {
	tr := demoTraces{counts: map[string]int{}}
	ended := t.spans.Ended()
	sends := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range ended {
		tr.counts[s.Name()]++
		if s.SpanKind() == trace.SpanKindProducer {
			sends[s.SpanContext().SpanID()] = s
		}
	}
	for _, s := range ended {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		if send, ok := sends[s.Parent().SpanID()]; ok && send.SpanContext().TraceID() == s.SpanContext().TraceID() {
			tr.shared, tr.sendName, tr.procName, tr.sharedBySendAndProc = s.SpanContext().TraceID(), send.Name(), s.Name(), true
			break
		}
	}
	return tr
}

// telemetrySummary prints each instrument's total and its breakdown, then each span
// name's count and the trace a publish and its delivery share.
func telemetrySummary(out io.Writer, metrics map[string]demoSeries, tr demoTraces) {
	fmt.Fprintln(out, "\nmetrics (OpenTelemetry, read through a manual reader)")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  instrument\tkind\ttotal\tby operation [error.type] / table")
	for _, name := range slices.Sorted(maps.Keys(metrics)) {
		s := metrics[name]
		var by []string
		for _, k := range slices.Sorted(maps.Keys(s.by)) {
			if k != "" {
				by = append(by, k+"="+strconv.FormatFloat(s.by[k], 'f', -1, 64))
			}
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", name, s.kind, strconv.FormatFloat(s.total(), 'f', -1, 64), orDash(strings.Join(by, ", ")))
	}
	_ = w.Flush()

	fmt.Fprintln(out, "\nspans")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, name := range slices.Sorted(maps.Keys(tr.counts)) {
		fmt.Fprintf(w, "  %s\t%d\n", name, tr.counts[name])
	}
	_ = w.Flush()
	if tr.sharedBySendAndProc {
		fmt.Fprintf(out, "  trace %s: %q and its delivery %q\n", tr.shared, tr.sendName, tr.procName)
	} else {
		fmt.Fprintln(out, "  no delivery's span is in its publish's trace")
	}
}

// checkTelemetry checks the metrics against the demo's own counts, and that a
// publish and its delivery share a trace.
func (d *demoRun) checkTelemetry(metrics map[string]demoSeries, tr demoTraces) {
	d.mu.Lock()
	defer d.mu.Unlock()
	singles := d.plan.half * len(demoTenants)
	d.check("metric messaging.client.sent.messages, publish", metrics["messaging.client.sent.messages"].by["publish"], float64(d.plan.total))
	d.check("metric messaging.client.sent.messages, publish refused [mq.ErrQueueFull]",
		metrics["messaging.client.sent.messages"].by["publish [mq.ErrQueueFull]"], 1.0)
	d.check("metric messaging.client.operation.duration samples, publish (Publish and PublishBatch calls)",
		metrics["messaging.client.operation.duration"].by["publish"], float64(singles+d.batches))
	d.check("metric messaging.client.consumed.messages, process (handler calls)",
		metrics["messaging.client.consumed.messages"].by["process"], float64(d.fleet.calls))
	d.check("metric messaging.client.consumed.messages, replay", metrics["messaging.client.consumed.messages"].by["replay"], float64(d.replayed))
	d.check("metric messaging.process.duration samples with an error (poison attempts)",
		metrics["messaging.process.duration"].by["process [_OTHER]"], float64(len(d.fleet.poison)))
	d.check("metric mq.dead_letter.parked", metrics["mq.dead_letter.parked"].total(), 1.0)
	d.check("a publish and its delivery share a trace", tr.sharedBySendAndProc, true)
}
