//go:build integration

package mq

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// consumeAll runs the worker on b, acking every event, and returns what arrives.
func consumeAll(t *testing.T, b Broker) (<-chan *Message, <-chan error) {
	t.Helper()
	ctx := testCtx(t)
	c, err := b.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	got := make(chan *Message, 256)
	stop, failed, err := c.Consume(func(m *Message) error {
		if err := m.DoubleAck(ctx); err != nil {
			return err
		}
		got <- m
		return nil
	}, 16)
	require.NoError(t, err)
	t.Cleanup(stop)
	return got, failed
}

func receive(t *testing.T, got <-chan *Message, failed <-chan error) *Message {
	t.Helper()
	select {
	case m := <-got:
		return m
	case err := <-failed:
		t.Fatalf("delivery ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered")
	}
	return nil
}

func TestExternalNATS_PublishesConsumesAndNeverCreatesADurable(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, e.Publish(ctx, topic, []byte("one")))
	got, failed := consumeAll(t, e)
	assert.Equal(t, "one", string(receive(t, got, failed).Data))

	_, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: "other"})
	require.ErrorIs(t, err, ErrConsumerNotFound)
	_, err = e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: time.Hour})
	require.ErrorContains(t, err, "ack wait", "a durable whose ack wait is shorter than asked is refused")

	f.deleteIngestDurables(t, e.topo)
	_, err = e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.ErrorIs(t, err, ErrConsumerNotFound)
	_, err = f.admin.Consumer(ctx, e.topo.PartitionStream(0), e.topo.IngestConsumer)
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the broker did not create the durable")
}

func TestExternalNATS_ReconnectsAndResumesWithoutReportingFailed(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t, func(c *NATSConfig) { c.PublishTimeout = 300 * time.Millisecond })
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "t"}
	got, failed := consumeAll(t, e)
	require.NoError(t, e.Publish(ctx, topic, []byte("before")))
	assert.Equal(t, "before", string(receive(t, got, failed).Data))

	f.stop(t)
	err := e.Publish(ctx, topic, []byte("down"))
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrQueueFull)

	f.restart(t)
	require.Eventually(t, func() bool { return e.Publish(ctx, topic, []byte("after")) == nil }, 15*time.Second, 100*time.Millisecond)
	for {
		m := receive(t, got, failed)
		if string(m.Data) == "after" {
			break
		}
		assert.Equal(t, "down", string(m.Data), "a timed-out publish may have been stored")
	}
	select {
	case err := <-failed:
		t.Fatalf("a reconnect reported failed: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}

// lossyRequests loses the answers to the first `lose` publish attempts, after they
// were stored.
type lossyRequests struct {
	send func(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error)
	mu   sync.Mutex
	lose int
	ids  []string
}

func (l *lossyRequests) request(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	ack, err := l.send(ctx, msg)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, msg.Header.Get(HeaderIdempotencyKey))
	if err == nil && l.lose > 0 {
		l.lose--
		return nil, context.DeadlineExceeded
	}
	return ack, err
}

func TestExternalNATS_ALostAnswerIsRetriedWithTheSameIDAndStoredOnce(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t, func(c *NATSConfig) { c.PublishTimeout = time.Second })
	ctx := testCtx(t)
	lossy := &lossyRequests{send: e.core.request, lose: 2}
	e.core.request = lossy.request
	topic := Topic{Tenant: "acme", Table: "t"}
	stream := e.core.partitions[Partition("acme", e.topo.Partitions)]
	require.NoError(t, e.Publish(ctx, topic, []byte("x")))
	require.Len(t, lossy.ids, 3, "three attempts")
	assert.Equal(t, lossy.ids[0], lossy.ids[1])
	assert.Equal(t, lossy.ids[0], lossy.ids[2])
	assert.Equal(t, uint64(1), f.streamMsgs(t, stream), "stored once")

	require.NoError(t, e.Publish(ctx, topic, []byte("y")))
	assert.NotEqual(t, lossy.ids[0], lossy.ids[3], "a new publish gets a new id")

	lossy.lose = 3
	err := e.Publish(ctx, topic, []byte("z"))
	require.ErrorIs(t, err, ErrUnavailable, "every answer lost")
}

func TestExternalNATS_ATopicAtItsPerSubjectCapIsFullAndOnlyThatTopic(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	f.updateStream(t, e.core.partitions[Partition("acme", e.topo.Partitions)],
		func(cfg *jetstream.StreamConfig) { cfg.MaxMsgsPerSubject = 2 })
	full := Topic{Tenant: "acme", Table: "full"}
	require.NoError(t, e.Publish(ctx, full, []byte("1")))
	require.NoError(t, e.Publish(ctx, full, []byte("2")))
	require.ErrorIs(t, e.Publish(ctx, full, []byte("3")), ErrQueueFull)
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "other"}, []byte("1")), "another topic of the partition")
}

