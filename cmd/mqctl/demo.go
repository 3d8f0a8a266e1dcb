package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "demo",
		summary: "run an embedded broker through publish, two workers, hub, dead letter and replay; exit 0 only if every count matches",
		usage:   "[-events n] [-timeout d] [-v]",
		run:     runDemo,
	})
}

var (
	// One tenant on each of the default four partitions (mq.Partition: acme 3,
	// globex 2, initech 1, contoso 0), so the summary shows every partition's worker.
	demoTenants    = []mq.TenantID{"acme", "globex", "initech", "contoso"}
	demoTables     = []string{"orders", "clicks", "signups"}
	demoUnbudgeted = mq.TenantID("hooli") // never given a budget: must be refused
	demoBudget     = int64(64 << 20)
)

// demoEvent is the payload of every demo event; Seq counts per tenant from 1.
type demoEvent struct {
	Tenant mq.TenantID `json:"tenant"`
	Table  string      `json:"table"`
	Scope  string      `json:"scope,omitempty"`
	Seq    int         `json:"seq"`
	Poison bool        `json:"poison,omitempty"`
}

func (ev demoEvent) topic() mq.Topic {
	return mq.Topic{Tenant: ev.Tenant, Table: ev.Table, Scope: ev.Scope}
}

func (ev demoEvent) id() string { return fmt.Sprintf("%s#%d", ev.Tenant, ev.Seq) }

// demoPlan is what the demo publishes: perTenant events for each tenant, rotating over
// the tables, every fifth one scoped "eu". The first acme event on orders/eu is poison.
type demoPlan struct {
	events   map[mq.TenantID][]demoEvent
	total    int
	half     int // events per tenant published before the replay's cut
	poison   demoEvent
	replayTo mq.Topic // the topic replayed from the cut
}

// demoTopology is the embedded broker's topology, the defaults, spelled out because
// the demo reads the dead-letter stream by name and spreads tenants over partitions.
var demoTopology = mq.NATSTopology{}.WithDefaults()

func newDemoPlan(perTenant int) demoPlan {
	p := demoPlan{events: map[mq.TenantID][]demoEvent{}, half: perTenant / 2}
	for _, tenant := range demoTenants {
		for seq := 1; seq <= perTenant; seq++ {
			ev := demoEvent{Tenant: tenant, Table: demoTables[(seq-1)%len(demoTables)], Seq: seq}
			if seq%5 == 0 {
				ev.Scope = "eu"
			}
			if p.poison.Seq == 0 && tenant == "acme" && ev.Table == "orders" && ev.Scope == "eu" {
				ev.Poison = true
				p.poison = ev
			}
			p.events[tenant] = append(p.events[tenant], ev)
			p.total++
		}
	}
	p.replayTo = mq.Topic{Tenant: "acme", Table: "orders"}
	return p
}

// nextSeq is the tenant's next event a worker writes after the one numbered seq: the
// poison event is parked, never written.
func (p demoPlan) nextSeq(tenant mq.TenantID, seq int) int {
	if next := seq + 1; p.poison.Tenant != tenant || next != p.poison.Seq {
		return next
	}
	return seq + 2
}

// count returns how many events of exactly topic are in the tenant's events[from:].
func (p demoPlan) count(topic mq.Topic, from int) int {
	n := 0
	for _, ev := range p.events[topic.Tenant][from:] {
		if ev.topic() == topic {
			n++
		}
	}
	return n
}

// demoRun is one demo's state: the counters the workers and the hub update, and the
// checks each step adds.
type demoRun struct {
	out    io.Writer
	broker *mq.EmbeddedNATS
	topo   mq.NATSTopology
	plan   demoPlan
	checks []demoCheck

	mu        sync.Mutex
	published int // publishes the broker confirmed
	batches   int // PublishBatch calls the broker confirmed
	replayed  int // events the replays sent
	fleet     demoFleet
	hubSeen   int
	hubLast   map[mq.TenantID]int
	problems  []string // unexpected events: decoding, topic, order, settle failures

	phases []demoPhase
}

type demoPhase struct {
	name string
	took time.Duration
}

