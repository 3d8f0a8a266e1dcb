package mq

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The worker's dispatcher: deliveries from every partition it takes go into one lane
// per tenant, and a pool of at most Concurrency goroutines runs the lanes, one handler
// call per lane at a time. A lane whose event failed is held until that event comes back, so a
// tenant's order survives retries while other tenants go on.

// pinIDHeader carries the pin a message of a pinned_client durable was delivered
// under (nats-server's JSPullRequestNatsPinId).
const pinIDHeader = "Nats-Pin-Id"

// dispatcher is one Consume.
type dispatcher struct {
	core    *natsCore
	ctx     context.Context
	durable string
	handler Handler
	policy  workerPolicy
	share   int             // each pull's batch
	starts  []*processStart // each partition's
	group   *group          // the workers sharing the partitions
	// part is what Health knows of this Consume; forget ends that at stop.
	part   *part
	forget func()

	mu       sync.Mutex
	wake     *sync.Cond // a lane became ready, or the delivery is over
	room     *sync.Cond // a partition's waiting events went down, or a release began
	lanes    map[TenantID]*lane
	ready    readyLanes
	units    map[int]*unit
	given    []*unit // partitions handed over to other workers
	tries    map[eventRef]*tries
	acked    map[int]*acked // each partition's, kept across a release and a retake
	stopped  bool           // by stop
	reported bool           // ended by itself, reported on failed
	failed   chan error
	// The pool's goroutines start as lanes need them, so a Concurrency far above the
	// tenants with work at once costs nothing: started counts them, idle those waiting
	// on wake, signaled those of idle already woken for a lane.
	started, idle, signaled int
	// spinning counts the pool's goroutines yielding a moment before they sleep (see
	// spin), claimed those of them a lane made ready was left to.
	spinning, claimed int
	checks            sync.WaitGroup // keepAlive's checkVanished goroutines
	done              chan struct{}  // closed once stop finished
	endTick           chan struct{}
	tickOnce          sync.Once
}

// unit is one partition this worker consumes.
type unit struct {
	p          int
	stream     string
	group      string                 // the durable's priority group; "" when it has none
	pin        atomic.Pointer[string] // the pin the server last delivered under
	ackWait    time.Duration
	cc         jetstream.ConsumeContext
	lastErr    atomic.Pointer[error] // several concrete types: not an atomic.Value
	checking   atomic.Bool
	releasing  atomic.Bool
	running    int               // handler calls in flight (under dispatcher.mu)
	waiting    int               // events queued in lanes free to run (under dispatcher.mu)
	idle       chan struct{}     // closed when running drops to 0 while releasing
	returned   map[uint64]*entry // the handler returned without settling
	late       []*entry          // arrived while releasing
	released   bool              // everything held was taken to be handed back
	handedBack chan struct{}     // closed once release finished
	lastAcked  string            // the ack subject of the latest delivery acked (under dispatcher.mu)
	acked      *acked            // the partition's sequences acked last (under dispatcher.mu)
	// unsettled: release found events of u pending that it could not hand back
	// (see release); the next owner must wait an ack wait for them.
	unsettled atomic.Bool
	backlog   *backlog // under dispatcher.mu; nil once every event pending at the take arrived
	// lastDelivery is the durable's delivery sequence of the last event that reached
	// this worker, or, until one does, the durable's at the take. Written by u's
	// delivery goroutine alone; read by release too (awaitInFlight).
	lastDelivery atomic.Uint64
	// shared: another worker may hold events of u delivered before the server first
	// served this one (not all of what was pending then arrived here, or they could
	// not be counted), or the server pinned u to another worker meanwhile. Release
	// then cannot tell a delivery that never reached this worker from one held
	// elsewhere (see handBackUnarrived). Set until the first delivery's count.
	shared atomic.Bool
	// pinAtTake is the pin the durable's group showed when this worker took u ("" for
	// none): held then by another pull (see pinnedElsewhere). Written before the pull
	// starts.
	pinAtTake string
}

func (u *unit) isReleasing() bool { return u.releasing.Load() }

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