func TestExternalNATS_ADeletedPartitionIsUnavailableAndNotRecreated(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	reader := sdkmetric.NewManualReader()
	e := f.broker(t, func(c *NATSConfig) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	ctx := testCtx(t)
	stream := e.core.partitions[Partition("acme", e.topo.Partitions)]
	require.NoError(t, f.admin.DeleteStream(ctx, stream))
	err := e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("x"))
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), stream)
	assert.Equal(t, int64(0), gauges(t, reader)[metricTopologyOK], "the gauge drops at once")
	_, err = f.admin.Stream(ctx, stream)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

func TestNewNATS_RefusesATopologyMissingItsDeadLetterStream(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	s := shapeOf(NATSTopology{})
	s.drop("WH_DLQ")
	f.apply(t, s)
	ef := &externalFixture{natsFixture: f, shape: s}
	cfg := ef.config(t)
	cfg.TopologyWait = 500 * time.Millisecond
	_, err := NewNATS(t.Context(), cfg)
	require.ErrorIs(t, err, ErrTopology)
	var te *TopologyError
	require.ErrorAs(t, err, &te)
	assert.Contains(t, err.Error(), "dead-letter stream")
}

func TestNewNATS_RefusesADuplicateWindowThatMissesARetry(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	s := shapeOf(NATSTopology{})
	for p := range s.topo.Partitions {
		s.stream(t, s.topo.PartitionStream(p)).Duplicates = 2 * s.topo.PublishTimeout
	}
	f.apply(t, s)
	cfg := (&externalFixture{natsFixture: f}).config(t)
	cfg.TopologyWait = 500 * time.Millisecond
	_, err := NewNATS(t.Context(), cfg)
	var te *TopologyError
	require.ErrorAs(t, err, &te)
	windows := 0
	for _, fd := range te.Findings {
		if fd.Field == "duplicate_window" {
			windows++
		}
	}
	assert.Equal(t, 4, windows, "every partition's window is flagged")
}

func TestNewNATS_AnUnreachableServerIsUnavailableWithinTheWait(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	url := f.srv.ClientURL()
	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	start := time.Now()
	_, err := NewNATS(t.Context(), NATSConfig{URLs: []string{url}, TopologyWait: 500 * time.Millisecond, Logger: quietLog})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), url)
	assert.Less(t, time.Since(start), 30*time.Second, "bounded by the wait (generous on a loaded machine)")
}

func TestNewNATS_RefusesConflictingOptionsBeforeDialing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	url := []string{"nats://127.0.0.1:1"}
	// A file larger than any secret: read whole, a device such as /dev/zero ran the
	// process out of memory.
	huge := filepath.Join(dir, "huge")
	require.NoError(t, os.WriteFile(huge, nil, 0o600))
	require.NoError(t, os.Truncate(huge, 2<<20))
	cases := map[string]NATSConfig{
		"no URLs":                      {},
		"an empty URL":                 {URLs: []string{" "}},
		"inline credentials":           {URLs: []string{"nats://wavehouse:s3cret@127.0.0.1:1"}},
		"two auth methods":             {URLs: url, User: "u", PasswordFile: file, CredsFile: file},
		"a user, no password":          {URLs: url, User: "u"},
		"a password, no user":          {URLs: url, PasswordFile: file},
		"half a key pair":              {URLs: url, TLS: NATSTLS{CertFile: file}},
		"a bad prefix":                 {URLs: url, NATSTopology: NATSTopology{Prefix: "a.b"}},
		"a missing secret":             {URLs: url, User: "u", PasswordFile: filepath.Join(dir, "missing")},
		"a missing nkey seed":          {URLs: url, NKeySeedFile: filepath.Join(dir, "missing")},
		"a negative wait":              {URLs: url, TopologyWait: -time.Second},
		"an unreadable CA":             {URLs: url, TLS: NATSTLS{CAFile: filepath.Join(dir, "missing")}},
		"zero partitions left":         {URLs: url, NATSTopology: NATSTopology{Partitions: -1}},
		"a URL that does not parse":    {URLs: []string{"://nowhere"}},
		"a port that is not a number":  {URLs: []string{"nats://127.0.0.1:port"}},
		"a CA file that is not PEM":    {URLs: url, TLS: NATSTLS{CAFile: file}},
		"a creds file that is a dir":   {URLs: url, CredsFile: dir},
		"a creds file that is garbage": {URLs: url, CredsFile: file},
		"a seed file that is garbage":  {URLs: url, NKeySeedFile: file},
		"a password file of 2 MiB":     {URLs: url, User: "u", PasswordFile: huge},
		"a CA file of 2 MiB":           {URLs: url, TLS: NATSTLS{CAFile: huge}},
	}
	if _, err := os.Stat(os.DevNull); err == nil {
		cases["a password file that is a device"] = NATSConfig{URLs: url, User: "u", PasswordFile: os.DevNull}
		cases["a creds file that is a device"] = NATSConfig{URLs: url, CredsFile: os.DevNull}
	}
	// Validate refuses them too, but for those only reading a file or dialing shows.
	shownLater := []string{"a URL that does not parse", "a port that is not a number", "a CA file that is not PEM",
		"a creds file that is garbage", "a seed file that is garbage"}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			if !slices.Contains(shownLater, name) {
				assert.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "Validate")
			}
			start := time.Now()
			_, err := NewNATS(t.Context(), cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.NotErrorIs(t, err, ErrUnavailable, "refused before any dial")
			assert.NotContains(t, err.Error(), "s3cret", "a password never appears in an error")
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}
}

