package mq

import (
	"cmp"
	"slices"
	"time"
)

// A tenant's lane: its events held by the worker in sequence order, one running at a
// time, and the list of lanes ready for the pool, oldest first.

// lane is one tenant's events held by this worker, in sequence order.
type lane struct {
	tenant  TenantID
	part    int
	queue   []*entry // waiting for the handler, in sequence order
	running *entry
	again   *entry    // a delivery of running's event that came during its call
	blocked *entry    // failed and nak'ed with a delay: its next delivery goes first
	until   time.Time // when to stop waiting for blocked to come back
	ready   bool      // on dispatcher.ready
	// used: an event was filed since the last sweep. An emptied lane stays for the
	// tenant's next event: dropped and made again per event, it cost a map insert, a
	// delete and an allocation per delivery (measured, BenchmarkConsume: 0.15 µs of
	// CPU per event).
	used bool
}

// empty reports whether l holds nothing: no event waiting, running or held.
func (l *lane) empty() bool {
	return l.running == nil && l.again == nil && l.blocked == nil && len(l.queue) == 0
}

// sweepLanes drops the lanes that stayed empty since the last sweep. Called with d.mu
// held.
func (d *dispatcher) sweepLanes() {
	for t, l := range d.lanes {
		if !l.used && l.empty() {
			delete(d.lanes, t)
		}
		l.used = false
	}
}

// block holds lane l behind its failed event e; its queue stops counting as waiting.
func (d *dispatcher) block(u *unit, l *lane, e *entry) {
	l.blocked = e
	u.waiting -= len(l.queue)
	d.room.Broadcast()
}

// unblock frees lane l; its queue counts as waiting again.
func (d *dispatcher) unblock(u *unit, l *lane) {
	l.blocked = nil
	u.waiting += len(l.queue)
}

// insert puts e into the queue in sequence order, replacing an earlier delivery of the
// same event (its ack wait ran out while it waited); it reports whether e is new.
func (l *lane) insert(e *entry) bool {
	i, found := slices.BinarySearchFunc(l.queue, e.seq, func(q *entry, seq uint64) int { return cmp.Compare(q.seq, seq) })
	if found {
		l.queue[i] = e
		return false
	}
	l.queue = slices.Insert(l.queue, i, e)
	return true
}

// enqueue puts l on the ready list when it has work and nothing holds it, and reports
// whether it did. Called with d.mu held.
func (d *dispatcher) enqueue(l *lane) bool {
	if l.ready || l.running != nil || l.blocked != nil || len(l.queue) == 0 {
		return false
	}
	if u := d.units[l.part]; u != nil && (u.releasing.Load() || u.holds(l)) {
		return false
	}
	l.ready = true
	d.ready.push(l)
	return true
}

// readyLanes is the lanes ready to run, oldest first. Its front moves up the array,
// which is compacted once the front passed half of it: a pop that shifted the rest
// down copied every ready lane, a thousand when as many tenants wait, and a slice
// resliced from the front allocated anew as appends outran it (measured: one
// allocation per delivery).
type readyLanes struct {
	lanes []*lane
	head  int
}

func (q *readyLanes) push(l *lane) { q.lanes = append(q.lanes, l) }

func (q *readyLanes) len() int { return len(q.lanes) - q.head }

// pop removes the oldest lane; q must not be empty.
func (q *readyLanes) pop() *lane {
	l := q.lanes[q.head]
	q.lanes[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.lanes):
		q.lanes, q.head = q.lanes[:0], 0
	case q.head >= 32 && 2*q.head >= len(q.lanes):
		n := copy(q.lanes, q.lanes[q.head:])
		clear(q.lanes[n:])
		q.lanes, q.head = q.lanes[:n], 0
	}
	return l
}
