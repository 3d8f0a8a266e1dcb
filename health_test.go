//go:build integration

package mq

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// health calls Health bounded, as a probe would; by 5 s rather than a probe's usual
// second, as one request may take longer on a loaded CI machine under the race detector.
func health(t *testing.T, h HealthChecker) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return h.Health(ctx)
}

// eventuallyUnhealthy waits until Health fails with an error wrapping want and
// containing name, and returns that error.
func eventuallyUnhealthy(t *testing.T, h HealthChecker, want error, name string) error {
	t.Helper()
	var last error
	require.Eventually(t, func() bool {
		last = health(t, h)
		return errors.Is(last, want) && strings.Contains(last.Error(), name)
	}, 20*time.Second, 20*time.Millisecond, "Health never reported %v naming %s (last: %v)", want, name, last)
	return last
}

func eventuallyHealthy(t *testing.T, h HealthChecker) {
	t.Helper()
	var last error
	require.Eventually(t, func() bool { last = health(t, h); return last == nil }, 30*time.Second, 50*time.Millisecond,
		"Health never came back (last: %v)", last)
}

func TestEmbeddedNATS_HealthIsNilWithAHubAndAConsumeRunning(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.Subscribe(ctx, "sse", func(*Message) error { return nil }))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error { return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	require.NoError(t, health(t, e))
}

func TestEmbeddedNATS_HealthAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	require.NoError(t, e.Close())
	require.ErrorIs(t, health(t, e), ErrClosed)
}

func TestEmbeddedNATS_HealthNamesAHubWhoseHistoryWasDeletedUntilItResumes(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.Subscribe(ctx, "sse", func(*Message) error { return nil }))
	require.NoError(t, e.js.DeleteStream(ctx, e.topo.HistoryStream))
	err := eventuallyUnhealthy(t, e, ErrUnavailable, `hub "sse" stopped delivering`)
	require.Contains(t, err.Error(), "history stream "+e.topo.HistoryStream)

	_, err = e.js.CreateStream(ctx, e.topo.historyConfig())
	require.NoError(t, err)
	eventuallyHealthy(t, e)
}

func TestEmbeddedNATS_HealthNamesAConsumeWhoseDurableWasDeletedUntilItsCallerStopsIt(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, failed, err := c.Consume(func(m *Message) error { return m.Ack() }, 0)
	require.NoError(t, err)
	for p := range e.topo.Partitions {
		require.NoError(t, e.js.DeleteConsumer(ctx, e.topo.PartitionStream(p), e.topo.IngestConsumer))
	}
	select {
	case err := <-failed:
		require.ErrorIs(t, err, ErrDeliveryEnded)
	case <-ctx.Done():
		t.Fatal("no report on failed")
	}
	err = health(t, e)
	require.ErrorIs(t, err, ErrDeliveryEnded)
	require.Contains(t, err.Error(), `worker "`+e.topo.IngestConsumer+`" delivery ended`)

	stop()
	require.NoError(t, health(t, e), "a Consume its caller stopped no longer counts")
}

func TestEmbeddedNATS_HealthForgetsAHubWhoseCtxEndedAndAConsumeItsCallerStopped(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	hubCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, e.Subscribe(hubCtx, "sse", func(*Message) error { return nil }))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, _, err := c.Consume(func(m *Message) error { return m.Ack() }, 0)
	require.NoError(t, err)
	parts := func() int { e.core.mu.Lock(); defer e.core.mu.Unlock(); return len(e.core.parts) }
	require.Equal(t, 2, parts())
	cancel()
	stop()
	require.Eventually(t, func() bool { return parts() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, health(t, e))
}

func TestExternalNATS_HealthIsUnavailableWhileTheServerIsDownAndNilAgainAfterItsRestart(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	require.NoError(t, e.Subscribe(ctx, "sse", func(*Message) error { return nil }))
	require.NoError(t, health(t, e))

	f.stop(t)
	require.ErrorIs(t, eventuallyUnhealthy(t, e, ErrUnavailable, ""), ErrUnavailable)
	f.restart(t)
	eventuallyHealthy(t, e)
}

func TestExternalNATS_HealthReportsTheTopologyFaultTheRecheckFoundUntilItIsRepaired(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t, func(c *NATSConfig) { c.recheckEvery = 50 * time.Millisecond })
	ctx := testCtx(t)
	dlq := *f.shape.stream(t, "WH_DLQ")
	require.NoError(t, f.admin.DeleteStream(ctx, dlq.Name))
	err := eventuallyUnhealthy(t, e, ErrTopology, dlq.Name)
	var topoErr *TopologyError
	require.ErrorAs(t, err, &topoErr)

	_, err = f.admin.CreateStream(ctx, dlq)
	require.NoError(t, err)
	eventuallyHealthy(t, e)
}

func TestHealthHandler_Serves200OkWhenHealthyAnd503WithTheErrorWhenNot(t *testing.T) {
	t.Parallel()
	serve := func(err error) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		HealthHandler(HealthFunc(func(context.Context) error { return err })).
			ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec
	}
	ok := serve(nil)
	require.Equal(t, http.StatusOK, ok.Code)
	require.Equal(t, "ok\n", ok.Body.String())
	require.Equal(t, "no-store", ok.Header().Get("Cache-Control"))

	bad := serve(errors.New(`hub "sse" stopped delivering`))
	require.Equal(t, http.StatusServiceUnavailable, bad.Code)
	require.Equal(t, "hub \"sse\" stopped delivering\n", bad.Body.String())
}

// TestHealthHandler_ANilCheckerFailsEveryProbeRatherThanPanicking: wiring that lost
// its broker (a nil HealthChecker, or a nil HealthFunc) is reported unhealthy, with
// the configuration error's text, on every request.
func TestHealthHandler_ANilCheckerFailsEveryProbeRatherThanPanicking(t *testing.T) {
	t.Parallel()
	var nilFunc HealthFunc
	for name, h := range map[string]HealthChecker{"nil checker": nil, "nil HealthFunc": nilFunc} {
		for range 2 {
			rec := httptest.NewRecorder()
			require.NotPanics(t, func() {
				HealthHandler(h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			}, name)
			require.Equal(t, http.StatusServiceUnavailable, rec.Code, name)
			require.Contains(t, rec.Body.String(), ErrInvalidConfig.Error(), name)
		}
	}
	require.ErrorIs(t, nilFunc.Health(t.Context()), ErrInvalidConfig)
}
