package main

import (
	"context"
	"fmt"

	"github.com/wavehouse/mq"
)

// The dead letters: the broker's counts per tenant and table.

// demoDeadLetters is what the dead-letter step read.
type demoDeadLetters struct {
	counts map[mq.TenantID]mq.DeadLetterCounts
}

// deadLetters counts every tenant's parked events.
func (d *demoRun) deadLetters(ctx context.Context) (demoDeadLetters, error) {
	dl := demoDeadLetters{counts: map[mq.TenantID]mq.DeadLetterCounts{}}
	for _, t := range demoTenants {
		c, err := d.broker.DeadLetterCounts(ctx, t, "")
		if err != nil {
			return dl, fmt.Errorf("dead-letter counts %s: %w", t, err)
		}
		dl.counts[t] = c
	}
	poison := d.plan.poison
	narrowed, err := d.broker.DeadLetterCounts(ctx, poison.Tenant, poison.Table)
	if err != nil {
		return dl, fmt.Errorf("dead-letter counts %s %s: %w", poison.Tenant, poison.Table, err)
	}
	d.check(fmt.Sprintf("dead-lettered %s/%s (table filter)", poison.Tenant, poison.Table), narrowed.Tables[poison.Table], 1)
	for _, t := range demoTenants {
		want := map[string]uint64{}
		if t == poison.Tenant {
			want[poison.Table] = 1
		}
		d.check("dead-lettered "+string(t)+" per table", formatCounts(dl.counts[t].Tables), formatCounts(want))
		d.check("dead-lettered "+string(t)+" total", dl.counts[t].Total, uint64(len(want)))
	}
	d.printf("parked: %s", formatTotals(dl.counts))
	return dl, nil
}
