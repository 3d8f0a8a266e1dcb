package mqtest_test

import (
	"cmp"
	"context"
	"fmt"
	"go.opentelemetry.io/otel"
	"slices"
	"sync"
	"time"

	"github.com/wavehouse/mq"
)

// memGroup is one durable: where each stored event stands with it. An event it has no
// state for was never delivered.
type memGroup struct {
	name       string
	state      map[uint64]*memDelivery
	running    *memConsume
	lastTenant mq.TenantID // the tenant handed out last, for taking tenants in turn
}

func newMemGroup(name string) *memGroup {
	return &memGroup{name: name, state: map[uint64]*memDelivery{}}
}

// memDelivery is one event's standing with a durable.
type memDelivery struct {
	acked     bool
	out       bool      // delivered and not settled
	attempts  int       // deliveries so far
	token     uint64    // the current delivery's; a settle of another does nothing
	deadline  time.Time // while out: when the ack wait runs out
	notBefore time.Time // after a nak: no redelivery before
}

// memConsumer is what CreateConsumer returns: a durable's name and the config.
type memConsumer struct {
	b    *memBroker
	ctx  context.Context
	name string
	cfg  mq.ConsumerConfig
}

func (b *memBroker) CreateConsumer(ctx context.Context, cfg mq.ConsumerConfig) (mq.Consumer, error) {
	if err := checkMemConfig(cfg); err != nil {
		return nil, err
	}
	name := cfg.Durable
	if name == "" {
		name = mq.WorkerDurable
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errClosed("create consumer")
	}
	if b.groups[name] == nil {
		b.groups[name] = newMemGroup(name)
	}
	return &memConsumer{b: b, ctx: ctx, name: name, cfg: cfg}, nil
}

// checkMemConfig refuses a config that cannot work, and one asking for more than the
// broker's fixed durables give: it applies none of cfg but StopTimeout.
func checkMemConfig(cfg mq.ConsumerConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("mem: durable %q: %s: %w", cfg.Durable, fmt.Sprintf(format, args...), mq.ErrInvalidConfig)
	}
	for name, d := range map[string]time.Duration{
		"AckWait": cfg.AckWait, "RetryDelay": cfg.RetryDelay, "MaxRetryDelay": cfg.MaxRetryDelay,
		"StopTimeout": cfg.StopTimeout, "MemberTimeout": cfg.MemberTimeout,
	} {
		if d < 0 {
			return bad("%s %s is negative", name, d)
		}
	}
	if cfg.MaxAckPending < 0 || cfg.Concurrency < 0 {
		return bad("MaxAckPending %d or Concurrency %d is negative", cfg.MaxAckPending, cfg.Concurrency)
	}
	if cfg.AckWait > memAckWait {
		return bad("AckWait %s is longer than the durables' %s", cfg.AckWait, memAckWait)
	}
	if cfg.Partitions != nil {
		// One delivery unit, 0.
		if len(cfg.Partitions) != 1 || cfg.Partitions[0] != 0 {
			return bad("Partitions %v: the broker has one delivery unit, 0", cfg.Partitions)
		}
	}
	return nil
}

// memConsume is one running Consume: a goroutine calling the handler one event at a
// time.
type memConsume struct {
	b           *memBroker
	group       *memGroup
	ctx         context.Context
	handler     mq.Handler
	stopTimeout time.Duration

	wake   chan struct{}
	quit   chan struct{}
	done   chan struct{}
	failed chan error

	stopped, ended bool // under b.mu
	stopOnce       sync.Once
}

func (c *memConsumer) Consume(handler mq.Handler, prefetch int) (func(), <-chan error, error) {
	if handler == nil {
		return nil, nil, fmt.Errorf("mem: consume: %w: nil handler", mq.ErrInvalidConfig)
	}
	if prefetch < 0 {
		return nil, nil, fmt.Errorf("mem: consume: %w: negative prefetch %d", mq.ErrInvalidConfig, prefetch)
	}
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, errClosed("consume")
	}
	g := b.groups[c.name]
	if g == nil {
		g = newMemGroup(c.name) // deleted since: made again on demand
		b.groups[c.name] = g
	}
	if g.running != nil {
		return nil, nil, fmt.Errorf("mem: durable %q already has a Consume running; one at a time", c.name)
	}
	mc := &memConsume{
		b: b, group: g, ctx: c.ctx, handler: handler, stopTimeout: c.cfg.StopTimeout,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), failed: make(chan error, 1),
	}
	if mc.stopTimeout == 0 {
		mc.stopTimeout = 10 * time.Second
	}
	g.running = mc
	b.consumes[mc] = true
	go mc.run()
	return mc.stop, mc.failed, nil
}

func (mc *memConsume) run() {
	defer close(mc.done)
	b := mc.b
	for {
		b.mu.Lock()
		if mc.stopped || mc.ended || b.closed {
			b.mu.Unlock()
			return
		}
		ev, st, wakeAt := b.nextLocked(mc.group)
		if ev == nil {
			b.mu.Unlock()
			mc.sleep(wakeAt)
			continue
		}
		b.token++
		st.out, st.attempts, st.token, st.deadline = true, st.attempts+1, b.token, time.Now().Add(memAckWait)
		b.stats.OutMsgs++
		b.stats.OutBytes += int64(len(ev.data))
		s := &memSettler{b: b, group: mc.group, seq: ev.seq, token: st.token}
		// The handler works under the publisher's trace, as the NATS brokers' consumer
		// span does, and under CreateConsumer's context.
		hctx := otel.GetTextMapPropagator().Extract(mc.ctx, memCarrier(ev.headers))
		m := ev.message(hctx, st.attempts, mq.WithSettler(s))
		b.mu.Unlock()
		if err := call(mc.handler, m); err != nil {
			_ = s.settle(false, 0) // a failure is a nak; one the handler settled stays settled
		}
	}
}

