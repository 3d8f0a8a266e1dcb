package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/wavehouse/mq"
)

// publish publishes every tenant's events[from:to], one goroutine per tenant so each
// tenant's events go out in order while tenants run concurrently.
func (d *demoRun) publish(ctx context.Context, from, to int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(demoTenants))
	for i, tenant := range demoTenants {
		wg.Go(func() {
			for _, ev := range d.plan.events[tenant][from:to] {
				data, err := json.Marshal(ev)
				if err != nil {
					errs[i] = err
					return
				}
				if err := d.broker.Publish(ctx, ev.topic(), data, mq.WithHeader("X-Demo-Id", ev.id())); err != nil {
					errs[i] = fmt.Errorf("publish %s %s: %w", ev.id(), ev.topic(), err)
					return
				}
				d.mu.Lock()
				d.published++
				d.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// demoBatchSize is the events of one PublishBatch call: an HTTP request's rows.
const demoBatchSize = 25

// publishBatches publishes every tenant's events[from:to] as atomic batches of
// demoBatchSize, one goroutine per tenant, so the summary shows PublishBatch
// confirming every event once, in order, beside the single publishes.
func (d *demoRun) publishBatches(ctx context.Context, from, to int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(demoTenants))
	for i, tenant := range demoTenants {
		wg.Go(func() {
			evs := d.plan.events[tenant][from:to]
			for len(evs) > 0 {
				n := min(demoBatchSize, len(evs))
				b := mq.Batch{Tenant: tenant, Atomic: true}
				for _, ev := range evs[:n] {
					data, err := json.Marshal(ev)
					if err != nil {
						errs[i] = err
						return
					}
					b.Events = append(b.Events, mq.BatchEvent{Table: ev.topic().Table, Scope: ev.topic().Scope, Data: data,
						Options: []mq.PublishOpt{mq.WithHeader("X-Demo-Id", ev.id())}})
				}
				if err := d.broker.PublishBatch(ctx, b); err != nil {
					errs[i] = fmt.Errorf("publish batch of %s from %s: %w", tenant, evs[0].id(), err)
					return
				}
				d.mu.Lock()
				d.published += n
				d.batches++
				d.mu.Unlock()
				evs = evs[n:]
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
