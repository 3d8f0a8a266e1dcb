package mq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// openEmbedded starts a broker over dir (a new temp dir when empty) and closes it at
// cleanup.
func openEmbedded(t *testing.T, dir string, mutate ...func(*EmbeddedOptions)) *EmbeddedNATS {
	t.Helper()
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "store")
	}
	opts := EmbeddedOptions{StoreDir: dir, NoSync: true, Logger: quietLog}
	for _, m := range mutate {
		m(&opts)
	}
	e, err := NewEmbedded(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// drain consumes n events, acking each, and returns their payloads in order.
func drain(t *testing.T, e *EmbeddedNATS, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		require.NoError(t, m.DoubleAck(ctx))
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(m.Data))
		if len(got) == n {
			close(done)
		}
		return nil
	}, 16)
	require.NoError(t, err)
	defer stop()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("consumed %d of %d", len(got), n)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), got...)
}

func TestEmbeddedNATS_CreatesTheTopologyBeforeItAcceptsAPublish(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	for p := range e.topo.Partitions {
		s, err := e.js.Stream(ctx, e.topo.PartitionStream(p))
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		assert.Equal(t, jetstream.InterestPolicy, cfg.Retention)
		assert.Equal(t, jetstream.DiscardNew, cfg.Discard)
		assert.Equal(t, []string{e.subs.partitionFilter(p)}, cfg.Subjects)
		_, err = s.Consumer(ctx, e.topo.IngestConsumer)
		require.NoError(t, err, "partition %d has no durable", p)
	}
	h, err := e.js.Stream(ctx, e.topo.HistoryStream)
	require.NoError(t, err)
	assert.Len(t, h.CachedInfo().Config.Sources, e.topo.Partitions)
	_, err = e.js.Stream(ctx, e.topo.DeadLetterStream())
	require.NoError(t, err)
}

func TestEmbeddedNATS_ATenantWithoutABudgetIsRefusedAsFull(t *testing.T) {
	e := openEmbedded(t, "")
	err := e.Publish(testCtx(t), Topic{Tenant: "acme", Table: "t"}, []byte("x"))
	require.ErrorIs(t, err, ErrQueueFull)
	assert.Contains(t, err.Error(), "acme")
}

func TestEmbeddedNATS_BudgetRefusesPastItsBytesAndAcksFreeThem(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 4096))
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 4096))
	topic := Topic{Tenant: "acme", Table: "t"}
	payload := make([]byte, 1000)
	n := 0
	for ; n < 10; n++ {
		if err := e.Publish(ctx, topic, payload); err != nil {
			require.ErrorIs(t, err, ErrQueueFull)
			break
		}
	}
	require.Equal(t, 4, n, "4 events of ~1 KiB fit a 4 KiB budget")
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "globex", Table: "t"}, payload), "another tenant is unaffected")
	drain(t, e, 5)
	require.NoError(t, e.Publish(ctx, topic, payload), "acked events free the budget")
}

func TestEmbeddedNATS_ReopenedStoreLosesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 2500))
	topic := Topic{Tenant: "acme", Table: "t"}
	payload := make([]byte, 1000)
	require.NoError(t, e.Publish(ctx, topic, payload))
	require.NoError(t, e.Publish(ctx, topic, payload))
	require.NoError(t, e.Close())
	require.NoError(t, e.Close(), "Close is idempotent")
	require.ErrorIs(t, e.Publish(ctx, topic, payload), ErrClosed)

	e = openEmbedded(t, dir)
	assert.Equal(t, int64(2500), e.MaxBytes("acme"), "the budget is kept in the store")
	require.ErrorIs(t, e.Publish(ctx, topic, payload), ErrQueueFull, "the backlog is counted again after a reopen")
	assert.Len(t, drain(t, e, 2), 2, "both stored events are delivered after the reopen")
	part, err := e.js.Stream(ctx, e.topo.PartitionStream(Partition("acme", e.topo.Partitions)))
	require.NoError(t, err)
	var names []string
	for name := range part.ConsumerNames(ctx).Name() {
		if !strings.HasPrefix(name, "JS_SRC_") { // the history's own source consumer
			names = append(names, name)
		}
	}
	assert.Equal(t, []string{e.topo.IngestConsumer}, names, "the backlog scan left no consumer holding events")
	require.NoError(t, e.Publish(ctx, topic, payload))
}

