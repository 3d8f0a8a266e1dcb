package mqtest

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

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
// case watches for something that must not; ackWait is the short AckWait of the cases
// that rely on the ack wait redelivering; idle is how long a restart case leaves the
// broker alone before restarting it. Each is its base scaled by the harness and
// MQTEST_WAIT_SCALE: Run sets them for its run, as it sets the propagator, and
// restores them afterwards. The ack wait is scaled with the rest because on a loaded
// machine a handler's ack can take longer than a fixed 200 ms to reach the broker, and
// an event then comes back that the case says must not.
var (
	wait    = baseWait
	quiet   = baseQuiet
	ackWait = baseAckWait
	idle    = baseIdle
	// restartBudget is what a case's context allows each restart of its broker.
	restartBudget = baseRestartBudget
)

const (
	baseWait    = 5 * time.Second
	baseQuiet   = 300 * time.Millisecond
	baseAckWait = 200 * time.Millisecond
	// baseIdle: a broker that finishes work in the background (a history copying
	// events, a flush) has done it by then, as between a host's last event and a
	// deploy.
	baseIdle          = 2 * time.Second
	baseRestartBudget = 30 * time.Second
	// waitScaleEnv names the environment variable that scales wait and quiet.
	waitScaleEnv = "MQTEST_WAIT_SCALE"
	// poll is the pause between two attempts of an eventual check.
	poll = 20 * time.Millisecond
	// defaultTooLarge is the payload size refused when Harness.TooLarge is 0.
	defaultTooLarge = 8 << 20
)

