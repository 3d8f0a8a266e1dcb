package main

import (
	"context"
	"fmt"
	"time"

	"github.com/wavehouse/mq"
)

// hub is the live subscription's handler: it counts and checks per-tenant order.
func (d *demoRun) hub(msg *mq.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.decode("hub", msg)
	if !ok {
		return nil
	}
	d.hubSeen++
	if last := d.hubLast[ev.Tenant]; ev.Seq != last+1 {
		d.problem("hub: %s after %s#%d: out of order", ev.id(), ev.Tenant, last)
	}
	d.hubLast[ev.Tenant] = ev.Seq
	return nil
}

// replay counts the events ReplaySince sends for the plan's replay topic since since,
// checking topic, stored time and order.
func (d *demoRun) replay(ctx context.Context, since time.Time) (int, error) {
	n, last := 0, 0
	err := d.broker.ReplaySince(ctx, d.plan.replayTo, since, func(msg *mq.Message) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		ev, ok := d.decode("replay", msg)
		switch {
		case !ok:
		case ev.topic() != d.plan.replayTo:
			d.problem("replay: %s of topic %s in a replay of %s", ev.id(), ev.topic(), d.plan.replayTo)
		case msg.Timestamp.Before(since):
			d.problem("replay: %s stored %s, before since %s", ev.id(), msg.Timestamp, since)
		case ev.Seq <= last:
			d.problem("replay: %s after #%d: out of order", ev.id(), last)
		}
		last = ev.Seq
		n++
		return true
	})
	if err != nil {
		return n, fmt.Errorf("replay %s: %w", d.plan.replayTo, err)
	}
	return n, nil
}
