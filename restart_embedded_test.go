//go:build integration

package mq

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// The restart matrix of EmbeddedNATS (issue 7): {clean Close, SIGKILL of a child
// process} x {what the worker did before the restart} x {restart at once, restart after
// the history caught up and the broker idled} x {the store's first restart, a later
// one}. After each restart every confirmed event the worker had not acknowledged is
// delivered, and the budgets and backlog bytes come back as they were.

// restartPolicy is what the worker does with the events before the restart.
type restartPolicy string

const (
	policyIdle       restartPolicy = "nothing-delivered" // no worker runs
	policyHold       restartPolicy = "some-held"         // acks the first third, never settles the rest
	policyNak        restartPolicy = "some-naked"        // acks the even events, naks the odd ones once, then holds them
	policyOutOfOrder restartPolicy = "acks-out-of-order" // acks every event but each fifth, so acks run ahead of the floor
)

var (
	restartTenants  = []TenantID{"acme", "globex"}
	restartBudget   = int64(1 << 20)
	restartPerCycle = 40
	restartAckWait  = 2 * time.Second // so a held event comes back soon after the reopen
	restartChildEnv = "MQ_RESTART_CHILD_STORE"
)

// restartLoad is one cycle's traffic and the worker's policy, reporting each confirmed
// publish and each confirmed ack through out.
type restartLoad struct {
	cycle  int
	policy restartPolicy
	out    func(kind, id string)
}

// run publishes the cycle's events, lets the worker apply its policy until every event
// was delivered once, and returns with the worker still running (the restart stops it).
func (l restartLoad) run(ctx context.Context, t testing.TB, e *EmbeddedNATS) {
	ids := make([]string, restartPerCycle)
	for i := range ids {
		tenant := restartTenants[i%len(restartTenants)]
		ids[i] = fmt.Sprintf("%s-c%d-%03d", tenant, l.cycle, i)
		topic := Topic{Tenant: tenant, Table: "t" + strconv.Itoa(i%3)}
		if err := e.Publish(ctx, topic, []byte(ids[i])); err != nil {
			t.Fatalf("publish %s: %v", ids[i], err)
		}
		l.out("confirmed", ids[i])
	}
	if l.policy == policyIdle {
		return
	}
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	settled := map[string]bool{} // ours, first delivery settled (or deliberately left)
	all := make(chan struct{})
	closeAll := sync.OnceFunc(func() { close(all) }) // two partitions' handlers can both see the last one
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: restartAckWait})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	_, _, err = c.Consume(func(m *Message) error {
		id := string(m.Data)
		i, ours := index[id]
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		settle := func() {
			if ours && !first {
				return // held: a redelivery before the restart is held again
			}
			switch {
			case !ours: // an earlier cycle's event the worker acked before and gets again
				if m.DoubleAck(ctx) == nil {
					l.out("acked", id)
				}
			case l.policy == policyHold && i >= restartPerCycle/3,
				l.policy == policyOutOfOrder && i%5 == 0:
			case l.policy == policyNak && i%2 == 1:
				_ = m.Nak()
			default:
				if m.DoubleAck(ctx) == nil {
					l.out("acked", id)
				}
			}
		}
		settle()
		// Counted only once settled: the caller reads the backlog gauge when this
		// closes, and an ack still in flight at another partition's handler would
		// release its bytes after the read.
		mu.Lock()
		defer mu.Unlock()
		if ours && first {
			settled[id] = true
			if len(settled) == len(ids) {
				closeAll()
			}
		}
		return nil
	}, 0)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("the worker never saw every event of cycle %d", l.cycle)
	}
}

// restartLedger is what the host knows before a restart: every confirmed publish and
// every confirmed ack.
type restartLedger struct {
	mu        sync.Mutex
	confirmed []string
	acked     map[string]bool
}

func (r *restartLedger) record(kind, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch kind {
	case "confirmed":
		r.confirmed = append(r.confirmed, id)
	case "acked":
		if r.acked == nil {
			r.acked = map[string]bool{}
		}
		r.acked[id] = true
	}
}

// owed is every confirmed event the worker has not acknowledged.
func (r *restartLedger) owed() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, id := range r.confirmed {
		if !r.acked[id] {
			out[id] = true
		}
	}
	return out
}

// restartCell is one column of the matrix for one crash mode.
type restartCell struct {
	kill   bool
	policy restartPolicy
	idle   bool // restart after the history caught up and the broker idled
}

