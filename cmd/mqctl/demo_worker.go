package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/wavehouse/mq"
)

// The demo's ingest workers: two Consumes on the one durable, each its own member of
// the workers' group, so the broker spreads the partitions over them. They "write"
// every event (DoubleAck) and fail the poison one on every attempt; the poison policy
// below retries it and then parks it, not the handler.

const demoWorkerCount = 2

// demoPolicy is each worker's config: a poison policy short enough for a demo of a
// few seconds. The poison event is tried at once, then after 100ms and 200ms (the
// delay doubles, capped at 400ms), and parked by the broker on the third failure.
var demoPolicy = mq.ConsumerConfig{
	Durable:       mq.WorkerDurable,
	MaxDeliveries: 3,
	RetryDelay:    100 * time.Millisecond,
	MaxRetryDelay: 400 * time.Millisecond,
}

// demoWorker is one worker and what it handled, under demoRun.mu.
type demoWorker struct {
	name   string
	index  int
	stop   func()
	failed <-chan error

	calls   int                 // handler calls, redeliveries and poison attempts included
	written int                 // events it wrote first (a later rewrite counts once overall)
	tenants map[mq.TenantID]int // handler calls per tenant
}

// demoFleet is what every worker's handler records, under demoRun.mu.
type demoFleet struct {
	members    []*demoWorker
	calls      int                  // every handler call of every worker, numbering them
	written    map[string]int       // times each event was written, by event id
	firstWrite map[string]time.Time // when the call that first wrote each event began
	lastSeq    map[mq.TenantID]int  // the Seq of the tenant's last first write
	lastCall   map[mq.TenantID]int  // the Seq of the tenant's last handler call
	poison     []poisonAttempt
	// inFlight[p][w] counts worker w's calls running on partition p; owner[p] is the
	// worker of p's latest call, or -1.
	inFlight  [][demoWorkerCount]int
	owner     []int
	overlaps  int // calls that began on a partition while another worker had one running there
	handovers int // calls on a partition by another worker than its previous call's
}

// poisonAttempt is one handler call on the poison event, as the handler saw it.
type poisonAttempt struct {
	worker   string
	call     int // its number among every handler call
	attempt  int // Message.Attempt
	sequence uint64
	id       string // Message.ID
	at       time.Time
	err      string // what the handler returned
}

func newDemoFleet(partitions int) demoFleet {
	f := demoFleet{written: map[string]int{}, firstWrite: map[string]time.Time{},
		lastSeq: map[mq.TenantID]int{}, lastCall: map[mq.TenantID]int{},
		inFlight: make([][demoWorkerCount]int, partitions), owner: make([]int, partitions)}
	for p := range f.owner {
		f.owner[p] = -1
	}
	return f
}

// poisonError is the handler's error for the poison event on one attempt; the parked
// event's Mq-Dead-Error is the last attempt's.
func poisonError(ev demoEvent, attempt int) error {
	return fmt.Errorf("demo worker: cannot write %s: poison event (attempt %d)", ev.id(), attempt)
}

// startWorkers creates the workers one after the other, within milliseconds: each
// normally hears the other before its first spread, so neither takes a partition it
// then has to hand over. A handover (a slow machine) is allowed and counted; two
// workers in calls on one partition at once are not.
func (d *demoRun) startWorkers(ctx context.Context) error {
	for i := range demoWorkerCount {
		w := &demoWorker{name: fmt.Sprintf("worker-%d", i+1), index: i, tenants: map[mq.TenantID]int{}}
		consumer, err := d.broker.CreateConsumer(ctx, demoPolicy)
		if err != nil {
			return fmt.Errorf("%s: create consumer: %w", w.name, err)
		}
		stop, failed, err := consumer.Consume(d.handler(w), 0)
		if err != nil {
			return fmt.Errorf("%s: consume: %w", w.name, err)
		}
		w.stop, w.failed = stop, failed
		d.mu.Lock()
		d.fleet.members = append(d.fleet.members, w)
		d.mu.Unlock()
	}
	d.printf("%d workers consuming durable %q, %d partitions to share; poison policy: %d deliveries, retry %s doubling to %s",
		demoWorkerCount, demoPolicy.Durable, d.topo.Partitions, demoPolicy.MaxDeliveries, demoPolicy.RetryDelay, demoPolicy.MaxRetryDelay)
	return nil
}

// stopWorkers stops every worker at once, so none takes over what another hands back.
// Safe to call again.
func (d *demoRun) stopWorkers() {
	d.mu.Lock()
	members := slices.Clone(d.fleet.members)
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range members {
		wg.Go(w.stop)
	}
	wg.Wait()
}

// workersFailed merges the workers' failed channels, each error naming its worker.
func (d *demoRun) workersFailed(ctx context.Context) <-chan error {
	out := make(chan error, len(d.fleet.members))
	for _, w := range d.fleet.members {
		go func() {
			select {
			case err := <-w.failed:
				out <- fmt.Errorf("%s: %w", w.name, err)
			case <-ctx.Done():
			}
		}()
	}
	return out
}