func TestEmbeddedNATS_MetricsReportEachTenantsBacklogAndBudget(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.MetricsTenants = true
	})
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, make([]byte, 100)))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != metricTenantBudget && m.Name != metricTenantBacklog {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := dp.Attributes.Value(AttrTenant)
				got[m.Name+"/"+v.AsString()] = dp.Value
			}
		}
	}
	assert.Equal(t, int64(1<<20), got[metricTenantBudget+"/acme"])
	assert.Greater(t, got[metricTenantBacklog+"/acme"], int64(100))
}

func TestEmbeddedNATS_FailedOnceWhenEveryPartitionsDurableIsDeleted(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	stop, failed, err := c.Consume(func(m *Message) error { return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	for p := range e.topo.Partitions {
		require.NoError(t, e.js.DeleteConsumer(ctx, e.topo.PartitionStream(p), e.topo.IngestConsumer))
	}
	select {
	case err := <-failed:
		require.ErrorIs(t, err, ErrDeliveryEnded)
		require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	case <-ctx.Done():
		t.Fatal("no report on failed")
	}
	select {
	case err := <-failed:
		t.Fatalf("a second report: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestEmbeddedNATS_ReplayIsBoundedToWhatWasStoredAtItsStart(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "r"}
	for range 300 {
		require.NoError(t, e.Publish(ctx, topic, []byte("old")))
	}
	require.Eventually(t, func() bool { return replayCount(t, e, topic) == 300 }, 30*time.Second, 10*time.Millisecond)
	sent := 0
	err := e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		if sent == 0 {
			for range 50 {
				require.NoError(t, e.Publish(ctx, topic, []byte("new")))
			}
		}
		sent++
		return string(m.Data) == "old"
	})
	require.NoError(t, err)
	assert.Equal(t, 300, sent, "events published during the replay are not sent by it")
}

func replayCount(t *testing.T, e *EmbeddedNATS, topic Topic) int {
	n := 0
	err := e.ReplaySince(testCtx(t), topic, time.Time{}, func(*Message) bool { n++; return true })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("replay: %v", err)
	}
	return n
}

func TestEmbeddedNATS_PurgeAckedKeepsUnackedAndRecentEventsPerTenant(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	for _, tenant := range []TenantID{"acme", "globex"} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
	}
	acme, globex := Topic{Tenant: "acme", Table: "p"}, Topic{Tenant: "globex", Table: "p"}
	for _, d := range []string{"a", "b"} {
		require.NoError(t, e.Publish(ctx, acme, []byte(d)))
		require.NoError(t, e.Publish(ctx, globex, []byte(d)))
	}
	assert.ElementsMatch(t, []string{"a", "a", "b", "b"}, drain(t, e, 4))
	require.NoError(t, e.Publish(ctx, acme, []byte("left")))
	require.Eventually(t, func() bool { return replayCount(t, e, acme) == 3 && replayCount(t, e, globex) == 2 },
		30*time.Second, 10*time.Millisecond)

	purged, err := e.PurgeAcked(ctx, WorkerDurable, map[TenantID]time.Time{"globex": time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	assert.True(t, purged)
	assert.Equal(t, 1, replayCount(t, e, acme), "acme (absent from the map) keeps only its unacked event")
	assert.Equal(t, 2, replayCount(t, e, globex), "globex's cutoff is in the past: its recent events stay")

	purged, err = e.PurgeAcked(ctx, WorkerDurable, nil)
	require.NoError(t, err)
	assert.True(t, purged)
	assert.Equal(t, 1, replayCount(t, e, acme), "an unacked event survives any cutoff")
	assert.Equal(t, 0, replayCount(t, e, globex))

	purged, err = e.PurgeAcked(ctx, WorkerDurable, nil)
	require.NoError(t, err)
	assert.False(t, purged, "nothing left to purge")

	_, err = e.PurgeAcked(ctx, "no-such-consumer", nil)
	require.ErrorIs(t, err, ErrConsumerNotFound)
}

func TestEmbeddedNATS_DeletedPartitionIsUnavailable(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, e.js.DeleteStream(ctx, e.topo.PartitionStream(Partition("acme", e.topo.Partitions))))
	err := e.Publish(ctx, topic, []byte("x"))
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrQueueFull)
	assert.Contains(t, err.Error(), e.topo.PartitionStream(Partition("acme", e.topo.Partitions)))
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	assert.Equal(t, int64(1<<20), e.MaxBytes("acme"))
}

