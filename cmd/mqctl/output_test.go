package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wavehouse/mq"
)

// errFull is what a write to a full disk (`> /dev/full`) returns.
var errFull = errors.New("write /dev/stdout: no space left on device")

// fullAfter is a stdout that takes n writes, then fails every one as a full disk does.
type fullAfter struct {
	n   int
	got bytes.Buffer
}

func (w *fullAfter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, errFull
	}
	w.n--
	return w.got.Write(p)
}

// runFull runs args with a stdout that takes n writes and fails the rest.
func runFull(t *testing.T, n int, args ...string) (code int, stderr string) {
	t.Helper()
	var errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, &env{stdout: &fullAfter{n: n}, stderr: &errOut}, args)
	return code, errOut.String()
}

// TestAnOutputThatCannotBeWrittenExits1SayingWhatWasLost: `check > /dev/full` and
// `status -once > /dev/full` exited 0 with nothing written and nothing said, and
// `manifests > /dev/full` exited 2, the code of a usage error. Every command whose
// output cannot be written says on stderr what it could not write and exits 1; a
// redrive or rm that did its work says what it did there.
func TestAnOutputThatCannotBeWrittenExits1SayingWhatWasLost(t *testing.T) {
	e := openEmbedded(t)
	parkEvents(t, e, "acme", "orders", 2)
	parkEvents(t, e, "acme", "users", 1)
	url := e.ClientURL()
	cases := []struct {
		args   []string
		writes int    // the writes stdout takes before it fails
		says   string // what stderr must name
	}{
		{[]string{"help"}, 0, "mqctl: could not write the help"},
		{[]string{"-h"}, 2, "mqctl: could not write the help"},
		{[]string{"manifests"}, 0, "mqctl manifests: could not write the manifests"},
		{[]string{"permissions"}, 0, "mqctl permissions: could not write the permissions"},
		{[]string{"check", "-url", url}, 0, "mqctl check: could not write the findings"},
		{[]string{"check", "-url", url}, 1, "mqctl check: could not write the findings"},
		{[]string{"status", "-once", "-url", url, "-listen", "10ms"}, 0, "mqctl status: could not write the status table"},
		{[]string{"dlq", "ls", "-url", url, "-tenant", "acme"}, 0, "mqctl dlq ls: could not write the page of parked events"},
		{[]string{"dlq", "ls", "-url", url, "-tenant", "acme", "-limit", "1"}, 1, "mqctl dlq ls: could not write the page of parked events"},
		{[]string{"dlq", "redrive", "-url", url, "-tenant", "acme", "-table", "orders"}, 0,
			`mqctl dlq redrive: could not write "redrove 2 parked events of acme"`},
		{[]string{"dlq", "rm", "-url", url, "-tenant", "acme", "-all", "-yes"}, 0,
			`mqctl dlq rm: could not write "removed 1 parked events of acme"`},
	}
	for name := range commands {
		cases = append(cases, struct {
			args   []string
			writes int
			says   string
		}{[]string{name, "-h"}, 0, "mqctl " + name + ": could not write the help"})
	}
	for _, c := range cases {
		code, stderr := runFull(t, c.writes, c.args...)
		if code != 1 || !strings.Contains(stderr, c.says+" to stdout: "+errFull.Error()) {
			t.Errorf("%v, stdout failing after %d writes: exit %d, stderr %q; want exit 1 saying %q", c.args, c.writes, code, stderr, c.says)
		}
	}
	// Done all the same, as stderr said.
	if c := parkedOf(t, e, "acme"); c.Total != 0 {
		t.Errorf("redrive and rm with their output lost: %+v still parked, want none", c)
	}
}

// TestBenchWhoseTableCannotBeWrittenPublishesNothing: bench exited 0 with its table
// lost, after publishing 6 x -events real events. It now stops before publishing.
func TestBenchWhoseTableCannotBeWrittenPublishesNothing(t *testing.T) {
	e := openEmbedded(t)
	code, stderr := runFull(t, 0, "bench", "-url", e.ClientURL(), "-events", "20", "-callers", "2", "-batch", "5")
	if code != 1 || !strings.Contains(stderr, "mqctl bench: could not write the bench's table to stdout: "+errFull.Error()) {
		t.Fatalf("bench, stdout full: exit %d, stderr %q; want exit 1 saying the table could not be written", code, stderr)
	}
	st, err := e.Status(t.Context(), mq.StatusOptions{ListenWorkers: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if p.Messages != 0 {
			t.Errorf("bench, stdout full: partition %d holds %d events, want none published", p.Partition, p.Messages)
		}
	}
}

// TestDemoWhoseReportCannotBeWrittenStopsAndRemovesItsStore: the demo ran to its end
// with its report lost and exited 0. It now stops at the failed write, says so, exits
// 1 and removes its temporary store, whether the write failed before the broker
// started or while it ran.
func TestDemoWhoseReportCannotBeWrittenStopsAndRemovesItsStore(t *testing.T) {
	tmp := t.TempDir()
	for _, v := range []string{"TMPDIR", "TMP", "TEMP"} {
		t.Setenv(v, tmp)
	}
	for _, writes := range []int{0, 4} {
		code, stderr := runFull(t, writes, "demo", "-events", "20")
		if code != 1 || !strings.Contains(stderr, "mqctl demo: could not write the demo's report to stdout: "+errFull.Error()) {
			t.Errorf("demo, stdout failing after %d writes: exit %d, stderr %q; want exit 1 saying the report could not be written",
				writes, code, stderr)
		}
		left, err := filepath.Glob(filepath.Join(tmp, "mqctl-demo-*"))
		if err != nil || len(left) > 0 {
			t.Fatalf("demo, stdout failing after %d writes: left %v behind (%v)", writes, left, err)
		}
	}
}