type demoCheck struct {
	what      string
	got, want string
}

// check records one count against its expectation; the summary prints them all and
// the demo fails on the first that differs.
func (d *demoRun) check(what string, got, want any) {
	d.checks = append(d.checks, demoCheck{what: what, got: fmt.Sprint(got), want: fmt.Sprint(want)})
}

func runDemo(ctx context.Context, e *env, args []string) int {
	c := commands["demo"]
	fs := c.flags(e)
	perTenant := fs.Int("events", 120, "events published per tenant (at least 20)")
	timeout := fs.Duration("timeout", 60*time.Second, "the whole demo's time limit")
	verbose := fs.Bool("v", false, "log the broker's debug output to stderr")
	if code := parse(e, fs, args); code >= 0 {
		return code
	}
	if *perTenant < 20 {
		fmt.Fprintln(e.stderr, "mqctl demo: -events must be at least 20")
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(e.stderr, "mqctl demo: -timeout %s: must be more than 0\n", *timeout)
		return 2
	}
	// A report that could not be written stops the demo at the next step (see step):
	// nobody sees it go on, and its store is removed on the way out.
	const report = "the demo's report"
	if err := demo(ctx, e, *perTenant, *timeout, *verbose); err != nil {
		if e.outputLost("mqctl demo", report) {
			return 1
		}
		fmt.Fprintf(e.stdout, "\nFAIL: %v\n", err)
		return 1
	}
	fmt.Fprintln(e.stdout, "\nPASS: every count matches")
	if e.outputLost("mqctl demo", report) {
		return 1
	}
	return 0
}