func TestEmbeddedNATS_RefusesBadInputBeforeSending(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	topic := Topic{Tenant: "acme", Table: "t"}
	require.ErrorIs(t, e.Publish(ctx, Topic{Table: "t"}, nil), ErrInvalidTopic)
	require.ErrorIs(t, e.Publish(ctx, topic, make([]byte, 2<<20)), ErrPayloadTooLarge)
	require.ErrorIs(t, e.Publish(ctx, topic, nil, WithHeader("Nats-Rollup", "all")), ErrInvalidHeader)
	require.ErrorIs(t, e.Publish(ctx, topic, nil, WithHeader("X", "a\r\nb")), ErrInvalidHeader)
	require.ErrorIs(t, e.Publish(ctx, topic, nil, WithHeader("X Y", "v")), ErrInvalidHeader)
	require.ErrorIs(t, e.SetMaxBytes(ctx, "Acme", 1), ErrInvalidTenant)
	require.Error(t, e.SetMaxBytes(ctx, "acme", -1))
	_, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: "other"})
	require.ErrorIs(t, err, ErrConsumerNotFound)
	_, err = e.DeadLetterCounts(ctx, "a.b", "")
	require.ErrorIs(t, err, ErrInvalidTenant)
	require.ErrorIs(t, e.DeadLetter(ctx, &Message{}), ErrInvalidTopic)
	info, err := e.js.Stream(ctx, e.topo.PartitionStream(Partition("acme", e.topo.Partitions)))
	require.NoError(t, err)
	assert.Zero(t, info.CachedInfo().State.Msgs, "nothing was stored")
}

func TestEmbeddedNATS_DeadLetterIsAPrefixSwapKeepingHeaders(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	foreign := newKeyedMessage(ctx, "a.b.c.d", []byte("odd"), WithMessageHeaders(Headers{"X-Orig": {"1"}}))
	require.NoError(t, e.DeadLetter(ctx, foreign, WithHeader("X-Error", "bad")))
	s, err := e.js.Stream(ctx, e.topo.DeadLetterStream())
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(ctx, "wh.dlq.a.b.c.d")
	require.NoError(t, err)
	assert.Equal(t, "odd", string(m.Data))
	assert.Equal(t, "1", m.Header.Get("X-Orig"))
	assert.Equal(t, "bad", m.Header.Get("X-Error"))
	assert.NotEmpty(t, m.Header.Get("Nats-Msg-Id"), "a park gets a fresh id")
}

// TestEmbeddedNATS_DeadLetterOfAMessageWithANatsHeaderOfItsOwnIsRefusedAndParksNothing:
// such a header (only a message the host built can hold one) was dropped unseen,
// while Headers promises a refusal with ErrInvalidHeader, as on Publish.
func TestEmbeddedNATS_DeadLetterOfAMessageWithANatsHeaderOfItsOwnIsRefusedAndParksNothing(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "t"}
	for _, name := range []string{"Nats-Rollup", "nats-ttl", HeaderIdempotencyKey} {
		m := NewMessage(ctx, topic, []byte("x"), WithMessageHeaders(Headers{name: {"all"}, "Keep": {"me"}}))
		err := e.DeadLetter(ctx, m)
		require.ErrorIs(t, err, ErrInvalidHeader, name)
		assert.Contains(t, err.Error(), name)
	}
	c, err := e.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	assert.Zero(t, c.Total, "nothing parked")
}

func TestEmbeddedNATS_ListensOnlyWhenAsked(t *testing.T) {
	assert.Empty(t, openEmbedded(t, "").ClientURL())
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.ListenAddr = "127.0.0.1:0" })
	assert.Contains(t, e.ClientURL(), "nats://127.0.0.1:")
	_, err := NewEmbedded(t.Context(), EmbeddedOptions{ListenAddr: "nonsense", Logger: quietLog})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestEmbeddedNATS_AListenerBeyondLoopbackIsWarnedOf: the listener has no
// authentication, so an address another machine may reach is logged as a warning, and
// a loopback one is not.
func TestEmbeddedNATS_AListenerBeyondLoopbackIsWarnedOf(t *testing.T) {
	for host, beyond := range map[string]bool{
		"127.0.0.1": false, "::1": false, "::1%lo": false, "localhost": false, "127.0.0.53": false, "fe80::1%eth0": true,
		"": true, "0.0.0.0": true, "::": true, "10.1.2.3": true, "nats.example": true,
	} {
		assert.Equal(t, beyond, beyondLoopback(host), "%q", host)
	}
	var logs syncBuffer
	openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.ListenAddr, o.Logger = "127.0.0.1:0", slog.New(slog.NewTextHandler(&logs, nil))
	})
	assert.NotContains(t, logs.String(), "without authentication", "a loopback listener")
}