// entry is one delivery.
type entry struct {
	m       jetstream.Msg
	settler Settler // the broker's (budget-aware), without the handler's observer
	// settle is msg's settler: settler observed by the dispatcher. Kept here, not
	// boxed, with d and u for its observer, so a delivery allocates neither.
	settle  settlement
	d       *dispatcher
	u       *unit
	msg     *Message // &message
	message Message
	// op is the consumer span and metrics of the delivery's handler call, and tries
	// its record of attempts when this worker saw none before: kept in the entry, so
	// a delivery that is acked at once allocates neither.
	op      operation
	tries   tries
	budget  budgetSettler // settler's storage on EmbeddedNATS
	part    int
	seq     uint64
	attempt int
	// settles are the settles made, wasAcked, wasNaked and wasUnsent: atomic, as a
	// handler may settle from a goroutine of its own while its call returns.
	settles  atomic.Uint32
	nakDelay time.Duration // the delay of the handler's nak (under dispatcher.mu)
	extended time.Time     // when keepAlive last extended its ack wait
	ackWait  time.Duration
}

// The settles an entry records.
const (
	wasAcked  uint32 = 1 << iota // by the handler or by a park
	wasNaked                     // by the handler
	wasUnsent                    // the handler's ack or nak failed: the ack wait redelivers it
)

// made reports whether any of the settles in mask was made.
func (e *entry) made(mask uint32) bool { return e.settles.Load()&mask != 0 }

// observe tells the dispatcher of a settle the handler made.
func (e *entry) observe(kind settled, delay time.Duration) { e.d.observe(e.u, e, kind, delay) }

// tries is what this worker saw of one event's attempts, kept until it is settled.
type tries struct {
	first, last time.Time
	lastErr     string
}

func newDispatcher(c *natsCore, ctx context.Context, durable string, handler Handler, policy workerPolicy, share int) *dispatcher {
	d := &dispatcher{
		core: c, ctx: ctx, durable: durable, handler: handler, policy: policy, share: share,
		starts:  c.processStarts(durable),
		lanes:   map[TenantID]*lane{},
		units:   map[int]*unit{},
		tries:   map[eventRef]*tries{},
		acked:   map[int]*acked{},
		failed:  make(chan error, 1),
		done:    make(chan struct{}),
		endTick: make(chan struct{}),
	}
	d.wake = sync.NewCond(&d.mu)
	d.room = sync.NewCond(&d.mu)
	var forgetPart func()
	d.part, forgetPart = c.addPart(fmt.Sprintf("worker %q", durable))
	forgetWorker := c.addWorker(d)
	d.forget = func() { forgetPart(); forgetWorker() }
	go d.keepAlive()
	return d
}

// take starts consuming partition p.
func (d *dispatcher) take(p int) error {
	u := d.newUnit(p)
	// Filed before the pull starts: its first deliveries find their partition.
	d.mu.Lock()
	if d.over() {
		d.mu.Unlock()
		return ErrClosed
	}
	d.units[p] = u
	d.mu.Unlock()
	err := d.pull(u)
	if err != nil {
		d.mu.Lock()
		if d.units[p] == u {
			delete(d.units, p)
		}
		d.mu.Unlock()
	}
	return err
}

func (d *dispatcher) newUnit(p int) *unit {
	u := &unit{p: p, stream: d.core.partitions[p], returned: map[uint64]*entry{},
		idle: make(chan struct{}), handedBack: make(chan struct{})}
	u.shared.Store(true)
	return u
}

// isOver reports whether the delivery was stopped or has ended by itself: no handler
// call may start after either.
func (d *dispatcher) isOver() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.over()
}

func (d *dispatcher) over() bool { return d.stopped || d.reported }

// arrive files a delivery into its tenant's lane.
func (d *dispatcher) arrive(u *unit, m jetstream.Msg) {
	meta, metaOK := parseDelivery(m.Reply())
	if id := m.Headers().Get(pinIDHeader); id != "" {
		if cur := u.pin.Load(); cur == nil || *cur != id {
			// Pinned again (the server unpinned this worker: a stall or a full lane
			// that kept it from pulling for the pinned TTL, a server restart, an
			// operator). The server numbers every delivery of the durable, whoever
			// gets it: when this one follows the last this worker got, nobody else was
			// served meanwhile, and nothing changed.
			moved := cur != nil && (!metaOK || meta.consumerSeq != u.lastDelivery.Load()+1)
			if moved {
				u.shared.Store(true) // before the pin: see handBackUnarrived
			}
			// A copy: taking id's own address moved it to the heap on every delivery.
			pin := id
			u.pin.Store(&pin)
			if cur == nil || moved {
				d.served(u, cur == nil)
			}
		}
	}
	e := &entry{m: m, d: d, u: u, part: u.p, ackWait: u.ackWait, extended: time.Now()}
	ref := eventRef{partition: -1}
	if metaOK {
		u.lastDelivery.Store(meta.consumerSeq)
		e.seq, e.attempt = meta.streamSeq, int(meta.numDelivered)
		ref = eventRef{u.p, e.seq}
	}
	e.settler = d.core.settler(m, ref, &e.budget)
	e.settle = settlement{Settler: e.settler, core: d.core, subject: m.Subject(), observer: e}
	e.msg = &e.message
	d.core.deliveredInto(e.msg, d.ctx, m, meta, &e.settle)
	tenant, _, _ := strings.Cut(e.msg.key, ".") // a key's first token is its tenant
	if !d.file(u, TenantID(tenant), e) {
		d.dropAcked(u, e)
	}
}

