package mq

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The worker's dispatcher: deliveries from every partition it takes are filed here
// into one lane per tenant (worker_lanes.go), and a pool of at most Concurrency
// goroutines runs the lanes, one handler call per lane at a time (worker_pool.go). A
// lane whose event failed is held until that event comes back, so a tenant's order
// survives retries while other tenants go on (worker_retry.go).

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
	checks            sync.WaitGroup            // keepAlive's checkVanished goroutines
	ticked            atomic.Pointer[time.Time] // keepAlive's last tick: see entry.extended
	done              chan struct{}             // closed once stop finished
	endTick           chan struct{}
	retick            chan struct{} // a partition was taken: keepAlive's period may shorten
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
	backlog   *backlog  // under dispatcher.mu; nil once every event pending at the take arrived
	lost      *lostWait // under dispatcher.mu; nil while no event lost in transit is awaited
	// lastDelivery is the durable's delivery sequence of the last event that reached
	// this worker, or, until one does, the durable's at the take. Written by u's
	// delivery goroutine alone; read by release too (awaitInFlight).
	lastDelivery atomic.Uint64
	// lastFirst is the stream sequence of the latest first delivery that reached this
	// worker, 0 until one does. Written by u's delivery goroutine alone.
	lastFirst uint64
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
	// extended is when keepAlive last extended its ack wait or, until it does,
	// keepAlive's last tick before it arrived: never later than its arrival, so its
	// first extension can only come early (by a period, or after a stall by the
	// stall), which costs one message; a clock read per delivery cost 50 ns
	// (measured).
	extended time.Time
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
		retick:  make(chan struct{}, 1),
	}
	now := time.Now()
	d.ticked.Store(&now)
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
	e := &entry{m: m, d: d, u: u, part: u.p, ackWait: u.ackWait, extended: *d.ticked.Load()}
	ref := eventRef{partition: -1}
	if metaOK {
		u.lastDelivery.Store(meta.consumerSeq)
		if meta.numDelivered == 1 {
			// Without a group, the durable's other pullers get first deliveries too.
			if u.group != "" && u.lastFirst != 0 && meta.streamSeq > u.lastFirst+1 {
				d.recoverLost(u, meta)
			}
			u.lastFirst = max(u.lastFirst, meta.streamSeq)
		}
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
	if u.lost != nil {
		d.lostArrived(u, tenant, e.seq)
	}
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