func TestNewEmbedded_RefusesAStoreItCannotCreate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err := NewEmbedded(t.Context(), EmbeddedOptions{StoreDir: filepath.Join(file, "store"), Logger: quietLog})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "store")
	_, err = NewEmbedded(t.Context(), EmbeddedOptions{Topology: NATSTopology{Prefix: "A.B"}, Logger: quietLog})
	require.ErrorContains(t, err, "prefix")
}

// TestNewEmbedded_OptionsThatCannotWorkAreInvalidConfig: a bad listen address or
// port, a store directory that cannot be made, a negative ReadyTimeout and a topology
// that cannot work wrap ErrInvalidConfig, so a host tells them from a store it cannot
// open; an address the server could not listen on is refused at once, not after the
// ready wait (ReadyTimeout is an hour here, far past the test's deadline).
func TestNewEmbedded_OptionsThatCannotWorkAreInvalidConfig(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	for name, opts := range map[string]EmbeddedOptions{
		"a listen address without a port": {ListenAddr: "nonsense"},
		"a port that is not a number":     {ListenAddr: "127.0.0.1:port"},
		"a port beyond 65535":             {ListenAddr: "127.0.0.1:70000"},
		// TEST-NET-1: no interface of this machine has it; binding fails locally.
		"a listen address of no interface here": {ListenAddr: "192.0.2.1:0", ReadyTimeout: time.Hour},
		"a listen host holding a NUL":           {ListenAddr: "127.0.0.1\x00:0", ReadyTimeout: time.Hour},
		"a store that is a file":                {StoreDir: file},
		"a store under a file":                  {StoreDir: filepath.Join(file, "store")},
		"a store holding a NUL":                 {StoreDir: t.TempDir() + "/a\x00b"},
		"a negative ReadyTimeout":               {ReadyTimeout: -time.Second},
		"a bad prefix":                          {Topology: NATSTopology{Prefix: "A.B"}},
		"negative partitions":                   {Topology: NATSTopology{Partitions: -1}},
		// 4 x 2^61 bytes: more than the embedded server may reserve for its streams.
		"partitions larger than the store may hold": {StoreDir: t.TempDir(), Topology: NATSTopology{PartitionMaxBytes: math.MaxInt64 / 4}},
	} {
		opts.Logger = quietLog
		_, err := NewEmbedded(t.Context(), opts)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
}

// TestNewEmbedded_AListenPortInUseIsUnavailableAtOnce: a port another listener holds
// may come free (an old process still exiting), so it is ErrUnavailable, not a
// configuration error, and it comes back at once rather than after ReadyTimeout.
func TestNewEmbedded_AListenPortInUseIsUnavailableAtOnce(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = NewEmbedded(t.Context(), EmbeddedOptions{StoreDir: t.TempDir(), ListenAddr: ln.Addr().String(),
		ReadyTimeout: time.Hour, Logger: quietLog})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorContains(t, err, ln.Addr().String())
}

// TestEntryPoints_ANilContextOrJetStreamIsInvalidConfigNotAPanic: the constructors and
// the verifier refuse them as every broker method does; VerifyNATSTopology used to
// crash the process from inside a nats.go goroutine.
func TestEntryPoints_ANilContextOrJetStreamIsInvalidConfigNotAPanic(t *testing.T) {
	t.Parallel()
	var nilCtx context.Context
	cfg := NATSConfig{URLs: []string{"nats://127.0.0.1:1"}}
	e := openEmbedded(t, "")
	for name, call := range map[string]func() error{
		"NewEmbedded": func() error { _, err := NewEmbedded(nilCtx, EmbeddedOptions{Logger: quietLog}); return err },
		"NewNATS":     func() error { _, err := NewNATS(nilCtx, cfg); return err },
		"CheckNATS":   func() error { _, err := CheckNATS(nilCtx, cfg); return err },
		"ConnectNATS": func() error { _, err := ConnectNATS(nilCtx, cfg); return err },
		"VerifyNATSTopology": func() error {
			_, err := VerifyNATSTopology(nilCtx, e.js, e.topo)
			return err
		},
		"AwaitNATSTopology": func() error {
			_, err := AwaitNATSTopology(nilCtx, e.js, e.topo, time.Second)
			return err
		},
		"VerifyNATSTopology with a nil JetStream": func() error {
			_, err := VerifyNATSTopology(t.Context(), nil, e.topo)
			return err
		},
		"AwaitNATSTopology with a nil JetStream": func() error {
			_, err := AwaitNATSTopology(t.Context(), nil, e.topo, time.Second)
			return err
		},
	} {
		assert.ErrorIs(t, call(), ErrInvalidConfig, name)
	}
}

func TestEmbeddedNATS_CloseLeavesNothingRunning(t *testing.T) {
	// goleak itself runs in TestMain; this proves a temp store is removed.
	e, err := NewEmbedded(t.Context(), EmbeddedOptions{NoSync: true, Logger: quietLog})
	require.NoError(t, err)
	dir := e.tempDir
	require.DirExists(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.Subscribe(ctx, "hub", func(*Message) error { return nil }))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	_, failed, err := c.Consume(func(*Message) error { return nil }, 0)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.NoDirExists(t, dir)
	select {
	case err := <-failed:
		t.Fatalf("Close reported a failure: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_, err = e.Stats()
	require.ErrorIs(t, err, ErrClosed)
}

func TestServerLogger_MapsLevelsAndNeverExits(t *testing.T) {
	var buf strings.Builder
	l := serverLogger{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l.Noticef("n %d", 1)
	l.Warnf("w")
	l.Errorf("e")
	l.Fatalf("f")
	l.Debugf("d")
	l.Tracef("t")
	out := buf.String()
	for _, want := range []string{"level=INFO msg=\"n 1\"", "level=WARN msg=w", "level=ERROR msg=e", "level=ERROR msg=f", "level=DEBUG msg=d", "level=DEBUG msg=t"} {
		assert.Contains(t, out, want)
	}
}

func TestEmbeddedNATS_IdempotencyKeysAreScopedToTheTenant(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	key := WithIdempotencyKey("k")
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("a"), key))
	require.ErrorIs(t, e.Publish(ctx, Topic{Tenant: "globex", Table: "t"}, []byte("g"), key), ErrQueueFull,
		"another tenant's key is no way past its missing budget")
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "globex", Table: "t"}, []byte("g"), key))
	assert.ElementsMatch(t, []string{"a", "g"}, drain(t, e, 2), "one key, two tenants, two events")
}

