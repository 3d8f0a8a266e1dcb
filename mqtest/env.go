package mqtest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// env and the helpers every case shares: a case's broker and context, publishing,
// consuming and subscribing onto channels, bounded waits and replays.

// env is one case's broker and context.
type env struct {
	t    *testing.T
	h    Harness
	b    mq.Broker
	ctx  context.Context
	over chan struct{}
}

// setup makes the case's broker and its context: t.Context() bounded by 4 x wait. The
// case is "over" (handlers stop reporting) before the broker's own cleanup closes it.
func setup(t *testing.T, h Harness) *env {
	t.Helper()
	return setupRestarting(t, h, 0)
}

// setupRestarting is setup for a case that restarts the broker that many times: its
// context allows each restart restartBudget more, since a broker opening its store
// again may take a while (EmbeddedNATS waits up to 25 s for its history to attach
// the partitions), and the calls after the restarts must not fail for the time the
// restarts took.
func setupRestarting(t *testing.T, h Harness, restarts int) *env {
	t.Helper()
	b := h.New(t)
	require.NotNil(t, b, "Harness.New returned nil")
	ctx, cancel := context.WithTimeout(t.Context(), 4*wait+time.Duration(restarts)*restartBudget)
	e := &env{t: t, h: h, b: b, ctx: ctx, over: make(chan struct{})}
	t.Cleanup(func() {
		close(e.over)
		cancel()
	})
	return e
}

// live reports whether the case is still running: handlers report failures only
// then, so a handler that outlives its case never touches a finished test.
func (e *env) live() bool {
	select {
	case <-e.over:
		return false
	default:
		return e.ctx.Err() == nil
	}
}

// errorf reports a failure from a handler goroutine while the case is live.
func (e *env) errorf(format string, args ...any) {
	if e.live() {
		e.t.Errorf(format, args...)
	}
}

// topic builds a topic.
func topic(tenant mq.TenantID, table, scope string) mq.Topic {
	return mq.Topic{Tenant: tenant, Table: table, Scope: scope}
}

// publish publishes data on tp and requires success.
func (e *env) publish(tp mq.Topic, data string, opts ...mq.PublishOpt) {
	e.t.Helper()
	require.NoError(e.t, e.b.Publish(e.ctx, tp, []byte(data), opts...), "publish %q on %s", data, tp)
}

// delivery is one message as a handler saw it.
type delivery struct {
	topic mq.Topic
	data  string
	msg   *mq.Message
	// start and end are when the handler call began and ended, for the calls recorded
	// sees; zero otherwise.
	start, end time.Time
}

func newDelivery(m *mq.Message) delivery {
	return delivery{topic: m.Topic(), data: string(m.Data), msg: m}
}

func datas(ds []delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.data
	}
	return out
}

// mailbox is an unbounded queue of deliveries and the channel it feeds, in order,
// until the case is over: put never waits, so a handler never blocks on a case that
// reads another channel (a fast broker may redeliver a failing event thousands of
// times while the case waits for something else; measured: 1025 with a buffered
// channel of 1024 stopped the reference broker's only handler for good).
func (e *env) mailbox() (put func(delivery), out <-chan delivery) {
	ch := make(chan delivery)
	wake := make(chan struct{}, 1)
	var mu sync.Mutex
	var queue []delivery
	go func() {
		for {
			mu.Lock()
			if len(queue) == 0 {
				mu.Unlock()
				select {
				case <-wake:
					continue
				case <-e.over:
					return
				}
			}
			d := queue[0]
			queue = queue[1:]
			mu.Unlock()
			select {
			case ch <- d:
			case <-e.over:
				return
			}
		}
	}()
	return func(d delivery) {
		if !e.live() {
			return // nothing reads it any more
		}
		mu.Lock()
		queue = append(queue, d)
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}, ch
}

// recorded wraps handle so that every call, one that panics included, goes onto the
// returned channel once it ended, with when it began and ended.
func (e *env) recorded(handle mq.Handler) (mq.Handler, <-chan delivery) {
	put, ch := e.mailbox()
	return func(m *mq.Message) error {
		d := newDelivery(m)
		d.start = time.Now()
		defer func() {
			d.end = time.Now()
			put(d)
		}()
		return handle(m)
	}, ch
}

// byStart orders recorded calls by when they began.
func byStart(a, b delivery) int { return a.start.Compare(b.start) }

// consumer is one running Consume.
type consumer struct {
	deliveries <-chan delivery
	stop       func()
	failed     <-chan error
}

// consume creates Durable (cfg.Durable if set) under the case's context and consumes it
// with a prefetch of 16: handle runs first, then the delivery goes onto the returned
// channel. stop is registered as cleanup.
func (e *env) consume(cfg mq.ConsumerConfig, handle mq.Handler) consumer {
	e.t.Helper()
	return e.consumeCtx(e.ctx, cfg, 16, handle)
}

