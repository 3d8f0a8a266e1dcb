package mq

import (
	"math"
	"runtime"
	"time"
)

// The pool: at most Concurrency goroutines take ready lanes, one handler call per
// lane at a time, started as lanes need them and spinning a moment before they sleep.

// schedule puts l on the ready list when it has work and nothing holds it, and wakes
// a goroutine of the pool for it.
func (d *dispatcher) schedule(l *lane) {
	if d.enqueue(l) {
		d.wakeOne()
	}
}

// wakeOne finds a goroutine of the pool for a lane made ready: an idle one not woken
// yet, else a new one while the pool is below Concurrency; else the lane waits for a
// goroutine to finish its call. Called with d.mu held.
func (d *dispatcher) wakeOne() {
	switch {
	case d.spinning > d.claimed:
		d.claimed++
	case d.idle > d.signaled:
		d.signaled++
		d.wake.Signal()
	case d.started < d.policy.concurrency && !d.over():
		d.started++
		go d.runLanes()
	}
}

// runLanes is one of the pool's goroutines.
func (d *dispatcher) runLanes() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		for d.ready.len() == 0 && !d.over() {
			// Idle: what still waits is held behind calls in flight, so a pull
			// waiting for room must not wait for more of it to run (see below).
			d.room.Broadcast()
			if d.spin() {
				continue
			}
			d.idle++
			d.wake.Wait()
			d.idle--
			if d.signaled > 0 {
				d.signaled--
			}
		}
		if d.over() {
			return
		}
		l := d.ready.pop()
		l.ready = false
		u := d.units[l.part]
		if u == nil || u.releasing.Load() || u.holds(l) || len(l.queue) == 0 {
			continue
		}
		e := l.queue[0]
		l.queue = l.queue[1:]
		u.waiting--
		if u.copyOfAcked(e) {
			// Its event was acked while the copy waited in the lane.
			d.mu.Unlock()
			d.dropAcked(u, e)
			d.mu.Lock()
			d.room.Broadcast()
			d.enqueue(l)
			continue
		}
		l.running = e
		u.running++
		// A pull waiting for room resumes once half the limit ran (or the pool went
		// idle), not at each call: woken per call it filed one event and slept
		// again, a context switch per delivery.
		if u.waiting <= d.waitLimit()/2 {
			d.room.Broadcast()
		}
		now := time.Now()
		t := d.tries[eventRef{e.part, e.seq}]
		if t == nil {
			// Filed in d.tries after the call if the event is still unsettled.
			e.tries = tries{first: now}
			t = &e.tries
		}
		t.last = now
		d.call(l, u, e, t)
	}
}

// settleCall files what e's handler call came to (hold: its tenant waits for the
// event to come back) and puts l back on the ready list if it has more. Called with
// d.mu held.
func (d *dispatcher) settleCall(l *lane, u *unit, e *entry, t *tries, hold bool) {
	l.running = nil
	u.running--
	again := l.again
	l.again = nil
	switch {
	case hold && again != nil:
		// Its next delivery already came: it goes first, nothing to wait for.
		if l.insert(again) {
			u.waiting++
		}
	case hold:
		d.block(u, l, e)
		// A nak's own delay may be longer than the policy's: the event comes
		// back no sooner, and its tenant waits for it (a delay of "forever"
		// must not wrap round to a wait already over).
		slack := u.ackWait + d.core.topo.PublishTimeout
		l.until = time.Now().Add(min(max(d.retryDelay(e), e.nakDelay), math.MaxInt64-slack) + slack)
	case !e.made(wasAcked | wasNaked):
		u.returned[e.seq] = e
	}
	if e.made(wasAcked) {
		delete(d.tries, eventRef{e.part, e.seq})
	} else if t == &e.tries {
		d.tries[eventRef{e.part, e.seq}] = t // for its next attempt
	}
	if u.running == 0 && u.releasing.Load() {
		close(u.idle)
	}
	// No wake: this goroutine takes the next ready lane before it lets go of
	// d.mu, so a goroutine woken for l would only find the list as it was
	// (measured: one futex wake and a context switch per delivery).
	d.enqueue(l)
}

// spinRounds is how often an idle goroutine of the pool yields before it sleeps.
const spinRounds = 4

// spin lets other goroutines run a few times before this one of the pool sleeps, and
// reports whether a lane became ready meanwhile (or the delivery ended). An event
// handled at once leaves the pool idle until the next arrives, microseconds later: a
// sleep on wake cost a futex wake and a context switch per delivery (measured,
// BenchmarkConsume, 28 interleaved pairs: 0.96x the time without the spin, faster in 21;
// sign test p = 0.01). Called with d.mu held, which it lets go of while it yields.
func (d *dispatcher) spin() bool {
	d.spinning++
	found := false
	for range spinRounds {
		d.mu.Unlock()
		runtime.Gosched()
		d.mu.Lock()
		if found = d.ready.len() > 0 || d.over(); found {
			break
		}
	}
	d.spinning--
	if d.claimed > 0 {
		d.claimed--
	}
	return found
}
