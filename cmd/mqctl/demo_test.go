package main

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wavehouse/mq"
)

// The demo's own bookkeeping: each check must be able to fail, or a passing demo
// proves nothing.

func TestDemoTenantsCoverEveryPartition(t *testing.T) {
	seen := map[int]mq.TenantID{}
	for _, tenant := range demoTenants {
		seen[mq.Partition(tenant, demoTopology.Partitions)] = tenant
	}
	if len(seen) != demoTopology.Partitions {
		t.Fatalf("the demo tenants are on partitions %v of %d: the summary could not show every partition's worker",
			seen, demoTopology.Partitions)
	}
}

func TestDemoPlanNextSeqSkipsOnlyThePoisonEvent(t *testing.T) {
	p := newDemoPlan(20)
	if p.poison.Tenant != "acme" || p.poison.Seq != 10 {
		t.Fatalf("poison %s, want acme#10", p.poison.id())
	}
	for _, c := range []struct {
		tenant    mq.TenantID
		seq, want int
	}{{"acme", 0, 1}, {"acme", 8, 9}, {"acme", 9, 11}, {"acme", 11, 12}, {"globex", 9, 10}} {
		if got := p.nextSeq(c.tenant, c.seq); got != c.want {
			t.Errorf("nextSeq(%s, %d) = %d, want %d", c.tenant, c.seq, got, c.want)
		}
	}
}

func newTestDemoRun() (*demoRun, []*demoWorker) {
	d := &demoRun{out: io.Discard, topo: demoTopology, plan: newDemoPlan(20), fleet: newDemoFleet(demoTopology.Partitions)}
	var ws []*demoWorker
	for i := range demoWorkerCount {
		w := &demoWorker{name: "w" + string(rune('1'+i)), index: i, tenants: map[mq.TenantID]int{}}
		ws = append(ws, w)
		d.fleet.members = append(d.fleet.members, w)
	}
	return d, ws
}

func TestDemoWorkerOrderChecksCatchEachViolation(t *testing.T) {
	d, ws := newTestDemoRun()
	ev := func(seq int) demoEvent { return d.plan.events["acme"][seq-1] }
	for seq := 1; seq <= 9; seq++ {
		d.orderOfCall(ws[0], ev(seq), 1)
		d.wrote(ws[0], ev(seq), time.Now())
	}
	d.orderOfCall(ws[0], ev(10), 1)
	d.orderOfCall(ws[0], ev(10), 2)
	d.orderOfCall(ws[0], ev(11), 1)
	d.wrote(ws[0], ev(11), time.Now())
	d.wrote(ws[0], ev(11), time.Now()) // at least once: a rewrite is no problem
	if len(d.problems) != 0 {
		t.Fatalf("an orderly run has problems: %v", d.problems)
	}

	d.wrote(ws[0], ev(13), time.Now()) // #12 skipped
	d.orderOfCall(ws[0], ev(10), 3)    // a retry after a later event of its tenant ran
	if len(d.problems) != 2 || !strings.Contains(d.problems[0], "acme#13 written after acme#11: out of order") ||
		!strings.Contains(d.problems[1], "attempt 3 came after acme#11") {
		t.Fatalf("problems %q", d.problems)
	}
	if d.fleet.written["acme#11"] != 2 || ws[0].written != 11 {
		t.Fatalf("written %v, worker's first writes %d", d.fleet.written, ws[0].written)
	}
}

func TestDemoWorkerCallsOnOnePartitionByTwoWorkersAtOnceAreCaught(t *testing.T) {
	d, ws := newTestDemoRun()
	acme := d.plan.events["acme"]
	done := d.running(ws[0], acme[0])
	d.running(ws[0], acme[1])() // the same worker twice at once: its lanes, fine
	d.running(ws[1], acme[2])() // the other worker while ws[0] still runs a call there
	done()
	d.running(ws[0], acme[3])() // after the other's call ended: a handover back
	if d.fleet.overlaps != 1 || len(d.problems) != 1 || d.fleet.handovers != 2 {
		t.Fatalf("overlaps %d, handovers %d, problems %q", d.fleet.overlaps, d.fleet.handovers, d.problems)
	}
}

