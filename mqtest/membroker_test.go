package mqtest_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/wavehouse/mq"
)

// memBroker is an mq.Broker held in memory, with no NATS underneath: a test of the
// conformance suite, not a product. It keeps the suite honest about what is
// NATS-specific: a case it fails because of a NATS habit gets a flag in mqtest.Caps,
// not a NATS-shaped broker. One mutex guards everything; the hub and the worker run
// one goroutine per Subscribe and per Consume.
//
// What it is, as its Caps say: budgets per tenant count the bytes of events the ingest
// durable has not acknowledged; any durable name is a consumer group of its own, made
// on first use, with a fixed 30 s ack wait; a Consume calls its handler one call at a
// time, tenants in turn; a failed event is redelivered at once, never parked; it has
// no connections; its store (memStore) is memory that a restart (Harness.Restart)
// opens again, budgets included.
type memBroker struct {
	*memStore
	closed   bool          // under mu
	quit     chan struct{} // closed by Close
	consumes map[*memConsume]bool
	subs     map[*memSub]bool
	stats    mq.Stats
}

// memStore is what a restart keeps: every event, durable, budget and park. Its mutex
// guards the brokers opened on it too.
type memStore struct {
	mu sync.Mutex

	log   []*memEvent // stored events, in publish order
	seq   uint64
	keys  map[string]bool // tenant and idempotency key of every stored event
	token uint64          // the last delivery token handed out

	budgets map[mq.TenantID]int64
	used    map[mq.TenantID]int64 // bytes not yet acknowledged by the ingest durable

	groups map[string]*memGroup

	parked   []*memEvent
	parkKeys map[string]bool
	parkSeq  uint64

	// noAtomic makes the broker one without atomic batches (Caps.AtomicBatch false):
	// it refuses an atomic batch whole with errors.ErrUnsupported. It lets the suite
	// run an honest broker on each side of that flag.
	noAtomic bool
}

// memEvent is one stored (or parked) event.
type memEvent struct {
	seq      uint64
	topic    mq.Topic
	key      string // topic key
	id       string
	msgID    string // the Message.ID its deliveries carry, when not id (a redriven event's)
	parkedID string // a park's: the Message.ID of the event parked
	data     []byte
	headers  mq.Headers
	stored   time.Time
	size     int64
	released bool // its bytes no longer count against its tenant's budget
}

// The broker's limits and its reserved names.
const (
	// memReservedPrefix starts the header names the broker keeps for itself.
	memReservedPrefix = "Mem-"
	// memMaxEvent is the largest event in bytes: data, headers and topic key.
	memMaxEvent = 4 << 20
	// memAckWait is every durable's ack wait; CreateConsumer refuses a longer one.
	memAckWait = 30 * time.Second
)

func newMemStore() *memStore {
	return &memStore{
		keys:     map[string]bool{},
		budgets:  map[mq.TenantID]int64{},
		used:     map[mq.TenantID]int64{},
		groups:   map[string]*memGroup{mq.WorkerDurable: newMemGroup(mq.WorkerDurable)},
		parkKeys: map[string]bool{},
	}
}

// openMemBroker opens a broker on store, as a process does on its store after a
// restart: what was delivered and not settled stays so until its ack wait runs out.
func openMemBroker(store *memStore) *memBroker {
	return &memBroker{
		memStore: store,
		quit:     make(chan struct{}),
		consumes: map[*memConsume]bool{},
		subs:     map[*memSub]bool{},
	}
}

var (
	_ mq.Broker         = (*memBroker)(nil)
	_ mq.HistoryHorizon = (*memBroker)(nil)
)

// errClosed is the error of every method after Close.
func errClosed(op string) error { return fmt.Errorf("mem: %s: %w", op, mq.ErrClosed) }

