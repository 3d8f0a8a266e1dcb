//go:build integration

package mq

import (
	"errors"
	"os"
	"strconv"
	"strings"
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