// Harness is what a broker provides to the suite. Only New is required.
type Harness struct {
	// New returns a fresh, isolated broker, with Acme and Globex able to publish and
	// budgeted (64 MiB each) as production would. It registers the broker's cleanup on
	// t; that cleanup must tolerate a broker the case already closed.
	//
	// Required: Run fails without it.
	New func(t *testing.T) mq.Broker

	// EndDelivery ends delivery of Durable underneath a running consumer, from outside,
	// as an operator or the network could: delete the durable, or lose the connection
	// for good. The consumer must then report once on its failed channel.
	//
	// Optional: nil skips the cases that end delivery from outside, with the reason
	// "Harness.EndDelivery is nil".
	EndDelivery func(t *testing.T, b mq.Broker)

	// Fill makes the next Publish for tenant of any event, the smallest included (no
	// data, table "t", no scope, no header), fail with mq.ErrQueueFull. A broker that
	// enforces SetMaxBytes passes [FillByPublishing]; one that does not shrinks its
	// queue first and then calls FillByPublishing.
	//
	// Optional: nil skips the cases that need a full tenant.
	Fill func(t *testing.T, b mq.Broker, tenant mq.TenantID)

	// DeadLetters reads tenant's parked events back, in the order they were parked:
	// Data, Headers (as DeadLetter stored them) and TopicKey.
	//
	// Optional: nil skips only the assertions on parked contents; the counts are
	// always checked.
	DeadLetters func(t *testing.T, b mq.Broker, tenant mq.TenantID) []*mq.Message

	// Restart closes b as a host does at a deploy and returns a broker opened again on
	// the same store: the same directory for an embedded broker; for a client of an
	// external server, a new client after the server itself restarted. As New does, it
	// registers the reopened broker's cleanup on t, tolerating a broker the case already
	// closed: the suite closes neither broker, and one left open holds its server, its
	// connections and its store until the process ends. See the example of Harness.
	//
	// Optional: nil skips the restart cases.
	Restart func(t *testing.T, b mq.Broker) mq.Broker

	// TooLarge is a payload size in bytes the broker refuses with mq.ErrPayloadTooLarge.
	// Zero means 8 MiB.
	TooLarge int

	// ReservedHeaderPrefix is the prefix of the header names the broker keeps for
	// itself ("Nats-" for the NATS brokers), matched in any case. The suite checks
	// that Publish and DeadLetter refuse an option header with it with
	// mq.ErrInvalidHeader, that no delivered Message.Headers carries one, and that
	// headers outside it, NATS-like names included when the prefix is another,
	// round-trip. Empty: the broker reserves no names, and those NATS-like names
	// round-trip too. mq.HeaderIdempotencyKey is the caller's way to set an
	// idempotency key on every broker, never a delivered header.
	ReservedHeaderPrefix string

	// WaitScale multiplies the suite's windows: the 5 s bound on waiting for something
	// that should happen, the 300 ms of watching for something that must not, the
	// 200 ms AckWait of the cases that need the ack wait to redeliver, and the 2 s a
	// restart case leaves the broker idle. Zero means 1; MQTEST_WAIT_SCALE, when set,
	// multiplies it again (see the package comment on loaded machines).
	WaitScale float64

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
	// 200 ms (times the wait scale) comes back. False: it does not come back within the quiet window (the
	// operator's ack wait governs).
	AckWaitRedelivers bool

	// RetryPolicy: the worker applies ConsumerConfig's poison policy. True: a failed
	// event (a handler error or panic) comes back no sooner than RetryDelay after the
	// failed call returned, the delay doubling up to MaxRetryDelay; a failure on its
	// MaxDeliveries-th delivery parks it with the mq.HeaderDead* headers and
	// acknowledges it, and its tenant moves on; a negative MaxDeliveries never parks.
	// False: retries follow the broker's own redelivery and the worker parks nothing:
	// an event that always fails is delivered past MaxDeliveries.
	RetryPolicy bool

	// ConcurrentTenants: one Consume runs up to ConsumerConfig.Concurrency handler
	// calls at once, for different tenants. True: under Concurrency 3 three tenants'
	// calls are in flight together and a fourth does not begin. False: the calls run
	// one at a time. Either way a tenant never has two calls at once.
	ConcurrentTenants bool

	// HandsBackOnStop: stop hands back, unsettled and in order, what the worker holds
	// that no handler call has (a failed event waiting for its retry, one the handler
	// nak'ed with a delay, the events of their tenants queued behind them), so a new
	// Consume gets them at once, the held event first, rather than after the retry
	// delay or the ack wait. False: they come back only then. Either way what a handler
	// returned without settling stays the host's to settle after stop.
	HandsBackOnStop bool

	// SharedConsumers: several Consumes of one durable (in one process or several)
	// share its events: each is handed a share, a tenant's events are handled by one
	// at a time and in order, and the share of one that stops moves to the others.
	// False: a durable has one Consume at a time, and a second one while the first
	// runs is refused with an error.
	SharedConsumers bool

	// DurablesOnDemand: CreateConsumer creates a consumer group for any durable name it
	// was never given, with every stored event to deliver, as a broker whose consumer
	// groups are made on first use does; PurgeAcked still refuses a name no
	// CreateConsumer made. False: it knows only mq's names for the ingest durable
	// (Durable, "") and refuses any other with mq.ErrConsumerNotFound.
	DurablesOnDemand bool

	// StatsConnections: Stats.Connections counts the broker's live client connections,
	// at least 1 while it runs. False: the broker has no connections, and
	// Stats.Connections is always 0.
	StatsConnections bool

	// AtomicBatch: PublishBatch honours Batch.Atomic. True: an atomic batch stores
	// every event, in order, or none. False: the broker has no atomic batches and
	// refuses one whole, storing nothing, with an error wrapping errors.ErrUnsupported;
	// its pipelined batches work all the same.
	AtomicBatch bool
}

// Case describes one conformance case, for the author of a broker reading why it
// failed: Run runs it as the subtest Name.
type Case struct {
	// Name is the subtest's name: a failure reads TestYourBroker_Conformance/Name.
	Name string
	// Proves is the behaviour the case checks, as the contract in package mq states it.
	Proves string
	// Hooks are the Harness fields besides New, Caps and WaitScale the case uses
	// (EndDelivery, Fill, DeadLetters, Restart, TooLarge, ReservedHeaderPrefix). A
	// case whose hook the harness leaves nil is skipped; with DeadLetters nil it
	// checks less, with TooLarge 0 it takes the default, with ReservedHeaderPrefix
	// empty it checks that no name is reserved.
	Hooks []string
	// Flags are the Caps flags that change what the case expects, each value
	// checked by behaviour, so a wrong flag fails the case. A few cases run only
	// under a flag (their Proves starts "Only with <flag>") and are skipped without
	// it, with a reason naming the flag.
	Flags []string
	// Publishes is what the case stores: tenants, topics (tenant/table[/scope]) and
	// roughly how many events. Tenants besides Acme and Globex are budgeted by the
	// case with SetMaxBytes.
	Publishes string
}

