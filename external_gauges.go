package mq

import (
	"cmp"
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// What ExternalNATS watches while it runs: the topology re-check, the history's
// sources, and the gauges that report them.

// watch re-checks the topology and polls the history's sources until Close.
func (e *ExternalNATS) watch(ctx context.Context) {
	defer close(e.watchDone)
	recheck := time.NewTicker(cmp.Or(e.cfg.recheckEvery, recheckInterval))
	defer recheck.Stop()
	poll := time.NewTicker(cmp.Or(e.cfg.pollEvery, sourcePollInterval))
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recheck.C:
			e.recheck(ctx)
		case <-poll.C:
			e.pollHistory(ctx)
		}
	}
}

// recheck verifies the topology again and sets topology_ok to whether no required,
// non-transient finding remains. It is skipped while disconnected, and its result is
// discarded if the connection dropped during it: a check over a dropped connection
// reads the server version as "".
func (e *ExternalNATS) recheck(ctx context.Context) {
	if !e.nc.IsConnected() {
		return
	}
	before := e.nc.Stats().Reconnects
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	findings, err := VerifyNATSTopology(cctx, e.js, e.topo)
	if ctx.Err() != nil || !e.nc.IsConnected() || e.nc.Stats().Reconnects != before {
		return
	}
	if err != nil {
		e.log.Warn("mq: nats topology re-check could not run", "error", err)
		return
	}
	var faults []Finding
	var texts []string
	for _, f := range findings {
		if f.Severity == Required && !f.Transient {
			faults = append(faults, f)
			texts = append(texts, f.String())
		}
	}
	var now *error
	if len(faults) > 0 {
		err := error(&TopologyError{Findings: faults})
		now = &err
	}
	was := e.topologyErr.Swap(now)
	switch {
	case len(faults) > 0:
		e.log.Error("mq: nats topology does not match", "findings", texts)
	case was != nil:
		e.log.Info("mq: nats topology matches again")
	}
}

// pollHistory reads the history's max age, each source's lag and last contact, and
// what each partition holds only for the history.
func (e *ExternalNATS) pollHistory(ctx context.Context) {
	if !e.nc.IsConnected() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	s, err := e.js.Stream(cctx, e.topo.HistoryStream)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("mq: cannot read the history", "stream", e.topo.HistoryStream, "error", err)
		}
		return
	}
	info := s.CachedInfo()
	sources := make(map[string]sourceState, len(info.Sources))
	for _, src := range info.Sources {
		sources[src.Name] = sourceState{lag: int64(min(src.Lag, uint64(maxLag))), active: activeSeconds(src.Active)}
	}
	held := e.heldForHistory(cctx)
	e.mu.Lock()
	e.historyMaxAge = info.Config.MaxAge
	e.sources = sources
	e.held = held
	e.mu.Unlock()
}

// heldForHistory counts, per partition, the events the worker acknowledged that the
// partition still holds: the history's source has not copied them. Measured: a
// history that refuses writes (full, discard new) keeps its source's reported lag at 0
// while acknowledged events pile up on the partition, so the lag gauge alone misses
// that stall; this one shows it.
func (e *ExternalNATS) heldForHistory(ctx context.Context) map[string]int64 {
	held := make(map[string]int64, len(e.core.partitions))
	for _, name := range e.core.partitions {
		s, err := e.js.Stream(ctx, name)
		if err != nil {
			continue
		}
		c, err := s.Consumer(ctx, e.topo.IngestConsumer)
		if err != nil {
			continue
		}
		ci := c.CachedInfo()
		held[name] = max(0, int64(s.CachedInfo().State.Msgs)-int64(ci.NumPending)-int64(ci.NumAckPending))
	}
	return held
}

// activeSeconds converts a source's time since last contact to seconds; the server
// reports -1ns before the first attach, which becomes exactly -1.
func activeSeconds(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return d.Seconds()
}

// registerMetrics registers the core's gauges and what the watch loop reads: the
// topology's state and the history's sources, each source by its stream (mq.stream),
// each partition by its index (mq.partition) and stream.
func (e *ExternalNATS) registerMetrics() error {
	g := e.core.gauges()
	ok := g.int64(metricTopologyOK, "1 while the nats topology has no required finding (transient ones excluded).")
	lag := g.int64(metricSourceLag,
		"Events on a partition the history has yet to copy; a stalled source holds them on the partition.")
	active := g.float64(metricSourceActive,
		"Seconds since the history's source last heard from its partition; -1 before the first attach.")
	held := g.int64(metricHeldForHistory,
		"Events the worker acknowledged that a partition still holds because the history has not copied them.")
	g.then(func(_ context.Context, o metric.Observer) {
		o.ObserveInt64(ok, boolGauge(e.topologyErr.Load() == nil))
		e.mu.Lock()
		defer e.mu.Unlock()
		for name, s := range e.sources {
			attrs := metric.WithAttributes(AttrStream.String(name))
			o.ObserveInt64(lag, s.lag, attrs)
			o.ObserveFloat64(active, s.active, attrs)
		}
		for p, name := range e.core.partitions {
			if n, found := e.held[name]; found {
				o.ObserveInt64(held, n, metric.WithAttributes(AttrPartition.Int(p), AttrStream.String(name)))
			}
		}
	})
	var err error
	e.metrics, err = g.register()
	return err
}
