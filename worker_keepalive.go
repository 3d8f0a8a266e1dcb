package mq

import (
	"cmp"
	"time"
)

// The worker's keep-alive: the ack waits of events held in lanes are extended, and the
// waits for retried events to come back are pushed back by the time the process did
// not run or the connection was down.

// keepAlive runs every keepAlivePeriod, or a sixth of the shortest ack wait, never
// more often than minKeepAlivePeriod.
const (
	keepAlivePeriod    = time.Second
	minKeepAlivePeriod = 20 * time.Millisecond
)

// keepAlive tells the server every AckWait/3 that the events waiting in a lane are
// still being worked on, so a tenant held by a retry or by a slow call does not see
// them redelivered behind its back; and it stops waiting for a failed event that did
// not come back in time (another worker took it), so its lane goes on, and has it
// parked if its partition lost it (checkVanished).
func (d *dispatcher) keepAlive() {
	tick := time.NewTicker(keepAlivePeriod)
	defer tick.Stop()
	period, last := keepAlivePeriod, time.Now()
	for {
		select {
		case <-d.endTick:
			return
		case <-d.retick:
			// A partition was taken: its ack wait may want ticks sooner than this
			// period. Waiting for the tick in force first let an ack wait under a
			// second run out before its first extension (a reviewer measured it: an
			// event held behind a 900 ms call under a 400 ms ack wait came twice).
			// The tick after the reset is due period after last, for the stall check.
			d.mu.Lock()
			next := d.tickPeriod()
			d.mu.Unlock()
			if since := time.Since(last); next < period-since {
				period = since + next
				tick.Reset(next)
			}
			continue
		case <-tick.C:
		}
		var waiting []*entry
		d.mu.Lock()
		now := time.Now()
		d.ticked.Store(&now)
		switch elapsed := now.Sub(last); {
		case !d.core.nc.IsConnected():
			// Nothing can come back while the connection is down: a wait for a
			// retried event released then ran its tenant's later events first (a
			// probe saw it, with the server down 16 s). The waits stand still.
			d.extendWaits(elapsed)
		case elapsed-period > stallSlack:
			d.stalled(elapsed - period)
		}
		last = now
		period = d.tickPeriod()
		tick.Reset(period)
		for _, u := range d.units {
			d.endLostWait(u, now)
			if b := u.backlog; b != nil && b.over(now) {
				why := "no event arrived for a while"
				if now.After(b.until) {
					why = "an ack wait passed"
				}
				if len(b.tenants) > 0 {
					d.core.log.Warn("mq: events pending since the broker opened did not come back within an ack wait; their tenants go on",
						"stream", u.stream, "tenants", len(b.tenants))
				}
				d.endBacklog(u, why, 0)
			}
		}
		var vanished []vanishedCheck
		for _, l := range d.lanes {
			if l.blocked != nil && now.After(l.until) {
				d.core.log.Warn("mq: a retried event did not come back; its tenant goes on",
					"stream", d.core.partitions[l.part], "seq", l.blocked.seq, "tenant", l.tenant)
				// Only an event this unit delivered and nak'ed: one whose ack may have
				// reached the server unanswered (wasUnsent) is not lost when gone.
				e, u := l.blocked, d.units[l.part]
				if u != nil && e.u == u && !u.isReleasing() && !d.over() && !e.made(wasUnsent|wasAcked) {
					if t := d.tries[eventRef{e.part, e.seq}]; t != nil {
						vanished = append(vanished, vanishedCheck{e: e, tries: t, last: t.last})
					}
				}
				if u != nil {
					d.unblock(u, l)
				} else {
					l.blocked = nil
				}
				d.schedule(l)
			}
			for _, e := range l.queue {
				if u := d.units[e.part]; u != nil && d.due(u, e, now) {
					waiting = append(waiting, e)
				}
			}
		}
		d.sweepLanes()
		if len(vanished) > 0 {
			d.checks.Add(1)
			go d.checkVanished(vanished)
		}
		d.mu.Unlock()
		for _, e := range waiting {
			_ = e.m.InProgress()
		}
	}
}

// tickPeriod is keepAlivePeriod, or a sixth of the shortest ack wait of the
// partitions taken, never less than minKeepAlivePeriod. Called with d.mu held.
func (d *dispatcher) tickPeriod() time.Duration {
	period := keepAlivePeriod
	for _, u := range d.units {
		if u.ackWait > 0 {
			period = min(period, max(u.ackWait/6, minKeepAlivePeriod))
		}
	}
	return period
}

// stallSlack is how much later than its period a keepAlive tick may come before the
// delay counts as a stall of the process.
const stallSlack = time.Second

// stalled pushes back, by lost, every wait for an event to come back. A tick that
// much late means this process did not run (a VM or container paused, a SIGSTOP, a
// starved machine): no redelivery could arrive meanwhile, so a deadline that passed
// during the stall says nothing of the event, and giving up on it would run its
// tenant's later events first (a probe saw it, after a 12 s SIGSTOP). Called with
// d.mu held.
func (d *dispatcher) stalled(lost time.Duration) {
	d.core.log.Warn("mq: the worker did not run for a while; its waits for retried events are extended by as much", "stalled", lost.Round(time.Millisecond))
	d.extendWaits(lost)
}

// extendWaits pushes back, by lost, every wait for an event to come back. Called with
// d.mu held.
func (d *dispatcher) extendWaits(lost time.Duration) {
	for _, l := range d.lanes {
		if l.blocked != nil {
			l.until = l.until.Add(lost)
		}
	}
	for _, u := range d.units {
		if b := u.backlog; b != nil {
			b.until, b.lastAt = b.until.Add(lost), b.lastAt.Add(lost)
		}
		if w := u.lost; w != nil {
			w.until = w.until.Add(lost)
		}
	}
}

// due reports whether e, waiting in a lane, needs its ack wait extended now: it was
// delivered (or last extended) a third of the ack wait ago.
func (d *dispatcher) due(u *unit, e *entry, now time.Time) bool {
	wait := cmp.Or(u.ackWait, d.core.topo.AckWait)
	if now.Sub(e.extended) < wait/3 {
		return false
	}
	e.extended = now
	return true
}