func TestEmbeddedNATS_ADeadLetterWithAnIdempotencyKeyIsParkedOnce(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	msg := NewMessage(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("poison"))
	for range 2 {
		require.NoError(t, e.DeadLetter(ctx, msg, WithIdempotencyKey("park-1")))
	}
	counts, err := e.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), counts.Total)
}

// TestEmbeddedNATS_TwoTenantsParkingWithOneIdempotencyKeyBothPark: a dead letter's
// idempotency key is scoped to its tenant, as a publish's is: globex parking its own
// "row-1" after acme did is stored, not reported as a duplicate and dropped.
func TestEmbeddedNATS_TwoTenantsParkingWithOneIdempotencyKeyBothPark(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	for _, tenant := range []TenantID{"acme", "globex"} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
	}
	key := WithIdempotencyKey("row-1")
	require.NoError(t, e.DeadLetter(ctx, NewMessage(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("acme row")), key))
	require.NoError(t, e.DeadLetter(ctx, NewMessage(ctx, Topic{Tenant: "globex", Table: "t"}, []byte("globex row")), key))
	for _, tenant := range []TenantID{"acme", "globex"} {
		counts, err := e.DeadLetterCounts(ctx, tenant, "")
		require.NoError(t, err)
		assert.Equal(t, uint64(1), counts.Total, "%s's parked events", tenant)
	}
	parked, err := ParkedMessages(ctx, e, "globex")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, "globex row", string(parked[0].Data))
}

