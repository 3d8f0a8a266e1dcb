//go:build integration

package mq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExternalNATS_ARollingRestartUnderLiveTrafficLosesNoConfirmedEventAndKeepsEachTenantsOrder:
// the restart tests stop the worker first; a rollout in production happens while API
// pods publish and workers consume. Each node of an R3 cluster is restarted in turn
// under both. A publish may fail meanwhile, only as unavailable (or the caller's own
// deadline), and its retry under the same idempotency key stores the event once; every
// confirmed event reaches a handler, each tenant's in publish order, and no worker's
// delivery ends.
func TestExternalNATS_ARollingRestartUnderLiveTrafficLosesNoConfirmedEventAndKeepsEachTenantsOrder(t *testing.T) {
	t.Parallel()
	c := newClusterFixture(t, 3)
	f := &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(t, 3, withGroupAckWait(t))}
	config := func(c *NATSConfig) { c.AckWait = groupAckWait }
	pub := f.broker(t, config)
	tenants := make([]TenantID, 8)
	for i := range tenants {
		tenants[i] = TenantID(fmt.Sprintf("tenant-%d", i))
		require.NoError(t, pub.SetMaxBytes(t.Context(), tenants[i], 64<<20))
	}

	ledger := &groupLedger{acked: map[string]bool{}}
	var calls struct { // every call, for the report of a broken order
		mu   sync.Mutex
		list []string
	}
	var ended []error
	var endedMu sync.Mutex
	for _, name := range []string{"a", "b"} {
		w := f.broker(t, config)
		cons, err := w.CreateConsumer(t.Context(), ConsumerConfig{MemberTimeout: groupMemberTimeout, Concurrency: 4, AckWait: groupAckWait})
		require.NoError(t, err)
		h := ledger.handler(name)
		stop, failed, err := cons.Consume(func(m *Message) error {
			calls.mu.Lock()
			calls.list = append(calls.list, fmt.Sprintf("%s (sequence %d, attempt %d) on %s at %s", m.Data, m.Sequence, m.Attempt, name, time.Now().Format("15:04:05.000")))
			calls.mu.Unlock()
			return h(m)
		}, 0)
		require.NoError(t, err)
		t.Cleanup(stop)
		go func() {
			select {
			case err := <-failed:
				endedMu.Lock()
				ended = append(ended, fmt.Errorf("worker %s: %w", name, err))
				endedMu.Unlock()
			case <-t.Context().Done():
			}
		}()
	}

	// One publisher per tenant, as API pods publish: each event once the one before
	// is confirmed, retried under its key until it is.
	var (
		quit      atomic.Bool
		retried   atomic.Int64
		wrongErrs = make(chan error, 64)
		confirmed = make([][]string, len(tenants))
		wg        sync.WaitGroup
	)
	for i, tenant := range tenants {
		wg.Go(func() {
			for n := 0; !quit.Load(); n++ {
				data := fmt.Sprintf("%s:%d", tenant, n)
				for {
					ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
					err := pub.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte(data), WithIdempotencyKey(data))
					cancel()
					if err == nil {
						break
					}
					if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
						select {
						case wrongErrs <- fmt.Errorf("publishing %s: %w", data, err):
						default:
						}
						return
					}
					if t.Context().Err() != nil {
						return
					}
					retried.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				confirmed[i] = append(confirmed[i], data)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}

	time.Sleep(time.Second) // traffic flowing, the partitions taken
	c.rollingRestart(t, func() { time.Sleep(500 * time.Millisecond) })
	time.Sleep(time.Second) // and flowing again after the last node's return
	quit.Store(true)
	wg.Wait()
	close(wrongErrs)
	for err := range wrongErrs {
		t.Errorf("a publish failed with neither ErrUnavailable nor its deadline: %v", err)
	}

	var all []string
	for _, c := range confirmed {
		all = append(all, c...)
	}
	require.NotEmpty(t, all)
	missing := func() (out []string) {
		ledger.mu.Lock()
		defer ledger.mu.Unlock()
		for _, d := range all {
			if !ledger.acked[d] {
				out = append(out, d)
			}
		}
		return out
	}
	for deadline := time.Now().Add(2 * time.Minute); len(missing()) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if m := missing(); len(m) > 0 {
		t.Fatalf("%d of %d confirmed events were never handled, first: %v", len(m), len(all), m[:min(len(m), 10)])
	}
	if v := ledger.orderViolations(); !assert.Empty(t, v, "each tenant's order across the rollout") {
		tenant, _, _ := strings.Cut(v[0], ":")
		calls.mu.Lock()
		for _, c := range calls.list {
			if strings.HasPrefix(c, tenant+":") {
				t.Logf("call of %s", c)
			}
		}
		calls.mu.Unlock()
	}
	endedMu.Lock()
	assert.Empty(t, ended, "a worker's delivery ended during the rollout")
	endedMu.Unlock()
	t.Logf("measured: %d events confirmed, %d publish attempts retried, %d handler calls", len(all), retried.Load(), len(ledger.calls))
}