func TestExternalNATS_RecheckNoticesBreakageAndRepair(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	reader := sdkmetric.NewManualReader()
	e := f.broker(t, func(c *NATSConfig) {
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		c.recheckEvery, c.pollEvery = 50*time.Millisecond, 50*time.Millisecond
	})
	ctx := testCtx(t)
	ok := func() int64 { return gauges(t, reader)[metricTopologyOK] }
	require.Equal(t, int64(1), ok())
	dlq := *f.shape.stream(t, "WH_DLQ")
	require.NoError(t, f.admin.DeleteStream(ctx, dlq.Name))
	require.Eventually(t, func() bool { return ok() == 0 }, 10*time.Second, 20*time.Millisecond, "a deleted DLQ drops topology_ok")
	_, err := f.admin.CreateStream(ctx, dlq)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ok() == 1 }, 10*time.Second, 20*time.Millisecond, "recreating it restores topology_ok")

	f.stop(t)
	f.restart(t)
	require.Eventually(t, e.nc.IsConnected, 15*time.Second, 20*time.Millisecond)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		require.Equal(t, int64(1), ok(), "a restart, sources re-attaching included, is not a topology fault")
		time.Sleep(50 * time.Millisecond)
	}
}

// gauges collects every int64 gauge without attributes, by name.
func gauges(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
				for _, dp := range g.DataPoints {
					if dp.Attributes.Len() == 0 {
						out[m.Name] = dp.Value
					}
				}
			}
		}
	}
	return out
}

func TestExternalNATS_GaugesReportTheConnectionTopologyAndEachSource(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	reader := sdkmetric.NewManualReader()
	f.broker(t, func(c *NATSConfig) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	lags, actives := map[string]int64{}, map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case metricSourceLag:
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					v, _ := dp.Attributes.Value(AttrStream)
					lags[v.AsString()] = dp.Value
				}
			case metricSourceActive:
				for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
					v, _ := dp.Attributes.Value(AttrStream)
					actives[v.AsString()] = dp.Value
				}
			}
		}
	}
	g := gauges(t, reader)
	assert.Equal(t, int64(1), g[metricConnected])
	assert.Equal(t, int64(1), g[metricTopologyOK])
	assert.Len(t, lags, 4)
	assert.Len(t, actives, 4)
	for name, lag := range lags {
		assert.Zero(t, lag, name)
		assert.GreaterOrEqual(t, actives[name], 0.0, name)
	}
	assert.Equal(t, -1.0, activeSeconds(-time.Nanosecond), "the server's -1ns before the first attach is exactly -1")
}