func TestEmbeddedNATS_OnePartitionsEndEndsTheWholeDelivery(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	a, b := TenantID("acme"), TenantID("b0")
	for Partition(b, e.topo.Partitions) == Partition(a, e.topo.Partitions) {
		b += "0"
	}
	for _, tenant := range []TenantID{a, b} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	got := make(chan string, 8)
	stop, failed, err := c.Consume(func(m *Message) error { got <- string(m.Data); return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	require.NoError(t, e.js.DeleteConsumer(ctx, e.topo.PartitionStream(Partition(a, e.topo.Partitions)), e.topo.IngestConsumer))
	select {
	case err := <-failed:
		require.ErrorIs(t, err, ErrDeliveryEnded)
	case <-ctx.Done():
		t.Fatal("no report")
	}
	require.NoError(t, e.Publish(ctx, Topic{Tenant: b, Table: "t"}, []byte("after")))
	select {
	case d := <-got:
		t.Fatalf("the ended delivery still delivered %q from another partition", d)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestEmbeddedNATS_ADurableDeletedWhileNoPullWasOutstandingEndsDelivery: the server
// tells a pull of its durable's deletion only while the pull is outstanding; one
// deleted before the first pull arrives must still end delivery, once.
func TestEmbeddedNATS_ADurableDeletedWhileNoPullWasOutstandingEndsDelivery(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	stream := e.topo.PartitionStream(0)
	cons, err := e.js.Consumer(ctx, stream, e.topo.IngestConsumer)
	require.NoError(t, err)
	require.NoError(t, e.js.DeleteConsumer(ctx, stream, e.topo.IngestConsumer))
	policy, err := newWorkerPolicy(ConsumerConfig{}, e.topo.Partitions)
	require.NoError(t, err)
	d := newDispatcher(e.core, ctx, e.topo.IngestConsumer, func(*Message) error { return nil }, policy, 1)
	u := d.newUnit(0)
	require.NoError(t, d.consume(u, cons))
	d.mu.Lock()
	d.units[0] = u
	d.mu.Unlock()
	defer d.stop()
	select {
	case err := <-d.failed:
		require.ErrorIs(t, err, ErrDeliveryEnded)
		require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	case <-ctx.Done():
		t.Fatal("delivery of a deleted durable never ended")
	}
}

// TestEmbeddedNATS_ANewConsumeGetsEveryPartitionTheStoppedOneHeld: a stopped Consume
// hands back the partition it was pinned to, and leaves no pull behind on the others
// that an event published before the next Consume could pin them to. With a pinned TTL
// of an hour, a partition left pinned would hold its events past the test's end.
func TestEmbeddedNATS_ANewConsumeGetsEveryPartitionTheStoppedOneHeld(t *testing.T) {
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Topology.PinnedTTL = time.Hour })
	ctx := testCtx(t)
	var tenants []TenantID // one on each partition
	for i := 0; len(tenants) < e.topo.Partitions; i++ {
		tenant := TenantID("t" + strconv.Itoa(i))
		if !slices.ContainsFunc(tenants, func(o TenantID) bool { return Partition(o, e.topo.Partitions) == Partition(tenant, e.topo.Partitions) }) {
			require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
			tenants = append(tenants, tenant)
		}
	}
	require.NoError(t, e.Publish(ctx, Topic{Tenant: tenants[0], Table: "t"}, []byte("first")))
	assert.Equal(t, []string{"first"}, drain(t, e, 1), "the first Consume is pinned to one partition and pulls every one")
	assert.Empty(t, pinnedPartitions(t, e.js, e.topo), "and hands that partition back when it stops")
	for _, tenant := range tenants {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte("while stopped")))
	}
	assert.Equal(t, slices.Repeat([]string{"while stopped"}, len(tenants)), drain(t, e, len(tenants)),
		"the next Consume gets every partition")
}

// waitHistoryCopied waits until the history holds n events and the broker then idles
// as a host does before a restart: the loss that hid behind an immediate restart
// needs the history's source to have acknowledged what it copied.
func waitHistoryCopied(t *testing.T, js jetstream.JetStream, history string, n uint64) {
	t.Helper()
	var info *jetstream.StreamInfo
	ok := assert.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, history)
		if err == nil {
			info = s.CachedInfo()
		}
		return err == nil && info.State.Msgs >= n
	}, 2*time.Minute, 20*time.Millisecond) // measured: sources re-attach 20-60 s after a start, under load
	if !ok {
		var state []string
		for _, src := range info.Sources {
			state = append(state, fmt.Sprintf("%s lag %d active %v error %v", src.Name, src.Lag, src.Active, src.Error))
		}
		t.Fatalf("the history holds %d events, never %d; its sources: %s", info.State.Msgs, n, strings.Join(state, "; "))
	}
	time.Sleep(2 * time.Second)
}