// consumeCtx is consume with CreateConsumer's context and the prefetch given.
func (e *env) consumeCtx(ctx context.Context, cfg mq.ConsumerConfig, prefetch int, handle mq.Handler) consumer {
	e.t.Helper()
	if cfg.Durable == "" {
		cfg.Durable = Durable
	}
	c, err := e.b.CreateConsumer(ctx, cfg)
	require.NoError(e.t, err, "create consumer %+v", cfg)
	require.NotNil(e.t, c, "CreateConsumer returned a nil consumer and no error")
	put, ch := e.mailbox()
	stop, failed, err := c.Consume(func(m *mq.Message) error {
		if !e.live() {
			return errors.New("mqtest: the case is over")
		}
		err := handle(m)
		put(newDelivery(m))
		return err
	}, prefetch)
	require.NoError(e.t, err, "consume")
	require.NotNil(e.t, stop, "Consume returned a nil stop")
	require.NotNil(e.t, failed, "Consume returned a nil failed channel")
	e.t.Cleanup(stop)
	return consumer{deliveries: ch, stop: stop, failed: failed}
}

// ackEach is a handler that acknowledges every message and waits for the broker's
// confirmation.
func (e *env) ackEach(m *mq.Message) error {
	if err := m.DoubleAck(e.ctx); err != nil {
		e.errorf("double ack %q on %s: %v", m.Data, m.TopicKey(), err)
	}
	return nil
}

// subscribe subscribes under the case's context and pushes every delivery onto the
// returned channel.
func (e *env) subscribe(name string) <-chan delivery {
	e.t.Helper()
	return e.subscribeCtx(e.ctx, name)
}

// subscribeCtx is subscribe under ctx.
func (e *env) subscribeCtx(ctx context.Context, name string) <-chan delivery {
	e.t.Helper()
	put, ch := e.mailbox()
	require.NoError(e.t, e.b.Subscribe(ctx, name, func(m *mq.Message) error {
		if e.live() {
			put(newDelivery(m))
		}
		return nil
	}), "subscribe %q", name)
	return ch
}

// next collects exactly n deliveries, failing if wait passes without a new one.
func next(t *testing.T, ch <-chan delivery, n int) []delivery {
	t.Helper()
	return nextBecause(t, ch, n, "")
}

// nextBecause is next whose failure says why the deliveries were due (a flag, say).
func nextBecause(t *testing.T, ch <-chan delivery, n int, why string) []delivery {
	t.Helper()
	what := fmt.Sprintf("%d deliveries", n)
	if why != "" {
		what += " (" + why + ")"
	}
	return collect(t, ch, what, func(got []delivery) bool { return len(got) >= n }, nil)
}

// nextUntil collects deliveries until done holds for them, failing if wait passes
// without a new one, or 3 x wait in all (deliveries that never stop coming cannot keep
// it waiting); what names what it waits for.
func nextUntil(t *testing.T, ch <-chan delivery, what string, done func([]delivery) bool) []delivery {
	t.Helper()
	return collect(t, ch, what, done, time.After(3*wait))
}

// collect is next and nextUntil: until done holds, wait passes without a delivery, or
// deadline (nil: none) fires.
func collect(t *testing.T, ch <-chan delivery, what string, done func([]delivery) bool, deadline <-chan time.Time) []delivery {
	t.Helper()
	var out []delivery
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for !done(out) {
		select {
		case d := <-ch:
			out = append(out, d)
			timer.Reset(wait)
		case <-timer.C:
			t.Fatalf("waiting for %s: got %d deliveries, then nothing for %s: %.2000q", what, len(out), wait, labels(out))
		case <-deadline:
			t.Fatalf("waiting for %s: got %d deliveries within %s, and still not that: %.2000q", what, len(out), 3*wait, labels(out))
		}
	}
	return out
}

// none fails if anything arrives on ch within quiet.
func none(t *testing.T, ch <-chan delivery) {
	t.Helper()
	noneFor(t, ch, quiet)
}

func noneFor(t *testing.T, ch <-chan delivery, d time.Duration) {
	t.Helper()
	noneBecause(t, ch, d, "")
}

// noneBecause is noneFor whose failure says why nothing was due (a flag, say).
func noneBecause(t *testing.T, ch <-chan delivery, d time.Duration, why string) {
	t.Helper()
	select {
	case got := <-ch:
		if why != "" {
			t.Fatalf("%s, yet %q was delivered on %s within %s", why, got.data, got.msg.TopicKey(), d)
		}
		t.Fatalf("unexpected delivery %q on %s within %s", got.data, got.msg.TopicKey(), d)
	case <-time.After(d):
	}
}

// noFailure fails if a non-nil error arrives on failed within quiet. A closed channel
// reports nothing.
func noFailure(t *testing.T, failed <-chan error) {
	t.Helper()
	select {
	case err, ok := <-failed:
		if ok && err != nil {
			t.Fatalf("failed reported %v", err)
		}
		if ok {
			t.Fatal("failed carried a nil error")
		}
	case <-time.After(quiet):
	}
}