// event checks one event as Publish takes it and builds it, trace context included;
// nothing is stored.
func newMemEvent(ctx context.Context, tp mq.Topic, data []byte, own mq.Headers, opts []mq.PublishOpt) (*memEvent, error) {
	key, err := tp.Key()
	if err != nil {
		return nil, err
	}
	headers, idem, err := memHeaders(own, opts)
	if err != nil {
		return nil, fmt.Errorf("mem: %s: %w", tp, err)
	}
	otel.GetTextMapPropagator().Inject(ctx, memCarrier(headers))
	ev := &memEvent{topic: tp, key: key, id: idem, data: append([]byte(nil), data...), headers: headers}
	ev.size = int64(len(key) + len(data) + len(idem))
	for k, vs := range headers {
		for _, v := range vs {
			ev.size += int64(len(k) + len(v))
		}
	}
	if ev.size > memMaxEvent {
		return nil, fmt.Errorf("mem: %s: %d bytes, more than %d: %w", tp, ev.size, memMaxEvent, mq.ErrPayloadTooLarge)
	}
	return ev, nil
}

// memHeaders merges a message's own headers with the option headers, refusing a
// reserved or uncarriable one, and takes the idempotency key out: a delivery gives it
// as Message.ID, never as a header.
func memHeaders(own mq.Headers, opts []mq.PublishOpt) (mq.Headers, string, error) {
	set := mq.Headers{}
	for _, opt := range opts {
		opt(set)
	}
	idem := set.Get(mq.HeaderIdempotencyKey)
	delete(set, mq.HeaderIdempotencyKey)
	headers := mq.Headers{}
	for _, h := range []mq.Headers{own, set} {
		for k, vs := range h {
			if strings.HasPrefix(strings.ToLower(k), strings.ToLower(memReservedPrefix)) {
				return nil, "", fmt.Errorf("header %q is reserved (%s): %w", k, memReservedPrefix, mq.ErrInvalidHeader)
			}
			for _, v := range vs {
				if err := carriable(k, v); err != nil {
					return nil, "", err
				}
				headers.Add(k, v)
			}
		}
	}
	return headers, idem, nil
}

// carriable refuses what mq.Headers says no broker can deliver as given: a name that
// is not an HTTP token, a value with a line break or a blank at either end.
func carriable(name, value string) error {
	if name == "" {
		return fmt.Errorf("an empty header name: %w", mq.ErrInvalidHeader)
	}
	for i := 0; i < len(name); i++ {
		if !isTokenByte(name[i]) {
			return fmt.Errorf("header name %q is not a token: %w", name, mq.ErrInvalidHeader)
		}
	}
	if strings.ContainsAny(value, "\r\n") || strings.Trim(value, " \t") != value {
		return fmt.Errorf("header %q: value %q has a line break or an outer blank: %w", name, value, mq.ErrInvalidHeader)
	}
	return nil
}

// isTokenByte reports whether c may appear in an HTTP token (RFC 7230).
func isTokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// memCarrier lets the OpenTelemetry propagator read and write Headers with exact keys.
type memCarrier mq.Headers

func (c memCarrier) Get(key string) string { return mq.Headers(c).Get(key) }
func (c memCarrier) Set(key, value string) { mq.Headers(c).Set(key, value) }
func (c memCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

func (b *memBroker) Publish(ctx context.Context, tp mq.Topic, data []byte, opts ...mq.PublishOpt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ev, err := newMemEvent(ctx, tp, data, nil, opts)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("publish")
	}
	return b.storeLocked(tp.Tenant, []*memEvent{ev})
}

func (b *memBroker) PublishBatch(ctx context.Context, batch mq.Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := batch.Tenant.Validate(); err != nil {
		return fmt.Errorf("mem: batch: %w: %w", mq.ErrInvalidTopic, err)
	}
	if len(batch.Events) == 0 {
		return nil
	}
	evs := make([]*memEvent, len(batch.Events))
	for i, be := range batch.Events {
		ev, err := newMemEvent(ctx, mq.Topic{Tenant: batch.Tenant, Table: be.Table, Scope: be.Scope}, be.Data, nil, be.Options)
		if err != nil {
			return fmt.Errorf("mem: batch event %d: %w", i, err)
		}
		evs[i] = ev
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("publish batch")
	}
	if batch.Atomic && b.noAtomic {
		return fmt.Errorf("mem: atomic batch: %w", errors.ErrUnsupported)
	}
	// Under one lock every event is stored or none, so a batch is atomic either way.
	return b.storeLocked(batch.Tenant, evs)
}