func TestEmbeddedNATS_AnIdleRestartKeepsEveryUnacknowledgedEvent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	const n = 200
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for i := range n {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, fmt.Appendf(nil, "%d", i)))
	}
	waitHistoryCopied(t, e.js, e.topo.HistoryStream, n)
	for restart := 1; restart <= 2; restart++ {
		require.NoError(t, e.Close())
		e = openEmbedded(t, dir)
		part, err := e.js.Stream(ctx, e.topo.PartitionStream(Partition("acme", e.topo.Partitions)))
		require.NoError(t, err)
		require.Equal(t, uint64(n), part.CachedInfo().State.Msgs, "restart %d: the partition kept every unacknowledged event", restart)
		waitHistoryCopied(t, e.js, e.topo.HistoryStream, n)
	}
	got := drain(t, e, n)
	for i, d := range got {
		require.Equal(t, strconv.Itoa(i), d, "delivered in publish order")
	}
	requirePartitionsEmpty(t, e)
}

// requirePartitionsEmpty waits until every partition has let go of what the worker
// acknowledged and the history copied: a partition that keeps them fills up.
func requirePartitionsEmpty(t *testing.T, e *EmbeddedNATS) {
	t.Helper()
	ctx := testCtx(t)
	for p := range e.topo.Partitions {
		name := e.topo.PartitionStream(p)
		require.Eventually(t, func() bool {
			s, err := e.js.Stream(ctx, name)
			return err == nil && s.CachedInfo().State.Msgs == 0
		}, 15*time.Second, 50*time.Millisecond, "partition %s still holds acknowledged events", name)
	}
}

// earlierStore is a store an earlier mq left: the same topology with the ingest
// durable as that version created it (named durable, no priority group), n events of
// one tenant published, the first fetched of them delivered, and those acked says
// acknowledged (by index).
type earlierStore struct {
	durable    string
	n, fetched int
	acked      func(i int) bool
}

// earlierIngestConsumerConfig is partition p's durable as mq created it before the
// durable pinned each partition to one worker: no priority policy, group or TTL.
func earlierIngestConsumerConfig(topo NATSTopology, p int, durable string) jetstream.ConsumerConfig {
	cfg := topo.ingestConsumerConfig(p)
	cfg.Durable = durable
	cfg.PriorityPolicy, cfg.PriorityGroups, cfg.PinnedTTL = jetstream.PriorityPolicyNone, nil, 0
	return cfg
}

// writeEarlierStore writes st into dir with the history caught up and its source
// consumers holding their progress, then idles and stops the server. It returns the
// ingest durable's state on the tenant's partition as the server last reported it.
func writeEarlierStore(t *testing.T, dir string, tenant TenantID, st earlierStore) *jetstream.ConsumerInfo {
	t.Helper()
	topo := NATSTopology{}.WithDefaults()
	topo.Replicas = 1
	srv := runServer(t, &server.Options{JetStream: true, StoreDir: dir, JetStreamMaxStore: maxStore, DontListen: true, NoSigs: true, NoLog: true})
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := testCtx(t)
	for p := range topo.Partitions {
		_, err := js.CreateStream(ctx, topo.partitionConfig(p))
		require.NoError(t, err)
		_, err = js.CreateOrUpdateConsumer(ctx, topo.PartitionStream(p), earlierIngestConsumerConfig(topo, p, st.durable))
		require.NoError(t, err)
	}
	for _, cfg := range []jetstream.StreamConfig{topo.historyConfig(), topo.deadLetterConfig()} {
		_, err := js.CreateStream(ctx, cfg)
		require.NoError(t, err)
	}
	subject, p, err := topo.subjects().ingestTopic(Topic{Tenant: tenant, Table: "t"})
	require.NoError(t, err)
	sourceAcked := func(floor uint64) func() bool {
		return func() bool {
			ok := false
			for ci := range mustStream(t, js, topo.PartitionStream(p)).ListConsumers(ctx).Info() { // read to the end
				ok = ok || strings.HasPrefix(ci.Name, "JS_SRC_") && ci.AckFloor.Stream >= floor
			}
			return ok
		}
	}
	// As the earlier version did, publish only once the history's source is there: an
	// event acknowledged before would leave without reaching the history.
	require.Eventually(t, sourceAcked(0), 30*time.Second, 20*time.Millisecond, "the history never attached")
	for i := range st.n {
		msg := &nats.Msg{Subject: subject, Data: fmt.Appendf(nil, "%d", i), Header: nats.Header{HeaderIdempotencyKey: {nuid.Next()}}}
		_, err := js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	cons, err := js.Consumer(ctx, topo.PartitionStream(p), st.durable)
	require.NoError(t, err)
	if st.fetched > 0 {
		batch, err := cons.Fetch(st.fetched)
		require.NoError(t, err)
		i := 0
		for m := range batch.Messages() {
			if st.acked(i) {
				require.NoError(t, m.DoubleAck(ctx))
			}
			i++
		}
		require.NoError(t, batch.Error())
		require.Equal(t, st.fetched, i, "fetched")
	}
	require.Eventually(t, sourceAcked(uint64(st.n)), 30*time.Second, 20*time.Millisecond, "the history never copied the earlier store's events")
	time.Sleep(2 * time.Second)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	srv.Shutdown()
	srv.WaitForShutdown()
	return info
}

func TestEmbeddedNATS_OpeningAStoreWithTheEarlierDurableLosesNoUnacknowledgedEvent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	const n, acked = 20, 5
	writeEarlierStore(t, dir, "acme", earlierStore{durable: legacyIngestConsumer, n: n, fetched: acked, acked: func(int) bool { return true }})

	e := openEmbedded(t, dir)
	p := Partition("acme", e.topo.Partitions)
	_, err := e.js.Consumer(testCtx(t), e.topo.PartitionStream(p), legacyIngestConsumer)
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the earlier durable is removed")
	got := drain(t, e, n-acked)
	for i, d := range got {
		require.Equal(t, strconv.Itoa(acked+i), d, "every event the earlier durable had not acknowledged, in order")
	}
	waitHistoryCopied(t, e.js, e.topo.HistoryStream, n)
	requirePartitionsEmpty(t, e) // nothing is held for the removed durable
	require.NoError(t, e.Close())
	e = openEmbedded(t, dir) // and a later restart of the migrated store keeps working
	require.NoError(t, e.Close())
}