func (c restartCell) name() string {
	mode, when := "close", "at-once"
	if c.kill {
		mode = "sigkill"
	}
	if c.idle {
		when = "after-idle"
	}
	return mode + "/" + string(c.policy) + "/" + when
}

func TestEmbeddedNATS_RestartMatrixDeliversEveryUnacknowledgedEventAndKeepsBudgets(t *testing.T) {
	for _, kill := range []bool{false, true} {
		for _, policy := range []restartPolicy{policyIdle, policyHold, policyNak, policyOutOfOrder} {
			for _, idle := range []bool{false, true} {
				cell := restartCell{kill: kill, policy: policy, idle: idle}
				t.Run(cell.name(), func(t *testing.T) {
					t.Parallel()
					cell.run(t)
				})
			}
		}
	}
}

func (c restartCell) run(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	ledger := &restartLedger{}
	// Budgets are set once, before the first cycle, by the process that runs it.
	for cycle := 1; cycle <= 2; cycle++ { // the store's first restart, then a later one
		before := c.cycleBeforeRestart(t, dir, cycle, ledger)
		c.verifyAfterRestart(t, dir, cycle, ledger, before)
	}
}

// cycleBeforeRestart runs one cycle's traffic and ends it with the cell's restart
// mode. It returns each tenant's backlog bytes just before the restart, when known
// (nil after a kill at once: the child's acks may not all be on disk yet).
func (c restartCell) cycleBeforeRestart(t *testing.T, dir string, cycle int, ledger *restartLedger) map[string]int64 {
	if c.kill {
		return runRestartChild(t, dir, cycle, c, ledger)
	}
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, dir, func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.MetricsTenants = true
	})
	ctx := restartCtx(t)
	if cycle == 1 {
		for _, tenant := range restartTenants {
			require.NoError(t, e.SetMaxBytes(ctx, tenant, restartBudget))
		}
	}
	restartLoad{cycle: cycle, policy: c.policy, out: ledger.record}.run(ctx, t, e)
	if c.idle {
		waitHistoryCopied(t, e.js, e.topo.HistoryStream, uint64(cycle*restartPerCycle))
	}
	backlog := gaugeBy(t, reader, metricTenantBacklog, string(AttrTenant))
	require.NoError(t, e.Close())
	return backlog
}

