package mq

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The observable gauges both NATS brokers share: the connection, and each worker's
// view of the partitions it holds. Each broker adds its own in one callback.

// workerViewTimeout bounds the consumer info requests of one collection.
const workerViewTimeout = 2 * time.Second

// gaugeSet builds a broker's gauges and registers them under one callback.
type gaugeSet struct {
	meter   metric.Meter
	err     error
	insts   []metric.Observable
	observe []func(context.Context, metric.Observer)
}

func (g *gaugeSet) int64(name, description string) metric.Int64ObservableGauge {
	if g.err != nil {
		return nil
	}
	i, err := g.meter.Int64ObservableGauge(name, metric.WithDescription(description), metric.WithUnit(unitOf(name)))
	g.err = err
	g.insts = append(g.insts, i)
	return i
}

func (g *gaugeSet) float64(name, description string) metric.Float64ObservableGauge {
	if g.err != nil {
		return nil
	}
	i, err := g.meter.Float64ObservableGauge(name, metric.WithDescription(description), metric.WithUnit(unitOf(name)))
	g.err = err
	g.insts = append(g.insts, i)
	return i
}

// then adds an observation to the callback.
func (g *gaugeSet) then(f func(context.Context, metric.Observer)) { g.observe = append(g.observe, f) }

func (g *gaugeSet) register() (metric.Registration, error) {
	if g.err != nil {
		return nil, g.err
	}
	return g.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, f := range g.observe {
			f(ctx, o)
		}
		return nil
	}, g.insts...)
}

// gauges starts the broker's gauge set with the core's: mq.connected and the worker
// view (mq.worker.*) of the partitions this process's workers hold.
func (c *natsCore) gauges() *gaugeSet {
	g := &gaugeSet{meter: c.metrics.meter}
	connected := g.int64(metricConnected, "1 while the broker is connected to nats.")
	pending := g.int64(metricWorkerPending,
		"Events on a partition this process's worker holds that the ingest durable has yet to deliver.")
	ackPending := g.int64(metricWorkerAckPend,
		"Events of a partition this process's worker holds that were delivered and are not yet acknowledged.")
	redelivered := g.int64(metricWorkerRedeliver,
		"Events of a partition this process's worker holds that were delivered more than once and are not yet acknowledged.")
	g.then(func(ctx context.Context, o metric.Observer) {
		o.ObserveInt64(connected, boolGauge(c.nc.IsConnected()))
		for _, v := range c.workerView(ctx) {
			attrs := metric.WithAttributes(AttrPartition.Int(v.partition))
			o.ObserveInt64(pending, v.pending, attrs)
			o.ObserveInt64(ackPending, v.ackPending, attrs)
			o.ObserveInt64(redelivered, v.redelivered, attrs)
		}
	})
	return g
}

// partitionView is the ingest durable's state on one partition a worker holds.
type partitionView struct {
	partition                        int
	pending, ackPending, redelivered int64
}

// workerView reads the durable's state on every partition this process's workers
// hold: one consumer info request each, so it is read at collection only.
func (c *natsCore) workerView(ctx context.Context) []partitionView {
	held := map[int][2]string{} // partition: stream, durable
	c.mu.Lock()
	workers := slices.Collect(maps.Keys(c.workers))
	c.mu.Unlock()
	for _, d := range workers {
		d.mu.Lock()
		for p, u := range d.units {
			held[p] = [2]string{u.stream, d.durable}
		}
		d.mu.Unlock()
	}
	if len(held) == 0 || !c.nc.IsConnected() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, workerViewTimeout)
	defer cancel()
	views := make([]partitionView, 0, len(held))
	for _, p := range slices.Sorted(maps.Keys(held)) {
		cons, err := c.js.Consumer(ctx, held[p][0], held[p][1])
		if err != nil {
			continue // gone or unanswered: no value rather than a wrong one
		}
		ci := cons.CachedInfo()
		views = append(views, partitionView{partition: p, pending: int64(min(ci.NumPending, uint64(maxLag))),
			ackPending: int64(ci.NumAckPending), redelivered: int64(ci.NumRedelivered)})
	}
	return views
}

// addWorker registers d's partitions with the worker view until forget.
func (c *natsCore) addWorker(d *dispatcher) (forget func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers == nil {
		c.workers = map[*dispatcher]struct{}{}
	}
	c.workers[d] = struct{}{}
	return func() {
		c.mu.Lock()
		delete(c.workers, d)
		c.mu.Unlock()
	}
}

// tenantAttrs are the attributes of a per-tenant gauge: its partition, and the tenant
// only with MetricsTenants (else the gauge sums the partition's tenants).
func (c *natsCore) tenantAttrs(t TenantID) attribute.Set {
	attrs := []attribute.KeyValue{AttrPartition.Int(Partition(t, c.topo.Partitions))}
	if c.metrics.tenants {
		attrs = append(attrs, AttrTenant.String(string(t)))
	}
	return attribute.NewSet(attrs...)
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