func demo(ctx context.Context, e *env, perTenant int, timeout time.Duration, verbose bool) (err error) {
	timedOut := fmt.Errorf("the demo did not finish within %s", timeout)
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, timedOut)
	defer cancel()
	defer func() {
		// A call that failed on the deadline reports only "context deadline exceeded".
		if err != nil && ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
	}()
	begin := time.Now()

	level := slog.LevelWarn
	if verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))

	d := &demoRun{
		out:     e.stdout,
		topo:    demoTopology,
		plan:    newDemoPlan(perTenant),
		fleet:   newDemoFleet(demoTopology.Partitions),
		hubLast: map[mq.TenantID]int{},
	}

	dir, err := os.MkdirTemp("", "mqctl-demo-")
	if err != nil {
		return fmt.Errorf("store directory: %w", err)
	}
	defer func() {
		if rmErr := os.RemoveAll(dir); rmErr != nil && err == nil {
			err = fmt.Errorf("remove store directory: %w", rmErr)
		}
	}()

	// 1. The broker, listening on loopback as well: the dead-letter reader connects
	// to it with a client of its own (see demo_deadletter.go). Its metrics and spans
	// are kept for the summary (see demo_telemetry.go).
	tel := newDemoTelemetry()
	defer tel.shutdown()
	var broker *mq.EmbeddedNATS
	if err := d.step("start embedded broker", func() error {
		var err error
		broker, err = mq.NewEmbedded(ctx, mq.EmbeddedOptions{StoreDir: dir, ListenAddr: "127.0.0.1:0",
			Topology: d.topo, Logger: logger, MeterProvider: tel.meters, TracerProvider: tel.tracer})
		if err != nil {
			return err
		}
		d.printf("store %s, topology created, %d partitions; clients at %s", dir, d.topo.Partitions, broker.ClientURL())
		return nil
	}); err != nil {
		return err
	}
	d.broker = broker
	closed := false
	defer func() {
		if !closed {
			_ = broker.Close()
		}
	}()

	// 2. Budgets.
	if err := d.step("set tenant budgets", func() error {
		for _, t := range demoTenants {
			if err := broker.SetMaxBytes(ctx, t, demoBudget); err != nil {
				return fmt.Errorf("set budget %s: %w", t, err)
			}
			d.check("budget "+string(t), mib(broker.MaxBytes(t)), mib(demoBudget))
		}
		d.printf("%d MiB each for %s", demoBudget>>20, joinTenants(demoTenants))
		return nil
	}); err != nil {
		return err
	}

	// 3. The hub and the workers.
	hubCtx, stopHub := context.WithCancel(ctx)
	defer stopHub()
	defer d.stopWorkers()
	if err := d.step("start hub and workers", func() error {
		if err := broker.Subscribe(hubCtx, "demo-hub", d.hub); err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		d.printf("hub subscribed")
		return d.startWorkers(ctx)
	}); err != nil {
		return err
	}
	failed := d.workersFailed(ctx)

	// 4. Publish: one publisher per tenant, in two halves around the replay's cut.
	var cut time.Time
	if err := d.step("publish events", func() error {
		if err := d.publish(ctx, 0, d.plan.half); err != nil {
			return err
		}
		// Replay reads the history, whose stored time is when it copied an event from
		// its partition, a little after the publish returned. So the cut waits until
		// the hub (which reads the history too) saw the whole first half.
		firstHalf := d.plan.half * len(demoTenants)
		if err := d.waitFor(ctx, "the hub to see the first half", failed, func() (bool, string) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.hubSeen >= firstHalf, fmt.Sprintf("seen %d of %d", d.hubSeen, firstHalf)
		}); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // stored times strictly before the cut
		cut = time.Now()
		time.Sleep(2 * time.Millisecond)
		d.printf("first half: %d events; replay cut at %s", firstHalf, cut.Format("15:04:05.000000"))
		// The second half goes as the ingest API sends a request's rows: in batches.
		if err := d.publishBatches(ctx, d.plan.half, perTenant); err != nil {
			return err
		}
		d.printf("%d events: %d tenants x %d, tables %s, every fifth scoped \"eu\"; poison: %s %s",
			d.plan.total, len(demoTenants), perTenant, strings.Join(demoTables, ", "), d.plan.poison.id(), d.plan.poison.topic())

		err := broker.Publish(ctx, mq.Topic{Tenant: demoUnbudgeted, Table: "orders"}, []byte(`{}`))
		refused := errors.Is(err, mq.ErrQueueFull)
		d.check("unbudgeted tenant "+string(demoUnbudgeted)+" refused with ErrQueueFull", refused, true)
		d.printf("tenant %s (no budget): %v", demoUnbudgeted, err)
		return nil
	}); err != nil {
		return err
	}
	d.mu.Lock()
	d.check("events published (confirmed)", d.published, d.plan.total)
	perTenantBatches := (perTenant - d.plan.half + demoBatchSize - 1) / demoBatchSize
	d.check(fmt.Sprintf("atomic PublishBatch calls confirmed (second half, %d events each)", demoBatchSize),
		d.batches, perTenantBatches*len(demoTenants))
	d.mu.Unlock()

	// 5. Wait for the workers and the hub. The poison event is never written: the
	// workers' policy parks it, and its tenant's later events are written after it.
	if err := d.step("wait for workers and hub", func() error {
		want := d.plan.total - 1
		if err := d.waitFor(ctx, "the workers", failed, func() (bool, string) {
			d.mu.Lock()
			defer d.mu.Unlock()
			n := len(d.fleet.written)
			return n >= want, fmt.Sprintf("written %d of %d", n, want)
		}); err != nil {
			return err
		}
		if err := d.waitFor(ctx, "the hub", failed, func() (bool, string) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.hubSeen >= d.plan.total, fmt.Sprintf("seen %d of %d", d.hubSeen, d.plan.total)
		}); err != nil {
			return err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, w := range d.fleet.members {
			d.printf("%s: %d handler calls, %d written", w.name, w.calls, w.written)
		}
		d.printf("partition handovers: %d; poison %s: %d failed attempts; hub: %d seen",
			d.fleet.handovers, d.plan.poison.id(), len(d.fleet.poison), d.hubSeen)
		return nil
	}); err != nil {
		return err
	}
	d.mu.Lock()
	d.check("hub seen", d.hubSeen, d.plan.total)
	d.mu.Unlock()

	// 6. Replay the gap since the cut, and the topic's whole history.
	if err := d.step("replay "+d.plan.replayTo.String(), func() error {
		since, err := d.replay(ctx, cut)
		if err != nil {
			return err
		}
		all, err := d.replay(ctx, time.Time{})
		if err != nil {
			return err
		}
		d.check("replayed "+d.plan.replayTo.String()+" since the cut", since, d.plan.count(d.plan.replayTo, d.plan.half))
		d.check("replayed "+d.plan.replayTo.String()+" since the beginning", all, d.plan.count(d.plan.replayTo, 0))
		d.replayed = since + all
		d.printf("since the cut: %d events; since the beginning: %d events", since, all)
		return nil
	}); err != nil {
		return err
	}

	// 7. Dead letters: the counts per tenant and table, and the parked event itself.
	var dl demoDeadLetters
	if err := d.step("read dead letters", func() error {
		var err error
		dl, err = d.deadLetters(ctx)
		return err
	}); err != nil {
		return err
	}

	// 8. Shut down.
	var stats mq.Stats
	var metrics map[string]demoSeries
	var traces demoTraces
	if err := d.step("stop and close", func() error {
		d.stopWorkers()
		stopHub()
		var err error
		if stats, err = broker.Stats(); err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		// Read once no handler call runs and before Close ends the gauges.
		if metrics, err = tel.collect(ctx); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		traces = tel.traces()
		closed = true
		if err := broker.Close(); err != nil {
			return fmt.Errorf("close: %w", err)
		}
		select {
		case err := <-failed:
			return fmt.Errorf("worker reported failed after stop: %w", err)
		default:
		}
		d.printf("workers stopped; server: %d msgs in, %d msgs out; store removed", stats.InMsgs, stats.OutMsgs)
		return nil
	}); err != nil {
		return err
	}

	d.mu.Lock()
	d.checkWorkers()
	d.checkParked(dl.parked)
	problems := slices.Clone(d.problems)
	d.mu.Unlock()
	d.check("unexpected deliveries (decode, topic, order, settle)", len(problems), 0)
	d.checkTelemetry(metrics, traces)

	d.summary(dl, time.Since(begin))
	telemetrySummary(d.out, metrics, traces)
	for _, p := range problems {
		fmt.Fprintf(d.out, "problem: %s\n", p)
	}
	for _, c := range d.checks {
		if c.got != c.want {
			return fmt.Errorf("%s: got %s, want %s", c.what, c.got, c.want)
		}
	}
	return nil
}

