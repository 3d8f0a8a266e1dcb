package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/wavehouse/mq"
)

// TestBenchPrintsEveryPhaseWithRatesAndARatioAndItsEventsArriveOnTheLibrarysSubject
// runs bench against a live server and checks each phase's row, then counts the
// tenant's events in the partitions: every event of both impls is stored, all on the
// one subject the library publishes to.
func TestBenchPrintsEveryPhaseWithRatesAndARatioAndItsEventsArriveOnTheLibrarysSubject(t *testing.T) {
	e := openEmbedded(t)
	code, stdout, stderr := runArgs(t, "bench", "-url", e.ClientURL(), "-events", "200", "-callers", "4", "-batch", "50")
	if code != 0 {
		t.Fatalf("bench: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "PHASE  ") || !strings.Contains(stdout, "MQ/RAW") {
		t.Errorf("bench: no table header:\n%s", stdout)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) == 8 {
			rows[f[0]] = f
		}
	}
	for _, phase := range []string{"publish", "batch-pipelined", "batch-atomic"} {
		f, ok := rows[phase]
		if !ok {
			t.Errorf("bench: no row for %s:\n%s", phase, stdout)
			continue
		}
		for i, col := range []string{"raw events/s", "mq events/s", "ratio"} {
			if v, err := strconv.ParseFloat(f[1+i], 64); err != nil || v <= 0 {
				t.Errorf("bench: %s: %s is %q, not a positive number", phase, col, f[1+i])
			}
		}
		for _, lat := range f[4:] {
			if lat == "-" {
				t.Errorf("bench: %s: a latency is missing: %v", phase, f)
			}
		}
	}

	nc, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo := mq.NATSTopology{}.WithDefaults()
	subjects := map[string]uint64{}
	for p := range topo.Partitions {
		s, err := js.Stream(t.Context(), topo.PartitionStream(p))
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(topo.Prefix+".ingest.*.mqctl-bench.>"))
		if err != nil {
			t.Fatal(err)
		}
		for subj, n := range info.State.Subjects {
			subjects[subj] += n
			if p != mq.Partition("mqctl-bench", topo.Partitions) {
				t.Errorf("bench: %d events on %s in partition %d, not the tenant's", n, subj, p)
			}
		}
	}
	// 3 phases, 200 events each by raw and by mq.
	if len(subjects) != 1 {
		t.Fatalf("bench: events on %d subjects, want the library's one: %v", len(subjects), subjects)
	}
	for subj, n := range subjects {
		if n != 1200 || !strings.HasSuffix(subj, ".mqctl-bench.bench") {
			t.Errorf("bench: %d events on %s, want 1200 on the tenant's table bench", n, subj)
		}
	}
}

func TestBenchIsListedRefusesBadArgumentsAndItsHelpSaysTheEventsAreReal(t *testing.T) {
	if code, stdout, _ := runArgs(t, "help"); code != 0 || !strings.Contains(stdout, "\n  bench  ") {
		t.Errorf("help does not list bench: exit %d\n%s", code, stdout)
	}
	for _, args := range [][]string{
		{"bench"},
		{"bench", "-url", "nats://127.0.0.1:1", "-batch", "0"},
		{"bench", "-url", "nats://127.0.0.1:1", "-batch", "1001"},
		{"bench", "-url", "nats://127.0.0.1:1", "-events", "0"},
		{"bench", "-url", "nats://127.0.0.1:1", "-callers", "-1"},
		{"bench", "-url", "nats://127.0.0.1:1", "-tenant", "Not.A.Tenant"},
	} {
		if code, _, stderr := runArgs(t, args...); code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, code, stderr)
		}
	}
	code, stdout, _ := runArgs(t, "bench", "-h")
	if code != 0 || !strings.Contains(stdout, "-tenant") || !strings.Contains(stdout, "the ingest workers consume them") {
		t.Fatalf("bench -h: exit %d, stdout:\n%s", code, stdout)
	}
}
