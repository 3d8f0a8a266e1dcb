package mq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// coalescer is group commit for Publish: the calls on a partition that arrive while a
// send to it is in flight wait together, and go as one atomic batch when it ends.
// With an fsync per write the server then syncs once per batch instead of once per
// event (see the README's Throughput for what it measured). A call alone on its
// partition is sent at once, as a plain publish, and waits for nothing but its own
// confirmation, so coalescing adds no latency where there is nothing to coalesce.
//
// A batch that the server refuses whole (an id already stored, a full stream) goes
// again event by event (sendChunked), so each call still gets its own outcome, and
// the message ids keep every event stored once.
type coalescer struct {
	core *natsCore
	// settle is told each event's outcome once, before its caller is: EmbeddedNATS
	// commits or gives back the reservation there, so a queued caller that stops
	// waiting (its ctx ends) leaves its budget exact.
	settle    func(partition int, r *reservation, s stored)
	parts     []coalescing
	lingerFor time.Duration // coalesceLinger; a test may set its own
	// flushes are the running flush goroutines: Close waits for them, as it does for
	// everything the broker started.
	flushes sync.WaitGroup
}

// coalescing is one partition's state: whether a send is in flight, and the calls
// waiting for the next one.
type coalescing struct {
	mu    sync.Mutex
	busy  bool
	queue []*queued
	spare []*queued // a sent queue's array, for the next queue
	// last is how many calls the send that just ended carried: callers that may
	// publish again at once. While the flush lingers for them, full is closed once
	// the queue holds want calls.
	last int
	want int
	full chan struct{}
}

// coalesceLinger bounds how long a flush waits for the callers of the send that just
// ended to publish again, before it sends what queued meanwhile. Without the wait,
// callers that publish in a loop split into groups that take turns, each paying an
// atomic batch's staging (about 2.2 ms, see minAtomicChunk). Measured with 32 callers
// under fsync: without it the batches were mostly 14 and 18 events, 0.93–1.11x raw
// in three runs; with it 82 of 97 batches held all 32, 1.17–1.31x raw.
const coalesceLinger = 200 * time.Microsecond

// queued is a call waiting for the next batch of its partition.
type queued struct {
	ev outgoing
	r  *reservation
	// left is set when the caller stops waiting: its event is not sent if it has not
	// gone yet. The flusher never reads the caller's ctx, whose methods are the caller's.
	left atomic.Bool
	out  chan error // buffered: the flusher never waits for a caller that left
	told bool       // finish ran; the flush's own
}

func newCoalescer(core *natsCore, settle func(int, *reservation, stored)) *coalescer {
	return &coalescer{core: core, settle: settle, parts: make([]coalescing, core.topo.Partitions), lingerFor: coalesceLinger}
}

// publish sends ev to partition p, alone or with the calls that wait beside it, and
// returns its outcome; r is the event's reservation, handed to settle exactly once.
func (g *coalescer) publish(ctx context.Context, p int, ev outgoing, r *reservation) error {
	// Until r is handed on (to sendAlone, or to the flush with the queued call), a
	// panic here gives it back: a caller's ctx may do anything.
	handed := false
	defer func() {
		if !handed {
			g.settle(p, r, stored{err: errPublishPanicked})
		}
	}()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", ev.subject, err)
	}
	part := &g.parts[p]
	part.mu.Lock()
	if !part.busy {
		part.busy = true
		part.mu.Unlock()
		handed = true
		return g.sendAlone(ctx, p, ev, r)
	}
	// The data is the caller's, who may reuse it once Publish returned, also when its
	// ctx ended while the event was on its way: the queued event owns a copy.
	ev.data = bytes.Clone(ev.data)
	q := &queued{ev: ev, r: r, out: make(chan error, 1)}
	part.queue = append(part.queue, q)
	if part.full != nil && len(part.queue) >= part.want {
		close(part.full)
		part.full = nil
	}
	part.mu.Unlock()
	handed = true
	select {
	case err := <-q.out:
		return err
	case <-ctx.Done():
		q.left.Store(true)
		// The event may still be stored; settle learns its outcome either way.
		return fmt.Errorf("publish %s: %w", ev.subject, ctx.Err())
	}
}

// sendAlone sends ev while nothing else is in flight on p, then hands p on. Even a
// panic in the send (a caller's ctx may do anything) gives r back and hands p on, or
// the partition would wait forever.
func (g *coalescer) sendAlone(ctx context.Context, p int, ev outgoing, r *reservation) error {
	s := stored{err: errPublishPanicked}
	defer func() {
		g.settle(p, r, s)
		g.handOff(p)
	}()
	s = g.sendOne(ctx, ev)
	return s.err
}