// sleep waits for a change, for wakeAt (zero: none), or for the end.
func (mc *memConsume) sleep(wakeAt time.Time) {
	var timeout <-chan time.Time
	if !wakeAt.IsZero() {
		timer := time.NewTimer(time.Until(wakeAt))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-mc.wake:
	case <-mc.quit:
	case <-mc.b.quit:
	case <-timeout:
	}
}

// nextLocked picks g's next delivery: each tenant's lowest event not acknowledged and
// not out, tenants in turn. A tenant whose lowest such event waits for its nak delay
// is held; wakeAt is the soonest a held event or an ack wait comes due.
func (b *memBroker) nextLocked(g *memGroup) (*memEvent, *memDelivery, time.Time) {
	now := time.Now()
	var wakeAt time.Time
	soonest := func(at time.Time) {
		if wakeAt.IsZero() || at.Before(wakeAt) {
			wakeAt = at
		}
	}
	first := map[mq.TenantID]*memEvent{} // nil: held
	for _, ev := range b.log {
		tenant := ev.topic.Tenant
		if _, done := first[tenant]; done {
			continue
		}
		if st := g.state[ev.seq]; st != nil {
			if st.acked {
				continue
			}
			if st.out {
				if now.Before(st.deadline) {
					soonest(st.deadline)
					continue
				}
				st.out = false // its ack wait ran out: deliver it again
			}
			if now.Before(st.notBefore) {
				first[tenant] = nil
				soonest(st.notBefore)
				continue
			}
		}
		first[tenant] = ev
	}
	var ready []mq.TenantID
	for tenant, ev := range first {
		if ev != nil {
			ready = append(ready, tenant)
		}
	}
	if len(ready) == 0 {
		return nil, nil, wakeAt
	}
	slices.Sort(ready)
	pick := ready[0]
	if i, _ := slices.BinarySearch(ready, g.lastTenant+"\x00"); i < len(ready) {
		pick = ready[i]
	}
	g.lastTenant = pick
	ev := first[pick]
	st := g.state[ev.seq]
	if st == nil {
		st = &memDelivery{}
		g.state[ev.seq] = st
	}
	return ev, st, wakeAt
}

// stop ends delivery and waits up to StopTimeout for the call in flight. Events the
// handler returned unsettled stay out until settled or their ack wait runs out.
func (mc *memConsume) stop() {
	mc.stopOnce.Do(func() {
		b := mc.b
		b.mu.Lock()
		mc.stopped = true
		if mc.group.running == mc {
			mc.group.running = nil
		}
		delete(b.consumes, mc)
		b.mu.Unlock()
		close(mc.quit)
		timer := time.NewTimer(mc.stopTimeout)
		defer timer.Stop()
		select {
		case <-mc.done:
		case <-timer.C:
		}
	})
}

// wakeConsumesLocked tells every running Consume that something changed.
func (b *memBroker) wakeConsumesLocked() {
	for c := range b.consumes {
		signal(c.wake)
	}
}

// deleteDurable removes the durable name, as an operator could: a Consume running on
// it ends and, unless stopped, reports once on failed.
func (b *memBroker) deleteDurable(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.groups[name]
	delete(b.groups, name)
	if g == nil || g.running == nil {
		return
	}
	mc := g.running
	g.running = nil
	mc.ended = true
	if !mc.stopped {
		mc.failed <- fmt.Errorf("mem: durable %q was deleted: %w", name, mq.ErrDeliveryEnded)
	}
	signal(mc.wake)
}

// memSettler settles one delivery.
type memSettler struct {
	b     *memBroker
	group *memGroup
	seq   uint64
	token uint64
}

func (s *memSettler) Ack() error                             { return s.settle(true, 0) }
func (s *memSettler) Nak() error                             { return s.settle(false, 0) }
func (s *memSettler) NakWithDelay(delay time.Duration) error { return s.settle(false, delay) }

func (s *memSettler) DoubleAck(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.settle(true, 0)
}

func (s *memSettler) InProgress() error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("in progress")
	}
	if st := s.group.state[s.seq]; st != nil && st.out && st.token == s.token {
		st.deadline = time.Now().Add(memAckWait)
	}
	return nil
}

// settle acks the delivery, or naks it for redelivery after delay. A delivery already
// settled, or redelivered since, is left alone.
func (s *memSettler) settle(ack bool, delay time.Duration) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("settle")
	}
	st := s.group.state[s.seq]
	if st == nil || !st.out || st.token != s.token {
		return nil
	}
	st.out = false
	if ack {
		st.acked = true
		if s.group.name == mq.WorkerDurable {
			b.releaseLocked(s.seq)
		}
	} else {
		st.notBefore = time.Now().Add(delay)
	}
	b.wakeConsumesLocked()
	return nil
}

// releaseLocked stops counting the event at seq against its tenant's budget.
func (b *memBroker) releaseLocked(seq uint64) {
	i, found := slices.BinarySearchFunc(b.log, seq, func(ev *memEvent, seq uint64) int {
		return cmp.Compare(ev.seq, seq)
	})
	if !found || b.log[i].released {
		return
	}
	ev := b.log[i]
	ev.released = true
	b.used[ev.topic.Tenant] -= ev.size
}