// verifyAfterRestart reopens the store and checks it: the budgets as set, the backlog
// as it was, every owed event delivered (acknowledged ones may come again), and once
// everything is acknowledged, nothing held against any tenant.
func (c restartCell) verifyAfterRestart(t *testing.T, dir string, cycle int, ledger *restartLedger, before map[string]int64) {
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, dir, func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.MetricsTenants = true
	})
	ctx := restartCtx(t)
	for _, tenant := range restartTenants {
		assert.Equal(t, restartBudget, e.MaxBytes(tenant), "cycle %d: tenant %s's budget after the restart", cycle, tenant)
	}
	if before != nil {
		assert.Equal(t, before, gaugeBy(t, reader, metricTenantBacklog, string(AttrTenant)),
			"cycle %d: the backlog bytes after the restart are those before it", cycle)
	}
	owed := ledger.owed()
	var mu sync.Mutex
	delivered := map[string]int{}
	allOwed := make(chan struct{})
	closeOwed := sync.OnceFunc(func() { close(allOwed) })
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: restartAckWait})
	require.NoError(t, err)
	stop, failed, err := cons.Consume(func(m *Message) error {
		if err := m.DoubleAck(ctx); err != nil {
			return err
		}
		id := string(m.Data)
		ledger.record("acked", id)
		mu.Lock()
		defer mu.Unlock()
		delivered[id]++
		if delivered[id] == 1 && owedDelivered(owed, delivered) {
			closeOwed()
		}
		return nil
	}, 0)
	require.NoError(t, err)
	if len(owed) == 0 {
		closeOwed()
	}
	select {
	case <-allOwed:
	case err := <-failed:
		t.Fatalf("cycle %d: delivery ended: %v", cycle, err)
	case <-ctx.Done():
	}
	mu.Lock()
	var lost []string
	for id := range owed {
		if delivered[id] == 0 {
			lost = append(lost, id)
		}
	}
	dups := 0 // every delivery but the first of an owed event
	for id, n := range delivered {
		dups += n
		if owed[id] {
			dups--
		}
	}
	distinct := len(delivered) // the worker still runs: read under its lock
	mu.Unlock()
	ledger.mu.Lock()
	confirmed := len(ledger.confirmed)
	ledger.mu.Unlock()
	slices.Sort(lost)
	t.Logf("cycle %d (%s): confirmed %d, owed %d, delivered after the restart %d, lost %d, duplicates %d",
		cycle, c.name(), confirmed, len(owed), distinct, len(lost), dups)
	require.Empty(t, lost, "cycle %d: confirmed events the worker never acknowledged, missing after the restart", cycle)
	require.Eventually(t, func() bool {
		for _, n := range gaugeBy(t, reader, metricTenantBacklog, string(AttrTenant)) {
			if n != 0 {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "cycle %d: bytes still held once everything was acknowledged: %v",
		cycle, gaugeBy(t, reader, metricTenantBacklog, string(AttrTenant)))
	stop()
	require.NoError(t, e.Close())
}

func owedDelivered(owed map[string]bool, delivered map[string]int) bool {
	for id := range owed {
		if delivered[id] == 0 {
			return false
		}
	}
	return true
}

func restartCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runRestartChild runs the cycle in a child process (this test binary, running
// TestEmbeddedNATS_RestartMatrixChild) and kills it with SIGKILL once the worker has
// applied its policy (and, for an idle cell, the history caught up). It returns the
// backlog the child reported when that is what the store must give back.
func runRestartChild(t *testing.T, dir string, cycle int, c restartCell, ledger *restartLedger) map[string]int64 {
	backlog := map[string]int64{}
	runChild(t, "TestEmbeddedNATS_RestartMatrixChild", []string{
		restartChildEnv + "=" + dir,
		"MQ_RESTART_CHILD_CYCLE=" + strconv.Itoa(cycle),
		"MQ_RESTART_CHILD_POLICY=" + string(c.policy),
		"MQ_RESTART_CHILD_IDLE=" + strconv.FormatBool(c.idle),
	}, func(kind, rest string) bool {
		switch kind {
		case "confirmed", "acked":
			ledger.record(kind, rest)
		case "backlog":
			tenant, n, _ := strings.Cut(rest, " ")
			backlog[tenant], _ = strconv.ParseInt(n, 10, 64)
		}
		return kind == "ready"
	}, nil)
	if !c.idle {
		return nil
	}
	return backlog
}

// TestEmbeddedNATS_RestartMatrixChild is the child process of the matrix's SIGKILL
// cells; run on its own it does nothing.
func TestEmbeddedNATS_RestartMatrixChild(t *testing.T) {
	dir := os.Getenv(restartChildEnv)
	if dir == "" {
		t.Skip("the child process of TestEmbeddedNATS_RestartMatrixDeliversEveryUnacknowledgedEventAndKeepsBudgets")
	}
	cycle, _ := strconv.Atoi(os.Getenv("MQ_RESTART_CHILD_CYCLE"))
	idle, _ := strconv.ParseBool(os.Getenv("MQ_RESTART_CHILD_IDLE"))
	out := childReport
	reader := sdkmetric.NewManualReader()
	// NoSync, the weaker setting: a process crash loses nothing the server confirmed
	// with either, since the kernel keeps what was written.
	e, err := NewEmbedded(t.Context(), EmbeddedOptions{StoreDir: dir, NoSync: true, Logger: quietLog,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), MetricsTenants: true})
	require.NoError(t, err)
	ctx := restartCtx(t)
	if cycle == 1 {
		for _, tenant := range restartTenants {
			require.NoError(t, e.SetMaxBytes(ctx, tenant, restartBudget))
		}
	}
	restartLoad{cycle: cycle, policy: restartPolicy(os.Getenv("MQ_RESTART_CHILD_POLICY")), out: out}.run(ctx, t, e)
	if idle {
		waitHistoryCopied(t, e.js, e.topo.HistoryStream, uint64(cycle*restartPerCycle))
	}
	backlog := gaugeBy(t, reader, metricTenantBacklog, string(AttrTenant))
	for _, tenant := range slices.Sorted(maps.Keys(backlog)) {
		out("backlog", fmt.Sprintf("%s %d", tenant, backlog[tenant]))
	}
	out("ready", "")
	time.Sleep(time.Minute) // killed long before
	t.Fatal("the parent never killed this child")
}