// replay gathers a whole ReplaySince of tp, requiring a nil end.
func (e *env) replay(tp mq.Topic, since time.Time) []string {
	e.t.Helper()
	got, err := e.tryReplay(tp, since, 0)
	require.NoError(e.t, err, "replay %s since %v", tp, since)
	return got
}

// tryReplay gathers a ReplaySince of tp, stopping after limit events when limit > 0.
func (e *env) tryReplay(tp mq.Topic, since time.Time, limit int) ([]string, error) {
	got := []string{}
	err := e.b.ReplaySince(e.ctx, tp, since, func(m *mq.Message) bool {
		got = append(got, string(m.Data))
		return limit <= 0 || len(got) < limit
	})
	return got, err
}

// replayEventually re-runs a replay until it equals want, or fails after wait. It
// allows a broker whose replayable history trails the ingest queue.
func (e *env) replayEventually(tp mq.Topic, since time.Time, want []string) {
	e.t.Helper()
	if want == nil {
		want = []string{}
	}
	deadline := time.Now().Add(wait)
	var got []string
	for {
		var err error
		got, err = e.tryReplay(tp, since, 0)
		require.NoError(e.t, err, "replay %s since %v", tp, since)
		if slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(poll)
	}
	assert.Equal(e.t, want, got, "replay of %s since %v", tp, since)
}

// replayReaches polls until a replay of tp from the beginning yields at least n events.
func (e *env) replayReaches(tp mq.Topic, n int) {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		got, err := e.tryReplay(tp, time.Time{}, n)
		require.NoError(e.t, err, "replay %s", tp)
		if len(got) >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("replay of %s reached %d of %d events within %s: %q", tp, len(got), n, wait, got)
		}
		time.Sleep(poll)
	}
}

// replayThrough polls until a replay of tp since since ends with last (a fence
// published after everything else), then returns that replay. Because a topic's
// history is in order, the fence arriving means everything before it did.
func (e *env) replayThrough(tp mq.Topic, since time.Time, last string) []string {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		got := e.replay(tp, since)
		if len(got) > 0 && got[len(got)-1] == last {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("replay of %s never reached %q within %s: %q", tp, last, wait, got)
		}
		time.Sleep(poll)
	}
}

// eventually polls cond until it holds or wait passes.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(poll)
	}
}

// quiesces proves that delivery on ch ended: it publishes probes on tp until one is not
// delivered within quiet (failing if every probe for wait still was), then publishes
// two more and requires that neither arrives.
func (e *env) quiesces(tp mq.Topic, ch <-chan delivery, what string) {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for i := 0; ; i++ {
		e.publish(tp, fmt.Sprintf("probe-%d", i))
		if !drainedWithin(ch, quiet) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("delivery went on for %s after %s", wait, what)
		}
	}
	e.publish(tp, "probe-last-1")
	e.publish(tp, "probe-last-2")
	none(e.t, ch)
}

// drainedWithin reports whether something arrived on ch within d, draining whatever
// else is already there.
func drainedWithin(ch <-chan delivery, d time.Duration) bool {
	select {
	case <-ch:
		for {
			select {
			case <-ch:
			default:
				return true
			}
		}
	case <-time.After(d):
		return false
	}
}

// budget gives tenant a production-sized budget.
func (e *env) budget(tenant mq.TenantID) {
	e.t.Helper()
	require.NoError(e.t, e.b.SetMaxBytes(e.ctx, tenant, 64<<20), "budget %s", tenant)
}

// optional returns b as the optional interface T (mq.HealthChecker, say), or skips the
// case: a broker need not implement it.
func optional[T any](t *testing.T, b mq.Broker) T {
	t.Helper()
	v, ok := b.(T)
	if !ok {
		t.Skipf("the broker, a %T, does not implement %s", b, reflect.TypeFor[T]())
	}
	return v
}

// labels names each delivery by its tenant and data, as "acme/one": a failure listing
// what arrived shows whose events came, not only their data, which cases reuse across
// tenants.
func labels(ds []delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, string(d.topic.Tenant)+"/"+d.data)
	}
	return out
}

// byTenant groups payloads by tenant, in delivery order.
func byTenant(ds []delivery) map[mq.TenantID][]string {
	out := map[mq.TenantID][]string{}
	for _, d := range ds {
		out[d.topic.Tenant] = append(out[d.topic.Tenant], d.data)
	}
	return out
}

// seq returns prefix0 ... prefix(n-1).
func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// counter counts handler calls per payload across goroutines.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return c.n[key]
}

// isContextErr reports whether err is a context's error.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// reservedHeaderIn returns the first header of hd that a delivery must not carry, or "":
// one with the harness's ReservedHeaderPrefix (in any case), or the idempotency key,
// which a delivery gives as Message.ID.
func (h Harness) reservedHeaderIn(hd mq.Headers) string {
	prefix := strings.ToLower(h.ReservedHeaderPrefix)
	for k := range hd {
		if prefix != "" && strings.HasPrefix(strings.ToLower(k), prefix) || strings.EqualFold(k, mq.HeaderIdempotencyKey) {
			return k
		}
	}
	return ""
}
