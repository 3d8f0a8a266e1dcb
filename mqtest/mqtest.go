// Package mqtest states, once, the behaviour the rest of a process relies on from an
// [mq.Broker], as a conformance suite any broker can run.
//
// A broker author writes one test that calls [Run] with a [Harness]:
//
//	func TestMyBroker_Conformance(t *testing.T) {
//		mqtest.Run(t, mqtest.Harness{
//			New:         newBroker,       // a fresh, isolated broker per case
//			EndDelivery: deleteDurable,   // end delivery of mqtest.Durable from outside
//			Fill:        fillTenant,      // make the tenant's next Publish ErrQueueFull
//			DeadLetters: readParked,      // optional: read parked events back
//			Caps:        mqtest.Caps{PerTenantBudget: true /* ... */},
//		})
//	}
//
// Cases address events only by [mq.Topic] (tenant, table, optional scope), never by
// stream, subject or partition, so a broker passes by behaving correctly, not by
// copying another broker's layout. Where two brokers may legitimately differ, a
// capability flag in [Caps] says which way, and every flag is checked by behaviour in
// both directions: declaring true for something that does not work, or false for
// something that does, fails a case. Nothing else is optional, except the cases that
// need a hook the harness left nil.
//
// Every case runs as a parallel subtest on its own broker from [Harness.New]. Waits for
// something that should happen are bounded by a generous 5 s; something that must not
// happen is watched for 300 ms. No case asserts how fast anything is.
//
// [Run] installs the W3C TraceContext propagator as the global OpenTelemetry text-map
// propagator for the duration of the run (the trace case needs it) and restores the
// previous one afterwards. Because that is global state, Run must not be called from a
// parallel test, nor alongside other tests that read or set the global propagator.
package mqtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/wavehouse/mq"
)

// Tenants every broker from Harness.New must accept publishes for at once, budgeted as
// production wiring would budget them.
const (
	Acme   mq.TenantID = "acme"
	Globex mq.TenantID = "globex"
)

// Durable is the durable consumer name the suite creates, consumes and purges under:
// the ingest worker's own name for the ingest durable.
const Durable = mq.WorkerDurable

// Timing. wait bounds every wait for something that should happen; quiet is how long a
// case watches for something that must not.
const (
	wait  = 5 * time.Second
	quiet = 300 * time.Millisecond
	// poll is the pause between two attempts of an eventual check.
	poll = 20 * time.Millisecond
	// defaultTooLarge is the payload size refused when Harness.TooLarge is 0.
	defaultTooLarge = 8 << 20
)

// Harness is what a broker provides to the suite.
type Harness struct {
	// New returns a fresh, isolated broker, with Acme and Globex able to publish and
	// budgeted (64 MiB each) as production would. It registers the broker's cleanup on
	// t; that cleanup must tolerate a broker the case already closed.
	New func(t *testing.T) mq.Broker

	// EndDelivery ends delivery of Durable underneath a running consumer, from outside,
	// as an operator or the network could: delete the durable, or lose the connection
	// for good. The consumer must then report once on its failed channel.
	EndDelivery func(t *testing.T, b mq.Broker)

	// Fill makes the next Publish for tenant fail with mq.ErrQueueFull, for example by
	// shrinking its budget or its queue to a few KiB and publishing until refused. A
	// nil Fill skips the cases that need it.
	Fill func(t *testing.T, b mq.Broker, tenant mq.TenantID)

	// DeadLetters, if not nil, reads tenant's parked events back, in the order they
	// were parked: Data, Headers (as DeadLetter stored them) and TopicKey. A nil
	// DeadLetters skips only the assertions on parked contents; the counts are always
	// checked.
	DeadLetters func(t *testing.T, b mq.Broker, tenant mq.TenantID) []*mq.Message

	// Restart, if not nil, closes b as a host does at a deploy and returns a broker
	// opened again on the same store: the same directory for an embedded broker; for a
	// client of an external server, a new client after the server itself restarted.
	// A nil Restart skips the restart cases.
	Restart func(t *testing.T, b mq.Broker) mq.Broker

	// TooLarge is a payload size in bytes the broker refuses with mq.ErrPayloadTooLarge.
	// Zero means 8 MiB.
	TooLarge int

	// Caps declares where this broker legitimately differs from others.
	Caps Caps
}

