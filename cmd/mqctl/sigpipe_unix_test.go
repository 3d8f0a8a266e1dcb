//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startChild starts mqctl with args as a child process (see TestMain) whose stdout is
// w and whose temporary directory is tmp; stderr is collected.
func startChild(t *testing.T, w *os.File, tmp string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "MQCTL_TEST_MAIN=1", "TMPDIR="+tmp)
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// TestDemoIntoAClosedPipeEndsAsAFailedWriteAndRemovesItsStore: `mqctl demo | head -1`
// was killed by SIGPIPE (exit 141) and left its store /tmp/mqctl-demo-* behind. A
// closed stdout now ends the demo as an output that could not be written: exit 1,
// quietly (the reader left on purpose), and the store removed, whether the reader was gone before the first
// line or left after it, as head -1 does.
func TestDemoIntoAClosedPipeEndsAsAFailedWriteAndRemovesItsStore(t *testing.T) {
	for _, afterFirstLine := range []bool{false, true} {
		tmp := t.TempDir()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if !afterFirstLine {
			_ = r.Close() // `mqctl demo | true`: nobody reads, from the start
		}
		cmd, stderr := startChild(t, w, tmp, "demo", "-events", "20")
		_ = w.Close()
		if afterFirstLine {
			// head -1: read one line, then go. The demo goes on for its workers and
			// its summary, so it writes again into the closed pipe.
			line, err := bufio.NewReader(r).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "==> ") {
				t.Errorf("the demo's first line: %q, %v", line, err)
			}
			_ = r.Close()
		}
		err = cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			if exit != nil {
				if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					t.Errorf("after first line %t: the demo was killed by %v", afterFirstLine, ws.Signal())
				}
			}
			t.Errorf("after first line %t: the demo ended with %v, want exit status 1\nstderr:\n%s", afterFirstLine, err, stderr)
		}
		if strings.Contains(stderr.String(), "could not write") {
			t.Errorf("after first line %t: a reader that left on purpose is reported as an error:\n%s", afterFirstLine, stderr)
		}
		left, err := filepath.Glob(filepath.Join(tmp, "mqctl-demo-*"))
		if err != nil || len(left) > 0 {
			t.Errorf("after first line %t: the demo left %v behind (%v)", afterFirstLine, left, err)
		}
	}
}

// readerLeft is a stdout whose reader left: every write fails with EPIPE, as one into
// `| head` does once head exited.
type readerLeft struct{}

func (readerLeft) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
}

// TestAReaderThatLeftSilencesTheListButNotWhatARedriveDid: `dlq ls | head` says
// nothing of the rest it could not write (the reader left on purpose), but a redrive
// whose report met the same pipe still says on stderr what it did, or the operator
// could not tell whether the events moved.
func TestAReaderThatLeftSilencesTheListButNotWhatARedriveDid(t *testing.T) {
	e := openEmbedded(t)
	parkEvents(t, e, "acme", "orders", 2)
	url := e.ClientURL()
	run1 := func(args ...string) (int, string) {
		var errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return run(ctx, &env{stdout: readerLeft{}, stderr: &errOut}, args), errOut.String()
	}
	if code, stderr := run1("dlq", "ls", "-url", url, "-tenant", "acme"); code != 1 || stderr != "" {
		t.Errorf("dlq ls into a pipe whose reader left: exit %d, stderr %q; want exit 1 and nothing said", code, stderr)
	}
	code, stderr := run1("dlq", "redrive", "-url", url, "-tenant", "acme", "-all")
	if code != 1 || !strings.Contains(stderr, `could not write "redrove 2 parked events of acme"`) {
		t.Errorf("dlq redrive into a pipe whose reader left: exit %d, stderr %q; want exit 1 saying what it did", code, stderr)
	}
}
