package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain runs mqctl's main instead of the tests when MQCTL_TEST_MAIN is 1, so a test
// can run a command as a child process, as an operator's shell does (see
// runChild).
func TestMain(m *testing.M) {
	if os.Getenv("MQCTL_TEST_MAIN") == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, &env{stdout: &out, stderr: &errOut}, args)
	return code, out.String(), errOut.String()
}

func TestUsageListsCommands(t *testing.T) {
	code, stdout, _ := runArgs(t, "help")
	if code != 0 || !strings.Contains(stdout, "demo ") {
		t.Fatalf("help: exit %d, output:\n%s", code, stdout)
	}
	if code, _, stderr := runArgs(t); code != 2 || !strings.Contains(stderr, "commands:") {
		t.Fatalf("no command: exit %d, stderr:\n%s", code, stderr)
	}
	if code, _, stderr := runArgs(t, "nope"); code != 2 || !strings.Contains(stderr, `unknown command "nope"`) {
		t.Fatalf("unknown command: exit %d, stderr:\n%s", code, stderr)
	}
}

// TestAskedForHelpGoesToStdoutAndAUsageErrorsUsageToStderr: a subcommand's -h went to
// stderr (so `mqctl dlq -h | less` showed nothing) while `mqctl -h` went to stdout.
// Help asked for is output, exit 0, for every command; the usage printed after a
// usage error is a complaint, on stderr with exit 2.
func TestAskedForHelpGoesToStdoutAndAUsageErrorsUsageToStderr(t *testing.T) {
	var asked [][]string
	for name := range commands {
		for _, h := range []string{"-h", "-help", "--help"} {
			asked = append(asked, []string{name, h})
		}
	}
	asked = append(asked, []string{"dlq", "ls", "-h"}, []string{"dlq", "rm", "-help"}, []string{"check", "-url", "nats://127.0.0.1:1", "-h"})
	for _, args := range asked {
		code, stdout, stderr := runArgs(t, args...)
		if code != 0 || !strings.HasPrefix(stdout, "usage: mqctl "+args[0]+" ") || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want the usage on stdout only, exit 0", args, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}} {
		if code, stdout, stderr := runArgs(t, args...); code != 0 || !strings.Contains(stdout, "commands:") || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want the command list on stdout only", args, code, stdout, stderr)
		}
	}
	var wrong [][]string
	for name := range commands {
		wrong = append(wrong, []string{name, "-no-such-flag"}, []string{name, "extra"})
	}
	wrong = append(wrong, []string{"dlq"}, []string{"dlq", "ls", "extra"}, []string{"manifests", "extra"})
	for _, args := range wrong {
		code, stdout, stderr := runArgs(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "usage: mqctl "+args[0]+" ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want the usage on stderr only, exit 2", args, code, stdout, stderr)
		}
	}
}

func TestDemoFlags(t *testing.T) {
	if code, stdout, _ := runArgs(t, "demo", "-h"); code != 0 || !strings.Contains(stdout, "-timeout") {
		t.Fatalf("demo -h: exit %d, stdout:\n%s", code, stdout)
	}
	if code, _, _ := runArgs(t, "demo", "-events", "3"); code != 2 {
		t.Fatalf("demo -events 3: exit %d, want 2", code)
	}
	if code, _, _ := runArgs(t, "demo", "extra"); code != 2 {
		t.Fatalf("demo extra: exit %d, want 2", code)
	}
}

// TestDemo runs a small demo end to end: every count must match, and the summary
// shows both workers, the poison event's three attempts and its park read back.
func TestDemo(t *testing.T) {
	code, stdout, stderr := runArgs(t, "demo", "-events", "30", "-timeout", "90s")
	if code != 0 || !strings.Contains(stdout, "PASS: every count matches") {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if strings.Contains(stdout, "MISMATCH") || strings.Contains(stdout, "problem:") {
		t.Fatalf("demo passed with a mismatch:\n%s", stdout)
	}
	for _, want := range []string{
		"\n  worker-1  ", "\n  worker-2  ",
		"poison attempts the handler saw (Message.Attempt)",
		"(attempt 3)\n\nparked events, read back from stream WH_DLQ",
		"\n  Mq-Dead-Reason         handler-failed\n",
		"\n  Mq-Dead-Error          demo worker: cannot write acme#10: poison event (attempt 3)\n",
		"\n  Mq-Dead-Partition      3\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the summary lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s", stdout)
	}
}

// TestWaitHelpSaysItBoundsTheTopologysVerification: -wait's help said "how long to wait
// for the connection", yet dlq, status and bench also wait that long for the topology
// to verify (a topology of other partitions is reported only after -wait).
func TestWaitHelpSaysItBoundsTheTopologysVerification(t *testing.T) {
	for _, name := range []string{"dlq", "status", "bench", "check"} {
		code, stdout, _ := runArgs(t, name, "-h")
		_, wait, _ := strings.Cut(stdout, "\n  -wait duration\n")
		wait, _, _ = strings.Cut(wait, "\n")
		want := "for the topology to verify"
		if name == "check" {
			want = "for the one check of the topology"
		}
		if code != 0 || !strings.Contains(wait, want) {
			t.Errorf("%s -h: exit %d, -wait's help %q does not say it waits %s", name, code, wait, want)
		}
	}
}
