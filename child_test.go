//go:build integration

package mq

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// childLinePrefix marks the lines a child process reports to its parent test.
const childLinePrefix = "MQCHILD "

// runChild runs the test named test of this binary as a child process with env added,
// passes each line it reports (kind and the rest) to onLine, and kills it with SIGKILL
// (no Close, no flush: a crash) as soon as onLine says so, or after stop. It fails t
// when the child ends before it was killed, showing the child's output.
func runChild(t *testing.T, test string, env []string, onLine func(kind, rest string) (kill bool), stop <-chan struct{}) {
	t.Helper()
	runChildProcess(t, test, env, func(_ *os.Process, kind, rest string) bool { return onLine(kind, rest) }, stop)
}

// runChildProcess is runChild whose onLine also gets the child's process, to signal it.
func runChildProcess(t *testing.T, test string, env []string, onLine func(p *os.Process, kind, rest string) (kill bool), stop <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var once sync.Once
	killed := false
	kill := func() { once.Do(func() { killed = true; _ = cmd.Process.Kill() }) }
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
			kill()
		case <-done:
		}
	}()
	var output []string
	scan := bufio.NewScanner(stdout)
	for scan.Scan() {
		line := scan.Text()
		rest, ours := strings.CutPrefix(line, childLinePrefix)
		if !ours {
			output = append(output, line)
			continue
		}
		kind, rest, _ := strings.Cut(rest, " ")
		if onLine(cmd.Process, kind, rest) {
			kill()
		}
	}
	_ = cmd.Wait()
	once.Do(func() {}) // no kill after the child is gone
	require.True(t, killed, "child %s ended by itself:\n%s\n%s", test, strings.Join(output, "\n"), stderr.String())
}

// childReport writes one line for the parent of a child process; safe for concurrent use.
var childReport = func() func(kind, rest string) {
	var mu sync.Mutex
	return func(kind, rest string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s%s %s\n", childLinePrefix, kind, rest)
	}
}()