// Caps are the capability flags. Each is checked by behaviour both ways.
type Caps struct {
	// PerTenantBudget: SetMaxBytes is enforced per tenant. True: a tenant over its
	// budget, or never given one, is refused with mq.ErrQueueFull while other tenants
	// still publish. False: budgets are recorded only, and a tenant publishes well past
	// a tiny budget.
	PerTenantBudget bool

	// PurgesAcked: PurgeAcked removes acknowledged events stored before the tenant's
	// cutoff, so they leave the replayable history, and reports true. False: retention
	// belongs to the operator; PurgeAcked removes nothing and reports false.
	PurgesAcked bool

	// UnbudgetedNotFound: DeadLetterCounts for a tenant that was never budgeted fails
	// with mq.ErrNoDeadLetterQueue. False: it returns zero counts and no error.
	UnbudgetedNotFound bool

	// ConfiguresDurables: CreateConsumer applies cfg to the durable, so any AckWait is
	// accepted (1h included). False: it only checks cfg against the operator's durable,
	// and refuses an AckWait longer than the durable's (24h is).
	ConfiguresDurables bool

	// StoresBudgets: the budgets SetMaxBytes set are kept in the broker's store and
	// reported by MaxBytes after a restart (checked only with Harness.Restart). False:
	// they live in the process, and the host sets them again after a restart.
	StoresBudgets bool

	// AckWaitRedelivers: an event delivered and left unsettled under an AckWait of
	// 200 ms comes back. False: it does not come back within the quiet window (the
	// operator's ack wait governs).
	AckWaitRedelivers bool
}

// testCase is one conformance case. skip returns a reason when the harness cannot run
// it, or "".
type testCase struct {
	name string
	skip func(h Harness) string
	run  func(t *testing.T, h Harness)
}

func always(Harness) string { return "" }

func needFill(h Harness) string {
	if h.Fill == nil {
		return "Harness.Fill is nil"
	}
	return ""
}

// cases lists every case, in a fixed order.
func cases() []testCase {
	var all []testCase
	for _, group := range [][]testCase{
		publishCases(),
		inputCases(),
		hubCases(),
		consumeCases(),
		deliveryEndCases(),
		replayCases(),
		deadLetterCases(),
		budgetCases(),
		purgeCases(),
		closeCases(),
		restartCases(),
	} {
		all = append(all, group...)
	}
	return all
}

// CaseNames returns the name of every case Run runs, in order.
func CaseNames() []string {
	var names []string
	for _, c := range cases() {
		names = append(names, c.name)
	}
	return names
}

// Run runs every conformance case against the brokers h makes, each as a parallel
// subtest of t on a fresh broker. It sets the global OpenTelemetry propagator for the
// run (see the package comment), so it must not be called from a parallel test.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.EndDelivery == nil {
		t.Fatal("mqtest: Harness.New and Harness.EndDelivery are required")
	}
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	seen := map[string]bool{}
	for _, c := range cases() {
		if seen[c.name] {
			t.Fatalf("mqtest: case %q listed twice", c.name)
		}
		seen[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			if reason := c.skip(h); reason != "" {
				t.Skipf("the harness excludes this case: %s", reason)
			}
			t.Parallel()
			c.run(t, h)
		})
	}
}

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
	b := h.New(t)
	require.NotNil(t, b, "Harness.New returned nil")
	ctx, cancel := context.WithTimeout(t.Context(), 4*wait)
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
}

func datas(ds []delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.data
	}
	return out
}

// deliveryBuffer is the capacity of a delivery channel.
const deliveryBuffer = 1024

// push hands d to ch unless the case is over.
func (e *env) push(ch chan<- delivery, m *mq.Message) {
	d := delivery{topic: m.Topic(), data: string(m.Data), msg: m}
	select {
	case ch <- d:
	case <-e.over:
	}
}

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
	ch := make(chan delivery, deliveryBuffer)
	stop, failed, err := c.Consume(func(m *mq.Message) error {
		if !e.live() {
			return errors.New("mqtest: the case is over")
		}
		err := handle(m)
		e.push(ch, m)
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
	ch := make(chan delivery, deliveryBuffer)
	require.NoError(e.t, e.b.Subscribe(ctx, name, func(m *mq.Message) error {
		if e.live() {
			e.push(ch, m)
		}
		return nil
	}), "subscribe %q", name)
	return ch
}

// next collects exactly n deliveries, failing if wait passes without a new one.
func next(t *testing.T, ch <-chan delivery, n int) []delivery {
	t.Helper()
	out := make([]delivery, 0, n)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(out) < n {
		select {
		case d := <-ch:
			out = append(out, d)
			timer.Reset(wait)
		case <-timer.C:
			t.Fatalf("got %d of %d deliveries, then nothing for %s: %q", len(out), n, wait, datas(out))
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
	select {
	case got := <-ch:
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

// hasReservedHeader returns the first header of h whose key starts with "Nats-" in any
// case, or "".
func hasReservedHeader(h mq.Headers) string {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			return k
		}
	}
	return ""
}

// tooLarge returns the payload size the harness says the broker refuses.
func (h Harness) tooLarge() int {
	if h.TooLarge > 0 {
		return h.TooLarge
	}
	return defaultTooLarge
}