// step runs one phase, printing its name, its detail lines and its time. A write of
// the report that failed (stdout full, or a pipe its reader closed) ends the demo
// here, before the phase or after it.
func (d *demoRun) step(name string, f func() error) error {
	if _, err := fmt.Fprintf(d.out, "==> %s\n", name); err != nil {
		return fmt.Errorf("%s: write the report: %w", name, err)
	}
	start := time.Now()
	err := f()
	took := time.Since(start)
	d.phases = append(d.phases, demoPhase{name: name, took: took})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if _, err := fmt.Fprintf(d.out, "    done in %s\n", round(took)); err != nil {
		return fmt.Errorf("%s: write the report: %w", name, err)
	}
	return nil
}

func (d *demoRun) printf(format string, args ...any) {
	fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

func (d *demoRun) problem(format string, args ...any) {
	d.problems = append(d.problems, fmt.Sprintf(format, args...))
}

// decode reads a delivered event and checks that its topic is the one it was
// published on; it records a problem and returns false if not.
func (d *demoRun) decode(path string, msg *mq.Message) (demoEvent, bool) {
	var ev demoEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		d.problem("%s: undecodable payload %q: %v", path, msg.Data, err)
		return ev, false
	}
	if got := msg.Topic(); got != ev.topic() {
		d.problem("%s: %s delivered on topic %s, published on %s", path, ev.id(), got, ev.topic())
		return ev, false
	}
	return ev, true
}

// waitFor polls done until it reports true, a worker fails, or ctx ends.
func (d *demoRun) waitFor(ctx context.Context, what string, failed <-chan error, done func() (bool, string)) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, progress := done()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%s): %w", what, progress, context.Cause(ctx))
		case err := <-failed:
			return fmt.Errorf("waiting for %s (%s): worker delivery ended: %w", what, progress, err)
		case <-tick.C:
		}
	}
}