// file puts e into its tenant's lane, or reports false for a copy of an event acked
// already, to be dropped.
func (d *dispatcher) file(u *unit, tenant TenantID, e *entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if u.copyOfAcked(e) {
		if u.backlog != nil {
			d.backlogArrived(u, tenant, e.seq) // back, and settled: nothing to wait for
		}
		return false
	}
	if d.over() || u.releasing.Load() {
		d.late(u, e)
		return true
	}
	delete(u.returned, e.seq) // redelivered while the host holds it: at least once
	// A backlog's events never wait for room: the one that ends it would otherwise
	// let the lanes run what was held behind it before it is filed.
	pending := u.backlog != nil
	if pending {
		d.backlogArrived(u, tenant, e.seq)
	}
	for {
		l := d.lanes[tenant]
		if l == nil {
			l = &lane{tenant: tenant, part: u.p}
			d.lanes[l.tenant] = l
		}
		switch {
		case l.running != nil && l.running.seq == e.seq:
			// Back while its call still runs: the call nak'ed it (a plain Nak comes
			// back at once), or its ack wait ran out under a long call. Kept for
			// when the call returns: it runs next if the call holds its lane.
			l.again = e
			return true
		case l.blocked != nil && l.blocked.seq == e.seq:
			d.unblock(u, l)
		case l.blocked == nil && !pending && u.backlog == nil && u.waiting >= d.waitLimit():
			// Backpressure: the pull waits while the partition has a full batch
			// waiting for a handler. Events held behind a retry do not count, so a
			// held tenant never stops the others of its partition; they are bounded
			// by the durable's MaxAckPending, as are those held for the backlog.
			d.room.Wait()
			if d.over() || u.releasing.Load() {
				d.late(u, e)
				return true
			}
			// Look again: meanwhile the lane may have emptied and been dropped (a
			// new one must not run beside it), or been held.
			continue
		}
		l.used = true
		if l.insert(e) && l.blocked == nil {
			u.waiting++
		}
		d.schedule(l)
		return true
	}
}

// late files e, delivered after the end of its partition's delivery began, to be
// handed back with the rest, or hands it back at once when that already happened.
// Called with d.mu held.
func (d *dispatcher) late(u *unit, e *entry) {
	if u.released || d.reported {
		go d.handBackNow(e) // not left to the ack wait
		return
	}
	u.late = append(u.late, e)
}

// waitLimit is how many events a partition may have waiting for a handler: two
// pull batches, and at least one per handler.
func (d *dispatcher) waitLimit() int { return max(2*d.share, d.policy.concurrency) }

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

// enqueue puts l on the ready list when it has work and nothing holds it, and reports
// whether it did. Called with d.mu held.
func (d *dispatcher) enqueue(l *lane) bool {
	if l.ready || l.running != nil || l.blocked != nil || len(l.queue) == 0 {
		return false
	}
	if u := d.units[l.part]; u != nil && (u.releasing.Load() || u.backlogHolds(l)) {
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
		if u == nil || u.releasing.Load() || u.backlogHolds(l) || len(l.queue) == 0 {
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

// observe hears of a settle the handler made, during its call or after.
func (d *dispatcher) observe(u *unit, e *entry, kind settled, delay time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch kind {
	case settledAck:
		e.settles.Or(wasAcked)
		u.lastAcked = e.m.Reply()
		u.acked.add(e.seq)
		delete(d.tries, eventRef{e.part, e.seq})
	case settledNak:
		e.settles.Or(wasNaked)
		e.nakDelay = delay
	case settledFailed:
		e.settles.Or(wasUnsent)
		return // still the host's to settle, and Close's to hand back
	}
	if u.returned[e.seq] == e {
		delete(u.returned, e.seq)
	}
}