// TestReadParkedReadsEveryParkedEventWithItsHeaders parks events by hand on an
// embedded broker and reads them back with the demo's reader, across pages.
func TestReadParkedReadsEveryParkedEventWithItsHeaders(t *testing.T) {
	e, err := mq.NewEmbedded(t.Context(), mq.EmbeddedOptions{StoreDir: t.TempDir(), NoSync: true,
		Topology: demoTopology, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tenants := []mq.TenantID{"acme", "globex"}
	if got, err := readParked(t.Context(), e, tenants); err != nil || len(got) != 0 {
		t.Fatalf("nothing parked: %v, %v", got, err)
	}
	topic := mq.Topic{Tenant: "acme", Table: "orders", Scope: "eu"}
	msg := mq.NewMessage(t.Context(), topic, []byte(`{}`), mq.WithMessageHeaders(mq.Headers{"X-Demo-Id": {"acme#10"}}))
	if err := e.DeadLetter(t.Context(), msg, mq.WithHeader(mq.HeaderDeadReason, mq.DeadReasonHandlerFailed),
		mq.WithHeader(mq.HeaderDeadAttempts, "3"), mq.WithHeader(mq.HeaderDeadError, "boom")); err != nil {
		t.Fatal(err)
	}
	// More than a page (10) of globex's, so the reader follows the cursor.
	const more = 12
	for i := range more {
		m := mq.NewMessage(t.Context(), mq.Topic{Tenant: "globex", Table: "clicks"}, nil,
			mq.WithMessageHeaders(mq.Headers{"X-Demo-Id": {"globex#" + strconv.Itoa(i)}}))
		if err := e.DeadLetter(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readParked(t.Context(), e, tenants)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1+more {
		t.Fatalf("read %d parked events, want %d: %+v", len(got), 1+more, got)
	}
	p := got[0]
	if p.demoID != "acme#10" || p.topic != topic || p.key != "acme.orders.eu" || p.reason != mq.DeadReasonHandlerFailed ||
		p.attempts != "3" || p.lastErr != "boom" || p.stored.IsZero() {
		t.Fatalf("first parked event %+v", p)
	}
	for i, p := range got[1:] {
		if p.topic.Tenant != "globex" || p.reason != "" || p.demoID != "globex#"+strconv.Itoa(i) {
			t.Fatalf("globex's parked event %d: %+v", i, p)
		}
	}
	if _, err := readParked(t.Context(), e, []mq.TenantID{"not a tenant"}); !errors.Is(err, mq.ErrInvalidTenant) {
		t.Fatalf("an invalid tenant: %v, want ErrInvalidTenant", err)
	}
}

// TestDemoEndsWithAMetricsAndTraceSummaryMatchingItsCounts runs the demo, small: it
// passes only if every metric check matches, and its output ends with the metrics
// and the spans, one trace shared by a publish and its delivery.
func TestDemoEndsWithAMetricsAndTraceSummaryMatchingItsCounts(t *testing.T) {
	code, stdout, stderr := runArgs(t, "demo", "-events", "20")
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s\n%s", code, stdout, stderr)
	}
	phases, metrics, spans := strings.Index(stdout, "\nphases\n"), strings.Index(stdout, "\nmetrics (OpenTelemetry"), strings.Index(stdout, "\nspans\n")
	if phases < 0 || metrics < phases || spans < metrics {
		t.Fatalf("want phases, then metrics, then spans:\n%s", stdout)
	}
	// A row's words, whatever the columns' widths.
	row := func(prefix string) string {
		for _, line := range strings.Split(stdout, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), prefix) {
				return strings.Join(strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), prefix)), " ")
			}
		}
		return ""
	}
	for prefix, want := range map[string]string{
		"metric messaging.client.sent.messages, publish ": "80 80 ok",
		"metric mq.dead_letter.parked":                    "1 1 ok",
		"a publish and its delivery share a trace":        "true true ok",
		"messaging.client.sent.messages ":                 "counter 82 dead_letter=1, publish=80, publish [mq.ErrQueueFull]=1",
		"send wh.ingest.{partition}.{tenant}.{table}":     "45",
	} {
		if got := row(prefix); got != want {
			t.Errorf("row %q: %q, want %q", prefix, got, want)
		}
	}
	// Handler calls vary with redeliveries; the poison event's failed attempts do not.
	if got := row("messaging.process.duration "); !strings.HasSuffix(got, "process [_OTHER]=3") {
		t.Errorf("process duration row %q: want the 3 poison attempts with error.type _OTHER", got)
	}
	if !strings.Contains(stdout[spans:], "\" and its delivery \"process ") {
		t.Errorf("no trace shared by a publish and its delivery:\n%s", stdout[spans:])
	}
}

// TestDemoTelemetryChecksCatchEveryMismatch feeds the checks counts that differ from
// the demo's by one each, and no shared trace.
func TestDemoTelemetryChecksCatchEveryMismatch(t *testing.T) {
	d, _ := newTestDemoRun()
	d.batches, d.replayed, d.fleet.calls = 4, 7, 30
	d.fleet.poison = make([]poisonAttempt, 3)
	series := func(name string, by map[string]float64) demoSeries { return demoSeries{name: name, by: by} }
	singles := float64(d.plan.half * len(demoTenants))
	right := map[string]demoSeries{
		"messaging.client.sent.messages":      series("", map[string]float64{"publish": float64(d.plan.total), "publish [mq.ErrQueueFull]": 1}),
		"messaging.client.operation.duration": series("", map[string]float64{"publish": singles + 4}),
		"messaging.client.consumed.messages":  series("", map[string]float64{"process": 30, "replay": 7}),
		"messaging.process.duration":          series("", map[string]float64{"process [_OTHER]": 3}),
		"mq.dead_letter.parked":               series("", map[string]float64{"orders": 1}),
	}
	d.checkTelemetry(right, demoTraces{sharedBySendAndProc: true})
	for _, c := range d.checks {
		if c.got != c.want {
			t.Fatalf("right counts: %s: got %s, want %s", c.what, c.got, c.want)
		}
	}
	n := len(d.checks)
	for _, s := range right {
		for k := range s.by {
			s.by[k]++
		}
	}
	d.checkTelemetry(right, demoTraces{})
	for _, c := range d.checks[n:] {
		if c.got == c.want {
			t.Errorf("off by one: %s still matches (%s)", c.what, c.got)
		}
	}
}