// storeLocked stores tenant's events, all or none: repeats of a stored idempotency key
// are dropped as success; the rest must fit the tenant's budget together.
func (b *memBroker) storeLocked(tenant mq.TenantID, evs []*memEvent) error {
	var fresh []*memEvent
	var size int64
	seen := map[string]bool{}
	for _, ev := range evs {
		if ev.id != "" {
			k := string(tenant) + "\x00" + ev.id
			if b.keys[k] || seen[k] {
				continue
			}
			seen[k] = true
		}
		fresh = append(fresh, ev)
		size += ev.size
	}
	if len(fresh) == 0 {
		return nil
	}
	if budget := b.budgets[tenant]; b.used[tenant]+size > budget {
		return fmt.Errorf("mem: tenant %s: %d bytes queued, %d more exceed its budget of %d: %w",
			tenant, b.used[tenant], size, budget, mq.ErrQueueFull)
	}
	for k := range seen {
		b.keys[k] = true
	}
	now := time.Now()
	for _, ev := range fresh {
		b.seq++
		ev.seq, ev.stored = b.seq, now
		if ev.id == "" {
			ev.id = "mem-" + strconv.FormatUint(ev.seq, 10)
		}
		b.used[tenant] += ev.size
		b.log = append(b.log, ev)
		b.stats.InMsgs++
		b.stats.InBytes += int64(len(ev.data))
		for s := range b.subs {
			s.queue = append(s.queue, ev)
			signal(s.wake)
		}
	}
	b.wakeConsumesLocked()
	return nil
}

// signal wakes whoever waits on ch, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// message builds the delivery of ev.
func (ev *memEvent) message(ctx context.Context, attempt int, opts ...mq.MessageOpt) *mq.Message {
	opts = append(opts, mq.WithTimestamp(ev.stored), mq.WithDelivery(cmp.Or(ev.msgID, ev.id), attempt, ev.seq),
		mq.WithMessageHeaders(maps.Clone(ev.headers)))
	return mq.NewMessage(ctx, ev.topic, ev.data, opts...)
}

func (b *memBroker) SetMaxBytes(_ context.Context, tenant mq.TenantID, maxBytes int64) error {
	if err := tenant.Validate(); err != nil {
		return fmt.Errorf("mem: set max bytes: %w", err)
	}
	if maxBytes < 0 {
		return fmt.Errorf("mem: tenant %s: budget %d is negative: %w", tenant, maxBytes, mq.ErrInvalidConfig)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("set max bytes")
	}
	b.budgets[tenant] = maxBytes
	return nil
}

func (b *memBroker) MaxBytes(tenant mq.TenantID) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.budgets[tenant]
}

// Stats counts what was published and delivered. Connections stays 0: nothing connects.
func (b *memBroker) Stats() (mq.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return mq.Stats{}, errClosed("stats")
	}
	return b.stats, nil
}

// Health reports ErrClosed after Close and ErrDeliveryEnded while a Consume whose
// delivery ended is not stopped; there is nothing else to check.
func (b *memBroker) Health(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("health")
	}
	for c := range b.consumes {
		if c.ended && !c.stopped {
			return fmt.Errorf("mem: a Consume of %q: %w", c.group.name, mq.ErrDeliveryEnded)
		}
	}
	return nil
}

// OldestSequence is the Sequence of the oldest event the log holds (PurgeAcked moves
// it), or the next one's when it holds none.
func (b *memBroker) OldestSequence(ctx context.Context) (uint64, error) {
	if ctx == nil {
		return 0, fmt.Errorf("mem: oldest sequence: nil context: %w", mq.ErrInvalidConfig)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errClosed("oldest sequence")
	}
	if len(b.log) > 0 {
		return b.log[0].seq, nil
	}
	return b.seq + 1, nil
}

// Close stops every Consume and subscription and waits for their goroutines (each
// Consume up to its StopTimeout), so no handler call begins once it returned.
func (b *memBroker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.quit)
	consumes := make([]*memConsume, 0, len(b.consumes))
	for c := range b.consumes {
		consumes = append(consumes, c)
	}
	subs := make([]*memSub, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	b.mu.Unlock()
	for _, c := range consumes {
		c.stop()
	}
	var errs []error
	for _, s := range subs {
		select {
		case <-s.done:
		case <-time.After(memAckWait):
			errs = append(errs, errors.New("mem: close: a hub handler call did not return"))
		}
	}
	return errors.Join(errs...)
}