// handler is worker w's handler: it "writes" every event (DoubleAck) and fails the
// poison one, leaving it unsettled, as a handler that returns an error must.
func (d *demoRun) handler(w *demoWorker) mq.Handler {
	return func(msg *mq.Message) error {
		start := time.Now()
		d.mu.Lock()
		d.fleet.calls++
		call := d.fleet.calls
		w.calls++
		ev, ok := d.decode(w.name, msg)
		if ok {
			w.tenants[ev.Tenant]++
			d.orderOfCall(w, ev, msg.Attempt)
		}
		d.mu.Unlock()
		if !ok {
			return msg.Ack() // nothing a redelivery could fix; the problem fails the demo
		}
		defer d.running(w, ev)()
		if ev.Poison {
			err := poisonError(ev, msg.Attempt)
			d.mu.Lock()
			d.fleet.poison = append(d.fleet.poison, poisonAttempt{worker: w.name, call: call, attempt: msg.Attempt,
				sequence: msg.Sequence, id: msg.ID, at: start, err: err.Error()})
			d.mu.Unlock()
			return err
		}
		if err := msg.DoubleAck(msg.Ctx); err != nil {
			d.mu.Lock()
			d.problem("%s: DoubleAck %s: %v", w.name, ev.id(), err)
			d.mu.Unlock()
			return nil // settled (or tried): returning the error would also nak it
		}
		d.mu.Lock()
		d.wrote(w, ev, start)
		d.mu.Unlock()
		return nil
	}
}

// orderOfCall checks, under d.mu, where a call on ev falls in its tenant's order: the
// poison event's first attempt right after the event before it was written, and its
// retries with nothing of its tenant in between.
func (d *demoRun) orderOfCall(w *demoWorker, ev demoEvent, attempt int) {
	f := &d.fleet
	if ev.Poison {
		switch {
		case attempt == 1 && f.lastSeq[ev.Tenant] != ev.Seq-1:
			d.problem("%s: poison %s tried after %s#%d was written, want right after #%d",
				w.name, ev.id(), ev.Tenant, f.lastSeq[ev.Tenant], ev.Seq-1)
		case attempt > 1 && f.lastCall[ev.Tenant] != ev.Seq:
			d.problem("%s: poison %s attempt %d came after %s#%d: its tenant did not wait",
				w.name, ev.id(), attempt, ev.Tenant, f.lastCall[ev.Tenant])
		}
	}
	f.lastCall[ev.Tenant] = ev.Seq
}

// running files a call of w on ev's partition and returns the function that ends it:
// a call while another worker has one running on that partition is a problem.
func (d *demoRun) running(w *demoWorker, ev demoEvent) (done func()) {
	p := mq.Partition(ev.Tenant, d.topo.Partitions)
	d.mu.Lock()
	defer d.mu.Unlock()
	f := &d.fleet
	for other, n := range f.inFlight[p] {
		if other != w.index && n > 0 {
			f.overlaps++
			d.problem("%s: %s on partition %d while %s had a call running there", w.name, ev.id(), p, f.members[other].name)
		}
	}
	if f.owner[p] >= 0 && f.owner[p] != w.index {
		f.handovers++
	}
	f.owner[p] = w.index
	f.inFlight[p][w.index]++
	return func() {
		d.mu.Lock()
		f.inFlight[p][w.index]--
		d.mu.Unlock()
	}
}

// wrote files a confirmed write under d.mu: the first write of each event must be its
// tenant's next in publish order (the poison event skipped); a rewrite is at least
// once and counts once.
func (d *demoRun) wrote(w *demoWorker, ev demoEvent, start time.Time) {
	f := &d.fleet
	id := ev.id()
	f.written[id]++
	if f.written[id] > 1 {
		return
	}
	w.written++
	f.firstWrite[id] = start
	if want := d.plan.nextSeq(ev.Tenant, f.lastSeq[ev.Tenant]); ev.Seq != want {
		d.problem("%s: %s written after %s#%d: out of order", w.name, id, ev.Tenant, f.lastSeq[ev.Tenant])
	}
	f.lastSeq[ev.Tenant] = max(f.lastSeq[ev.Tenant], ev.Seq)
}

// partitionsOf is the partitions of the tenants w handled. A Message carries no
// partition; a tenant's is mq.Partition of it, as the broker publishes.
func (d *demoRun) partitionsOf(w *demoWorker) []int {
	var ps []int
	for t := range w.tenants {
		ps = append(ps, mq.Partition(t, d.topo.Partitions))
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}

// checkWorkers adds the workers' checks, under d.mu, once they stopped.
func (d *demoRun) checkWorkers() {
	f := &d.fleet
	busy := 0
	owners := map[int]bool{}
	for _, w := range f.members {
		if w.calls > 0 {
			busy++
		}
		for _, p := range d.partitionsOf(w) {
			owners[p] = true
		}
	}
	d.check("workers that handled events", busy, demoWorkerCount)
	d.check("partitions with a worker", len(owners), d.topo.Partitions)
	d.check("calls on a partition while another worker had one there", f.overlaps, 0)
	d.check("events written (distinct; the poison one is parked)", len(f.written), d.plan.total-1)
	_, poisonWritten := f.written[d.plan.poison.id()]
	d.check("poison event written", poisonWritten, false)

	var attempts []string
	ids, seqs := map[string]bool{}, map[uint64]bool{}
	for _, a := range f.poison {
		attempts = append(attempts, fmt.Sprint(a.attempt))
		ids[a.id], seqs[a.sequence] = true, true
	}
	var want []string
	for i := 1; i <= demoPolicy.MaxDeliveries; i++ {
		want = append(want, fmt.Sprint(i))
	}
	d.check("poison attempts the handler saw (Message.Attempt)", strings.Join(attempts, ","), strings.Join(want, ","))
	d.check("poison attempts with one Message.ID and Sequence", len(ids) == 1 && len(seqs) == 1, true)
}

// lastPoison is the handler's last call on the poison event, or a zero one.
func (f *demoFleet) lastPoison() poisonAttempt {
	if len(f.poison) == 0 {
		return poisonAttempt{}
	}
	return f.poison[len(f.poison)-1]
}
