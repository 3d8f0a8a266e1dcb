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
		summary: "run an embedded broker through publish, worker, hub, dead letter and replay; exit 0 only if every count matches",
		usage:   "[-events n] [-timeout d] [-v]",
		run:     runDemo,
	})
}

var (
	demoTenants    = []mq.TenantID{"acme", "globex", "initech"}
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

// demoRun is one demo's state: the counters the worker and the hub update.
type demoRun struct {
	out    io.Writer
	broker mq.Broker
	plan   demoPlan

	mu         sync.Mutex
	published  int             // publishes the broker confirmed
	written    map[string]bool // worker: DoubleAck confirmed (poison: parked, then acked)
	deliveries int             // worker: every delivery, redeliveries included
	parked     map[string]bool
	hubSeen    int
	hubLast    map[mq.TenantID]int
	problems   []string // unexpected events: decoding, topic, order, settle failures

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

func runDemo(ctx context.Context, e *env, args []string) int {
	c := commands["demo"]
	fs := c.flags(e)
	perTenant := fs.Int("events", 120, "events published per tenant (at least 20)")
	timeout := fs.Duration("timeout", 60*time.Second, "the whole demo's time limit")
	verbose := fs.Bool("v", false, "log the broker's debug output to stderr")
	if code := parse(fs, args); code >= 0 {
		return code
	}
	if *perTenant < 20 {
		fmt.Fprintln(e.stderr, "mqctl demo: -events must be at least 20")
		return 2
	}
	if err := demo(ctx, e, *perTenant, *timeout, *verbose); err != nil {
		fmt.Fprintf(e.stdout, "\nFAIL: %v\n", err)
		return 1
	}
	fmt.Fprintln(e.stdout, "\nPASS: every count matches")
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
		plan:    newDemoPlan(perTenant),
		written: map[string]bool{},
		parked:  map[string]bool{},
		hubLast: map[mq.TenantID]int{},
	}
	var checks []demoCheck
	check := func(what string, got, want any) {
		checks = append(checks, demoCheck{what: what, got: fmt.Sprint(got), want: fmt.Sprint(want)})
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

	// 1. The broker.
	var broker *mq.EmbeddedNATS
	if err := d.step("start embedded broker", func() error {
		var err error
		broker, err = mq.NewEmbedded(ctx, mq.EmbeddedOptions{StoreDir: dir, Logger: logger})
		if err != nil {
			return err
		}
		d.printf("store %s, topology created", dir)
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
			check("budget "+string(t), mib(broker.MaxBytes(t)), mib(demoBudget))
		}
		d.printf("%d MiB each for %s", demoBudget>>20, joinTenants(demoTenants))
		return nil
	}); err != nil {
		return err
	}

	// 3. The hub and the worker.
	hubCtx, stopHub := context.WithCancel(ctx)
	defer stopHub()
	var (
		stopWorker func()
		failed     <-chan error
	)
	if err := d.step("start hub and worker", func() error {
		if err := broker.Subscribe(hubCtx, "demo-hub", d.hub); err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		consumer, err := broker.CreateConsumer(ctx, mq.ConsumerConfig{Durable: mq.WorkerDurable})
		if err != nil {
			return fmt.Errorf("create consumer: %w", err)
		}
		stopWorker, failed, err = consumer.Consume(d.worker, 0)
		if err != nil {
			return fmt.Errorf("consume: %w", err)
		}
		d.printf("hub subscribed; worker consuming durable %q", mq.WorkerDurable)
		return nil
	}); err != nil {
		return err
	}
	workerStopped := false
	defer func() {
		if !workerStopped {
			stopWorker()
		}
	}()

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
		if err := d.publish(ctx, d.plan.half, perTenant); err != nil {
			return err
		}
		d.printf("%d events: %d tenants x %d, tables %s, every fifth scoped \"eu\"; poison: %s %s",
			d.plan.total, len(demoTenants), perTenant, strings.Join(demoTables, ", "), d.plan.poison.id(), d.plan.poison.topic())

		err := broker.Publish(ctx, mq.Topic{Tenant: demoUnbudgeted, Table: "orders"}, []byte(`{}`))
		refused := errors.Is(err, mq.ErrQueueFull)
		check("unbudgeted tenant "+string(demoUnbudgeted)+" refused with ErrQueueFull", refused, true)
		d.printf("tenant %s (no budget): %v", demoUnbudgeted, err)
		return nil
	}); err != nil {
		return err
	}
	d.mu.Lock()
	check("events published (confirmed)", d.published, d.plan.total)
	d.mu.Unlock()

	// 5. Wait for the worker and the hub.
	if err := d.step("wait for worker and hub", func() error {
		if err := d.waitFor(ctx, "the worker", failed, func() (bool, string) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return len(d.written) >= d.plan.total, fmt.Sprintf("written %d of %d", len(d.written), d.plan.total)
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
		d.printf("worker: %d written (%d deliveries), %d parked; hub: %d seen", len(d.written), d.deliveries, len(d.parked), d.hubSeen)
		d.mu.Unlock()
		return nil
	}); err != nil {
		return err
	}
	d.mu.Lock()
	check("worker consumed (distinct events)", len(d.written), d.plan.total)
	check("worker parked (poison events)", len(d.parked), 1)
	check("hub seen", d.hubSeen, d.plan.total)
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
		check("replayed "+d.plan.replayTo.String()+" since the cut", since, d.plan.count(d.plan.replayTo, d.plan.half))
		check("replayed "+d.plan.replayTo.String()+" since the beginning", all, d.plan.count(d.plan.replayTo, 0))
		d.printf("since the cut: %d events; since the beginning: %d events", since, all)
		return nil
	}); err != nil {
		return err
	}

	// 7. Dead letters per tenant and table.
	var dlq map[mq.TenantID]mq.DeadLetterCounts
	if err := d.step("count dead letters", func() error {
		dlq = map[mq.TenantID]mq.DeadLetterCounts{}
		for _, t := range demoTenants {
			c, err := broker.DeadLetterCounts(ctx, t, "")
			if err != nil {
				return fmt.Errorf("dead-letter counts %s: %w", t, err)
			}
			dlq[t] = c
		}
		narrowed, err := broker.DeadLetterCounts(ctx, d.plan.poison.Tenant, d.plan.poison.Table)
		if err != nil {
			return fmt.Errorf("dead-letter counts %s %s: %w", d.plan.poison.Tenant, d.plan.poison.Table, err)
		}
		check(fmt.Sprintf("dead-lettered %s/%s (table filter)", d.plan.poison.Tenant, d.plan.poison.Table),
			narrowed.Tables[d.plan.poison.Table], 1)
		for _, t := range demoTenants {
			want := map[string]uint64{}
			if t == d.plan.poison.Tenant {
				want[d.plan.poison.Table] = 1
			}
			check("dead-lettered "+string(t)+" per table", formatCounts(dlq[t].Tables), formatCounts(want))
			check("dead-lettered "+string(t)+" total", dlq[t].Total, uint64(len(want)))
		}
		d.printf("parked: %s", formatTotals(dlq))
		return nil
	}); err != nil {
		return err
	}

	// 8. Shut down.
	var stats mq.Stats
	if err := d.step("stop and close", func() error {
		stopWorker()
		workerStopped = true
		stopHub()
		var err error
		if stats, err = broker.Stats(); err != nil {
			return fmt.Errorf("stats: %w", err)
		}
		closed = true
		if err := broker.Close(); err != nil {
			return fmt.Errorf("close: %w", err)
		}
		select {
		case err := <-failed:
			return fmt.Errorf("worker reported failed after stop: %w", err)
		default:
		}
		d.printf("server: %d msgs in, %d msgs out; store removed", stats.InMsgs, stats.OutMsgs)
		return nil
	}); err != nil {
		return err
	}

	d.mu.Lock()
	problems := slices.Clone(d.problems)
	d.mu.Unlock()
	check("unexpected deliveries (decode, topic, order, settle)", len(problems), 0)

	d.summary(checks, dlq, time.Since(begin))
	for _, p := range problems {
		fmt.Fprintf(d.out, "problem: %s\n", p)
	}
	for _, c := range checks {
		if c.got != c.want {
			return fmt.Errorf("%s: got %s, want %s", c.what, c.got, c.want)
		}
	}
	return nil
}

// step runs one phase, printing its name, its detail lines and its time.
func (d *demoRun) step(name string, f func() error) error {
	fmt.Fprintf(d.out, "==> %s\n", name)
	start := time.Now()
	err := f()
	took := time.Since(start)
	d.phases = append(d.phases, demoPhase{name: name, took: took})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Fprintf(d.out, "    done in %s\n", round(took))
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

// waitFor polls done until it reports true, the worker fails, or ctx ends.
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