// Cases describes every case [Run] runs, in the order it runs them. The case's code
// is in the cases_*.go file of its area; the repository's README tables them all.
func Cases() []Case {
	var out []Case
	for _, c := range cases() {
		out = append(out, Case{
			Name:      c.name,
			Proves:    c.proves,
			Hooks:     slices.Clone(c.hooks),
			Flags:     slices.Clone(c.flags),
			Publishes: c.publishes,
		})
	}
	return out
}

// testCase is one conformance case: its description (see Case) and how it runs. skip
// returns a reason when the harness cannot run it, or ""; nil never skips.
type testCase struct {
	name      string
	proves    string
	hooks     []string
	flags     []string
	publishes string
	skip      func(h Harness) string
	run       func(t *testing.T, h Harness)
}

func needFill(h Harness) string {
	if h.Fill == nil {
		return "Harness.Fill is nil"
	}
	return ""
}

func needEndDelivery(h Harness) string {
	if h.EndDelivery == nil {
		return "Harness.EndDelivery is nil"
	}
	return ""
}

// cases lists every case, in a fixed order.
func cases() []testCase {
	var all []testCase
	for _, group := range [][]testCase{
		publishCases(),
		batchCases(),
		inputCases(),
		hubCases(),
		hubSerialCases(),
		consumeCases(),
		redeliveryCases(),
		workerCases(),
		deliveryEndCases(),
		replayCases(),
		deadLetterCases(),
		deadLetterWorkflowCases(),
		deadLetterTenantCases(),
		deadLetterQueryCases(),
		budgetCases(),
		purgeCases(),
		closeCases(),
		healthCases(),
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
// subtest of t on a fresh broker. It sets the global OpenTelemetry propagator and the
// suite's windows for the run (see the package comment), so it must not be called
// from a parallel test. A harness without New, or with a bad scale, fails t at once.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("mqtest: Harness.New is nil; it is required: it makes each case's broker")
	}
	scale, err := h.waitScale()
	if err != nil {
		t.Fatal(err)
	}
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	setWindows(scale)
	t.Cleanup(func() {
		otel.SetTextMapPropagator(prev)
		setWindows(1)
	})

	seen := map[string]bool{}
	for _, c := range cases() {
		if seen[c.name] {
			t.Fatalf("mqtest: case %q listed twice", c.name)
		}
		seen[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			if c.skip != nil {
				if reason := c.skip(h); reason != "" {
					t.Skipf("the harness excludes this case: %s", reason)
				}
			}
			t.Parallel()
			c.run(t, h)
		})
	}
}

// setWindows scales every timing window of the suite by scale.
func setWindows(scale float64) {
	wait, quiet = scaled(baseWait, scale), scaled(baseQuiet, scale)
	ackWait, idle = scaled(baseAckWait, scale), scaled(baseIdle, scale)
	// Never below the base: a broker's start does not speed up with a small scale.
	restartBudget = max(scaled(baseRestartBudget, scale), baseRestartBudget)
}

// waitScale is WaitScale (0 means 1) times MQTEST_WAIT_SCALE (unset means 1); either
// must be a positive number.
func (h Harness) waitScale() (float64, error) {
	scale := h.WaitScale
	switch {
	case scale == 0:
		scale = 1
	case scale < 0 || math.IsNaN(scale) || math.IsInf(scale, 0):
		return 0, fmt.Errorf("mqtest: Harness.WaitScale is %v; want a positive factor, or 0 for 1", h.WaitScale)
	}
	if v, ok := os.LookupEnv(waitScaleEnv); ok && v != "" {
		env, err := strconv.ParseFloat(v, 64)
		if err != nil || !(env > 0) || math.IsInf(env, 0) { // !(> 0) refuses NaN too
			return 0, fmt.Errorf("mqtest: %s is %q; want a positive factor such as 2 or 0.5", waitScaleEnv, v)
		}
		scale *= env
	}
	return scale, nil
}

// scaled is d times scale, at least a millisecond and at most the longest Duration (a
// product past it would wrap to a negative one).
func scaled(d time.Duration, scale float64) time.Duration {
	f := float64(d) * scale
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(time.Duration(f), time.Millisecond)
}

// tooLarge returns the payload size the harness says the broker refuses.
func (h Harness) tooLarge() int {
	if h.TooLarge > 0 {
		return h.TooLarge
	}
	return defaultTooLarge
}