func TestExternalNATS_PurgeAckedRemovesNothingAndWarnsOncePerTenant(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	var logs syncBuffer
	e := f.broker(t, func(c *NATSConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	long := map[TenantID]time.Time{"acme": time.Now().Add(-time.Hour), "globex": time.Now().Add(-time.Minute)}
	for range 2 {
		purged, err := e.PurgeAcked(ctx, WorkerDurable, long)
		require.NoError(t, err)
		assert.False(t, purged)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "tenant=acme"), "warned once for the tenant whose window exceeds the history")
	assert.NotContains(t, logs.String(), "tenant=globex")
	_, err := e.PurgeAcked(ctx, "no-such-consumer", nil)
	require.ErrorIs(t, err, ErrConsumerNotFound)
}

// TestExternalNATS_PurgeAckedWarnsOncePerTenantHoweverItsWindowGrows: a tenant whose
// window exceeds the history is warned about once, not again each time its window has
// grown (a fixed cutoff grows it a second per second).
func TestExternalNATS_PurgeAckedWarnsOncePerTenantHoweverItsWindowGrows(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	var logs syncBuffer
	e := f.broker(t, func(c *NATSConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	now := time.Now()
	for _, window := range []time.Duration{time.Hour, time.Hour + time.Second, 2 * time.Hour, 48 * time.Hour} {
		_, err := e.PurgeAcked(ctx, WorkerDurable, map[TenantID]time.Time{"acme": now.Add(-window), "globex": now.Add(-2 * window)})
		require.NoError(t, err)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "tenant=acme"), "acme warned once: %s", logs.String())
	assert.Equal(t, 1, strings.Count(logs.String(), "tenant=globex"), "globex warned once: %s", logs.String())
}

func TestExternalNATS_ReplayToASlowClientArrivesWholeAndDoesNotChaseTheTail(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	topic := Topic{Tenant: "acme", Table: "slow"}
	const n = replayBatch + 44
	for range n {
		require.NoError(t, e.Publish(ctx, topic, []byte("old")))
	}
	require.Eventually(t, func() bool {
		c := 0
		_ = e.ReplaySince(ctx, topic, time.Time{}, func(*Message) bool { c++; return true })
		return c == n
	}, 10*time.Second, 20*time.Millisecond)
	sent := 0
	err := e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		if sent == 0 {
			require.NoError(t, e.Publish(ctx, topic, []byte("new")))
		}
		sent++
		assert.Equal(t, "old", string(m.Data))
		time.Sleep(25 * time.Millisecond)
		return true
	})
	require.NoError(t, err)
	assert.Equal(t, n, sent)
}

func TestExternalNATS_CloseLogsNoWarningButALostServerDoes(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	var logs syncBuffer
	e := f.broker(t, func(c *NATSConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	_, failed := consumeAll(t, e)
	require.NoError(t, e.Subscribe(testCtx(t), "hub", func(*Message) error { return nil }))
	booted := len(logs.String()) // boot logs the one-replica recommendations
	require.NoError(t, e.Close())
	require.NoError(t, e.Close(), "Close is idempotent")
	closing := logs.String()[booted:]
	assert.NotContains(t, closing, "level=WARN")
	assert.NotContains(t, closing, "level=ERROR")
	select {
	case err := <-failed:
		t.Fatalf("Close reported failed: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.ErrorIs(t, e.Publish(t.Context(), Topic{Tenant: "acme", Table: "t"}, nil), ErrClosed)

	var lost syncBuffer
	f.broker(t, func(c *NATSConfig) { c.Logger = slog.New(slog.NewTextHandler(&lost, nil)) })
	f.stop(t)
	require.Eventually(t, func() bool { return strings.Contains(lost.String(), "level=WARN") }, 10*time.Second, 20*time.Millisecond)
}

// wrongTopology is a broker configuration asking twice the partitions of the shipped
// shape it finds: a reachable cluster whose topology never verifies.
func wrongTopology(t *testing.T) NATSConfig {
	t.Helper()
	cfg := newExternalFixture(t).config(t)
	cfg.Partitions = 2 * shippedTopology.Partitions
	return cfg
}

// TestNewNATS_AFailedBootLogsNoDisconnectWarning: a NewNATS that connected and then
// failed closes its connection, and that close is not a lost server: no "disconnected
// from nats" warning, here or after NewNATS returned.
func TestNewNATS_AFailedBootLogsNoDisconnectWarning(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	cfg := wrongTopology(t)
	cfg.TopologyWait, cfg.Logger = 500*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil))
	_, err := NewNATS(t.Context(), cfg)
	require.ErrorIs(t, err, ErrTopology, "it connected, and failed after")
	// The warning came from a connection handler after NewNATS returned: watched for a
	// while, not read once, or the old code passed whenever its handler ran late.
	assert.Never(t, func() bool { return strings.Contains(logs.String(), "disconnected") },
		300*time.Millisecond, 10*time.Millisecond, "%s", logs.String())
}

// TestNewNATS_ACtxEndingBeforeTheWaitKeepsTheTopologyFindings: a boot ctx shorter than
// TopologyWait (a minute by default) on a reachable cluster of the wrong shape ends
// in an error that is both the ctx's and the *TopologyError, with the findings.
func TestNewNATS_ACtxEndingBeforeTheWaitKeepsTheTopologyFindings(t *testing.T) {
	t.Parallel()
	cfg := wrongTopology(t)
	cfg.TopologyWait = 0 // the default, a minute
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := NewNATS(ctx, cfg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrTopology)
	assert.NotErrorIs(t, err, ErrUnavailable, "it was connected")
	var te *TopologyError
	require.ErrorAs(t, err, &te)
	assert.True(t, hasRequired(te.Findings))
	assert.Contains(t, err.Error(), "ingest partition 7")
}

func TestExternalNATS_SetMaxBytesRecordsAndLogsOnce(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	var logs syncBuffer
	e := f.broker(t, func(c *NATSConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1))
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 2))
	assert.Equal(t, int64(1), e.MaxBytes("acme"))
	assert.Equal(t, 1, strings.Count(logs.String(), "not enforced"))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, make([]byte, 100)), "budgets are not enforced")
	require.ErrorIs(t, e.SetMaxBytes(ctx, "A", 1), ErrInvalidTenant)
	st, err := e.Stats()
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Connections)
}

