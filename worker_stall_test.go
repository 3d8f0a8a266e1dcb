//go:build integration

package mq

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const stallChildEnv = "MQ_STALL_CHILD_DIR"

// TestWorker_AProcessStalledWhileATenantWaitsForARetryStillRunsTheRetryFirst stops the
// worker's process (SIGSTOP, as a paused VM or container) for longer than its wait for
// a failed event to come back, while that event's tenant is held. The wait passed
// while nothing could arrive, so it must not make the worker give up on the event and
// run the tenant's later events first.
func TestWorker_AProcessStalledWhileATenantWaitsForARetryStillRunsTheRetryFirst(t *testing.T) {
	if os.Getenv(stallChildEnv) != "" {
		t.Skip("the child's own run")
	}
	var calls []string
	done, retried := false, false
	runChildProcess(t, "TestWorker_StallChild", []string{stallChildEnv + "=" + t.TempDir()},
		func(p *os.Process, kind, rest string) bool {
			switch kind {
			case "call":
				calls = append(calls, rest)
				retried = retried || rest == "2 2"
			case "held":
				require.NoError(t, p.Signal(syscall.SIGSTOP))
				// Past the child's wait: RetryDelay 1s + AckWait 2s + PublishTimeout 1s.
				time.Sleep(8 * time.Second)
				require.NoError(t, p.Signal(syscall.SIGCONT))
			case "done":
				done = true
			}
			return done && retried
		}, nil)
	first := func(call string) int {
		for i, c := range calls {
			if c == call {
				return i
			}
		}
		return len(calls)
	}
	t.Logf("calls (event attempt): %v", calls)
	assert.Less(t, first("2 2"), first("3 1"), "the tenant's next event ran before its retried one")
	assert.Less(t, first("2 2"), first("3 2"), "the tenant's next event ran before its retried one")
}

// TestWorker_StallChild is the stalled worker's process: one tenant, six events, the
// third failing once.
func TestWorker_StallChild(t *testing.T) {
	dir := os.Getenv(stallChildEnv)
	if dir == "" {
		t.Skip("run by TestWorker_AProcessStalledWhileATenantWaitsForARetryStillRunsTheRetryFirst")
	}
	e := openEmbedded(t, dir, func(o *EmbeddedOptions) { o.Topology.PublishTimeout = time.Second })
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for i := range 6 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte(strconv.Itoa(i))))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: 2 * time.Second, RetryDelay: time.Second})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error {
		childReport("call", string(m.Data)+" "+strconv.Itoa(m.Attempt))
		if string(m.Data) == "2" && m.Attempt == 1 {
			// Reported once the lane is held behind it, so the stall starts after its
			// wait began.
			time.AfterFunc(200*time.Millisecond, func() { childReport("held", "") })
			return errors.New("fails once")
		}
		if err := m.Ack(); err != nil {
			return err
		}
		if strings.HasPrefix(string(m.Data), "5") {
			childReport("done", "")
		}
		return nil
	}, 0)
	require.NoError(t, err)
	defer stop()
	<-ctx.Done() // the parent kills this process
}

const stallAckedChildEnv = "MQ_STALL_ACKED_CHILD_DIR"

// TestWorker_AProcessStalledPastTheAckWaitDoesNotHandleAnAckedEventAgainAfterLaterOnes
// stops the worker's process for three ack waits while it holds a tenant's events, one
// of them in a handler call. The server redelivers every one of them meanwhile; once
// the process runs again the copies of events it has handled and acked since must not
// reach the handler after the tenant's later events, and every event is handled.
func TestWorker_AProcessStalledPastTheAckWaitDoesNotHandleAnAckedEventAgainAfterLaterOnes(t *testing.T) {
	if os.Getenv(stallAckedChildEnv) != "" {
		t.Skip("the child's own run")
	}
	const events = 200
	var calls []int
	stop := make(chan struct{})
	var once sync.Once
	env := []string{stallAckedChildEnv + "=" + t.TempDir()}
	runChildProcess(t, "TestWorker_StallAckedChild", env, func(p *os.Process, kind, rest string) bool {
		switch kind {
		case "call":
			n, err := strconv.Atoi(rest)
			require.NoError(t, err)
			calls = append(calls, n)
			if n == events-1 {
				// Past an ack wait more, for copies still to come.
				once.Do(func() { time.AfterFunc(5*time.Second, func() { close(stop) }) })
			}
		case "held":
			require.NoError(t, p.Signal(syscall.SIGSTOP))
			time.Sleep(6 * time.Second) // three ack waits
			require.NoError(t, p.Signal(syscall.SIGCONT))
		}
		return false
	}, stop)
	handled := map[int]bool{}
	highest := -1
	var again []int
	for _, n := range calls {
		if n < highest {
			again = append(again, n)
		}
		highest = max(highest, n)
		handled[n] = true
	}
	assert.Len(t, handled, events, "not every event was handled")
	assert.Empty(t, again, "events handled again after the tenant's later ones (calls in order: %v)", calls)
}

// TestWorker_StallAckedChild is that worker's process: one tenant, its first event's
// call reporting "held" and going on for a second, every call acking.
func TestWorker_StallAckedChild(t *testing.T) {
	dir := os.Getenv(stallAckedChildEnv)
	if dir == "" {
		t.Skip("run by TestWorker_AProcessStalledPastTheAckWaitDoesNotHandleAnAckedEventAgainAfterLaterOnes")
	}
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for i := range 200 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte(strconv.Itoa(i))))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: 2 * time.Second})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error {
		childReport("call", string(m.Data))
		if string(m.Data) == "0" && m.Attempt == 1 {
			childReport("held", "")
			time.Sleep(time.Second)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	<-ctx.Done() // the parent kills this process
}
