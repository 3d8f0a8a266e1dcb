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