// TestExternalNATS_BadInputIsRefusedWithItsSentinelAndLosesNothing runs the bad-input
// table as the restricted application user.
func TestExternalNATS_BadInputIsRefusedWithItsSentinelAndLosesNothing(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	testBadInputIsRefusedAndLosesNothing(t, inputRig{b: e, core: e.core,
		parked: func(ctx context.Context, tenant TenantID) ([]*Message, error) {
			return parkedFrom(ctx, f.admin, e.core, tenant)
		}})
}

func TestExternalNATS_AnEventOverThePartitionsMessageSizeIsTooLarge(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	f.updateStream(t, e.core.partitions[Partition("acme", e.topo.Partitions)],
		func(cfg *jetstream.StreamConfig) { cfg.MaxMsgSize = 128 })
	err := e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, make([]byte, 512))
	require.ErrorIs(t, err, ErrPayloadTooLarge)
	assert.NotErrorIs(t, err, ErrQueueFull)
}

// TestConnectNATS_PublishesAsTheApplicationUserWhomTheDefaultInboxWouldRefuse dials as
// the restricted user: a raw synchronous publish to the library's ingest subject is
// answered on the connection ConnectNATS makes, and not on a plain one, whose default
// inbox the user may not subscribe to: there the event is stored and its answer lost.
func TestConnectNATS_PublishesAsTheApplicationUserWhomTheDefaultInboxWouldRefuse(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	cfg := f.config(t)
	subject, _, err := cfg.NATSTopology.WithDefaults().subjects().ingestTopic(Topic{Tenant: "acme", Table: "t"})
	require.NoError(t, err)

	nc, err := ConnectNATS(t.Context(), cfg)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.StreamNameBySubject(testCtx(t), subject)
	require.NoError(t, err)
	_, err = js.Publish(testCtx(t), subject, []byte("x"), jetstream.WithExpectStream(stream))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.streamMsgs(t, stream))

	plain, err := nats.Connect(strings.Join(cfg.URLs, ","), nats.UserInfo(appUser, password(appUser)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	require.NoError(t, err)
	defer plain.Close()
	pjs, err := jetstream.New(plain)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = pjs.Publish(ctx, subject, []byte("y"))
	require.Error(t, err, "the default inbox is outside the user's subscribe permission")
	assert.Equal(t, uint64(2), f.streamMsgs(t, stream), "stored, but its answer could not come back")
}

func TestConnectNATS_AnUnreachableServerIsUnavailableAndBadConfigIsRefused(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	url := f.srv.ClientURL()
	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	_, err := ConnectNATS(t.Context(), NATSConfig{URLs: []string{url}, TopologyWait: 300 * time.Millisecond, Logger: quietLog})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), url)

	_, err = ConnectNATS(t.Context(), NATSConfig{URLs: []string{"nats://u:secret@127.0.0.1:1"}, Logger: quietLog})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "secret")
}

// TestNewNATS_ACallersCtxThatEndsFirstShowsInTheError: a host that bounds NewNATS by
// a ctx shorter than TopologyWait sees its ctx's error in the ErrUnavailable.
func TestNewNATS_ACallersCtxThatEndsFirstShowsInTheError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	_, err := NewNATS(ctx, NATSConfig{URLs: []string{"nats://127.0.0.1:1"}, TopologyWait: time.Minute, Logger: quietLog})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = ConnectNATS(ctx, NATSConfig{URLs: []string{"nats://127.0.0.1:1"}, TopologyWait: time.Minute, Logger: quietLog})
	assert.ErrorIs(t, err, context.DeadlineExceeded, "ConnectNATS, as NewNATS")
}