// TestEmbeddedNATS_OpeningAStoreWithAnUnpinnedDurablePinsItInPlaceKeepingEveryUnacknowledgedEvent
// opens a store whose INGEST has no priority policy (the version before pinning), with
// events acknowledged out of order, delivered and left unacknowledged, and never
// delivered. The boot updates the durable in place (nats-server allows the change):
// its ack floor and pending events stay, it is pinned_client in the ingest group, and
// every unacknowledged event comes, none acknowledged before.
func TestEmbeddedNATS_OpeningAStoreWithAnUnpinnedDurablePinsItInPlaceKeepingEveryUnacknowledgedEvent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	const n, fetched = 20, 10
	ackedBefore := map[int]bool{0: true, 1: true, 2: true, 5: true, 7: true} // floor 3, then 6 and 8 out of order
	before := writeEarlierStore(t, dir, "acme", earlierStore{durable: defaultIngestConsumer, n: n, fetched: fetched, acked: func(i int) bool { return ackedBefore[i] }})
	require.Equal(t, jetstream.PriorityPolicyNone, before.Config.PriorityPolicy, "the earlier durable has no priority policy")
	require.Equal(t, uint64(3), before.AckFloor.Stream, "acknowledged up to event 2, then out of order")
	require.Equal(t, fetched-len(ackedBefore), before.NumAckPending, "delivered and unacknowledged")

	// A short ack wait, so the delivered and unacknowledged events come back soon.
	e := openEmbedded(t, dir, func(o *EmbeddedOptions) { o.Topology.AckWait = time.Second })
	ctx := testCtx(t)
	cons, err := e.js.Consumer(ctx, e.topo.PartitionStream(Partition("acme", e.topo.Partitions)), e.topo.IngestConsumer)
	require.NoError(t, err)
	after := cons.CachedInfo()
	assert.Equal(t, before.Created, after.Created, "the same durable, not a new one")
	assert.Equal(t, jetstream.PriorityPolicyPinned, after.Config.PriorityPolicy)
	assert.Equal(t, []string{"ingest"}, after.Config.PriorityGroups)
	assert.Equal(t, 15*time.Second, after.Config.PinnedTTL)
	assert.Equal(t, before.AckFloor.Stream, after.AckFloor.Stream, "the ack floor is kept")
	assert.Equal(t, before.Delivered.Stream, after.Delivered.Stream, "what was delivered is kept")
	assert.Equal(t, before.NumAckPending, after.NumAckPending, "the pending events are kept")

	var want []string
	for i := range n {
		if !ackedBefore[i] {
			want = append(want, strconv.Itoa(i))
		}
	}
	assert.ElementsMatch(t, want, drain(t, e, len(want)), "every unacknowledged event, and none acknowledged before")
	waitHistoryCopied(t, e.js, e.topo.HistoryStream, n)
	requirePartitionsEmpty(t, e)
}