// errPublishPanicked is the outcome settle is told of a send that panicked.
var errPublishPanicked = errors.New("publish panicked")

// sendOne is the plain publish of one event.
func (g *coalescer) sendOne(ctx context.Context, ev outgoing) stored {
	ack, err := g.core.send(ctx, ev)
	if err != nil {
		return stored{err: err}
	}
	return stored{seq: ack.Sequence, dup: ack.Duplicate}
}

// handOff ends p's send in flight: the calls that queued meanwhile go next, on a
// goroutine of their own, so the caller that sent returns at once.
func (g *coalescer) handOff(p int) {
	part := &g.parts[p]
	part.mu.Lock()
	defer part.mu.Unlock()
	if len(part.queue) == 0 {
		part.busy = false
		return
	}
	part.last = 1 // sendAlone's
	g.flushes.Go(func() { g.flush(p) })
}

// wait waits for the running flushes; once the connection is closed they end at once.
func (g *coalescer) wait() { g.flushes.Wait() }

// flush sends p's queue, a batch at a time, until it finds it empty. Only one flush
// runs per partition (busy), so the spare array is its own.
func (g *coalescer) flush(p int) {
	part := &g.parts[p]
	for {
		part.mu.Lock()
		// What queued behind the send that just ended, with that send's callers
		// back, may make one atomic batch: wait a moment for them.
		if n, want := len(part.queue), min(len(part.queue)+part.last, MaxAtomicBatch); n > 0 && n < want && want >= minAtomicChunk {
			g.linger(part, want)
		}
		batch, whole := part.queue, len(part.queue) <= MaxAtomicBatch
		switch {
		case len(batch) == 0:
			part.busy = false
			part.mu.Unlock()
			return
		case whole:
			part.queue, part.spare = part.spare, nil
		default:
			batch, part.queue = batch[:MaxAtomicBatch:MaxAtomicBatch], batch[MaxAtomicBatch:]
		}
		part.last = len(batch)
		part.mu.Unlock()
		g.sendGuarded(p, batch)
		clear(batch) // the calls' data is not kept alive by the array
		if whole {
			part.mu.Lock()
			part.spare = batch[:0]
			part.mu.Unlock()
		}
	}
}

// linger waits, at most g.lingerFor, until part's queue holds want calls. Called and
// returns with part.mu held.
func (g *coalescer) linger(part *coalescing, want int) {
	full := make(chan struct{})
	part.want, part.full = want, full
	part.mu.Unlock()
	t := time.NewTimer(g.lingerFor)
	select {
	case <-full:
	case <-t.C:
	}
	t.Stop()
	part.mu.Lock()
	part.full = nil
}

// sendGuarded is sendQueued, except that a panic in it (a bug) fails the calls of
// batch not yet told their outcome, instead of ending the process or leaving them
// waiting; the flush goes on with the rest of the queue.
func (g *coalescer) sendGuarded(p int, batch []*queued) {
	defer func() {
		if r := recover(); r != nil {
			g.core.log.Error("mq: publish batch panicked; its calls fail", "partition", p,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			for _, q := range batch {
				if !q.told {
					g.finish(p, q, stored{err: fmt.Errorf("publish %s: %w: %v", q.ev.subject, errPublishPanicked, r)})
				}
			}
		}
	}()
	g.sendQueued(p, batch)
}

// sendQueued sends the calls of batch that still wait, and tells each its outcome.
func (g *coalescer) sendQueued(p int, batch []*queued) {
	live := batch[:0:0]
	for _, q := range batch {
		if q.left.Load() {
			g.finish(p, q, stored{err: context.Canceled})
			continue
		}
		live = append(live, q)
	}
	// The calls' contexts are theirs: each attempt is bounded by PublishTimeout, and a
	// call whose ctx ends stops waiting.
	switch len(live) {
	case 0:
	case 1:
		g.finish(p, live[0], g.sendOne(context.Background(), live[0].ev))
	default:
		b := outBatch{part: p, events: make([]outgoing, len(live))}
		for i, q := range live {
			b.events[i] = q.ev
		}
		for i, s := range g.core.sendChunked(context.Background(), b) {
			g.finish(p, live[i], s)
		}
	}
}

func (g *coalescer) finish(p int, q *queued, s stored) {
	q.told = true
	g.settle(p, q.r, s)
	q.out <- s.err
}
