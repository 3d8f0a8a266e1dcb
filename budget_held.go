package mq

import (
	"cmp"
	"slices"
)

// heldQueue is one partition's counted events, in stream-sequence order. The stream
// stores a partition's events in sequence order and the worker acknowledges them
// almost in order, so events join at the back and leave from the front, and both
// ends stay in cache. A map keyed by sequence missed the cache on nearly every ack
// once the backlog was large (measured, BenchmarkConsume with 200k events held: the
// lookup alone took about 1.1 µs of CPU per ack, more than the ack itself).
type heldQueue struct {
	slots []heldSlot // ascending by seq; released slots wait here until trimmed
	live  int        // slots not released
}

type heldSlot struct {
	seq  uint64
	ev   heldEvent
	gone bool // released; ev is cleared so the slot keeps no strings alive
}

// compactAt is the least length at which a queue mostly of released slots (one
// event held while those after it were acknowledged) is compacted.
const compactAt = 64

// find returns the index of seq's slot and true, or where its slot would go and false.
func (q *heldQueue) find(seq uint64) (int, bool) {
	n := len(q.slots)
	switch {
	case n == 0:
		return 0, false
	case q.slots[0].seq == seq: // the next to be acknowledged, in order
		return 0, true
	case q.slots[n-1].seq < seq: // newer than any held: the usual commit
		return n, false
	}
	return slices.BinarySearchFunc(q.slots, seq, func(s heldSlot, seq uint64) int { return cmp.Compare(s.seq, seq) })
}

// get returns the event held at seq.
func (q *heldQueue) get(seq uint64) (heldEvent, bool) {
	i, found := q.find(seq)
	if !found || q.slots[i].gone {
		return heldEvent{}, false
	}
	return q.slots[i].ev, true
}

// add holds ev at seq and reports whether it did: not if seq is held already.
func (q *heldQueue) add(seq uint64, ev heldEvent) bool {
	i, found := q.find(seq)
	switch {
	case !found:
		q.slots = slices.Insert(q.slots, i, heldSlot{seq: seq, ev: ev})
	case q.slots[i].gone:
		q.slots[i] = heldSlot{seq: seq, ev: ev}
	default:
		return false
	}
	q.live++
	return true
}

// remove releases the event held at seq and returns it.
func (q *heldQueue) remove(seq uint64) (heldEvent, bool) {
	i, found := q.find(seq)
	if !found || q.slots[i].gone {
		return heldEvent{}, false
	}
	ev := q.slots[i].ev
	q.slots[i] = heldSlot{seq: seq, gone: true}
	q.live--
	for len(q.slots) > 0 && q.slots[0].gone {
		q.slots = q.slots[1:]
	}
	for n := len(q.slots); n > 0 && q.slots[n-1].gone; n-- {
		q.slots = q.slots[:n-1]
	}
	if n := len(q.slots); n >= compactAt && q.live < n/2 {
		q.slots = slices.DeleteFunc(q.slots, func(s heldSlot) bool { return s.gone })
	}
	return ev, true
}
