//go:build integration

package mq_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// TestEmbeddedNATS_Conformance runs the conformance suite against EmbeddedNATS with
// the server's periodic sync (NoSync), one broker per case over its own store. It is
// not parallel: mqtest.Run sets the global OpenTelemetry propagator.
func TestEmbeddedNATS_Conformance(t *testing.T) { mqtest.Run(t, embeddedHarness(true)) }

// TestEmbeddedNATS_ConformanceUnderFsync runs the suite on the default sync setting,
// an fsync per write, where concurrent publishes are committed together
// (publish_coalesce.go) and batches go as atomic chunks: other paths than NoSync's.
func TestEmbeddedNATS_ConformanceUnderFsync(t *testing.T) { mqtest.Run(t, embeddedHarness(false)) }

// embeddedHarness is the conformance harness of EmbeddedNATS with the sync setting
// noSync.
func embeddedHarness(noSync bool) mqtest.Harness {
	var mu sync.Mutex
	dirs := map[mq.Broker]string{}
	open := func(t *testing.T, dir string) *mq.EmbeddedNATS { return openEmbeddedForConformance(t, dir, noSync) }
	return mqtest.Harness{
		New: func(t *testing.T) mq.Broker {
			dir := storeDir(t)
			e := open(t, dir)
			for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
				require.NoError(t, e.SetMaxBytes(t.Context(), tenant, conformanceBudget), "budget %s", tenant)
			}
			mu.Lock()
			dirs[e] = dir
			mu.Unlock()
			return e
		},
		EndDelivery: deleteIngestDurables,
		Fill:        mqtest.FillByPublishing,
		DeadLetters: parkedMessages,
		// Restart closes the broker and opens its store again, as a host's deploy does.
		Restart: func(t *testing.T, b mq.Broker) mq.Broker {
			mu.Lock()
			dir, ok := dirs[b]
			mu.Unlock()
			require.True(t, ok, "broker %p has no store", b)
			require.NoError(t, b.Close())
			e := open(t, dir)
			mu.Lock()
			dirs[e] = dir
			mu.Unlock()
			return e
		},
		ReservedHeaderPrefix: "Nats-",
		Caps: mqtest.Caps{
			StatsConnections:   true,
			PerTenantBudget:    true,
			PurgesAcked:        true,
			UnbudgetedNotFound: true,
			ConfiguresDurables: true,
			AckWaitRedelivers:  true,
			StoresBudgets:      true,
			RetryPolicy:        true,
			ConcurrentTenants:  true,
			HandsBackOnStop:    true,
			SharedConsumers:    true,
			AtomicBatch:        true,
		},
	}
}

// conformanceLogger keeps the servers' start-up banners out of the test output and
// lets warnings through.
var conformanceLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// conformanceBudget is the production-sized budget every case starts with.
const conformanceBudget = 64 << 20

func embeddedOf(t *testing.T, b mq.Broker) *mq.EmbeddedNATS {
	t.Helper()
	e, ok := b.(*mq.EmbeddedNATS)
	require.True(t, ok, "broker is a %T, not *mq.EmbeddedNATS", b)
	return e
}

// openEmbeddedForConformance opens an embedded broker on dir, closed at cleanup (a case
// may have closed it already).
func openEmbeddedForConformance(t *testing.T, dir string, noSync bool) *mq.EmbeddedNATS {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	e, err := mq.NewEmbedded(ctx, mq.EmbeddedOptions{StoreDir: dir, NoSync: noSync, Logger: conformanceLogger})
	require.NoError(t, err, "open an embedded broker on %s", dir)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// storeDir is a store directory under t.TempDir whose removal is retried: under load a
// store file can appear just after Close returned, and TempDir removes only once. Its
// cleanup is registered after TempDir's, so it runs first.
func storeDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	t.Cleanup(func() {
		var err error
		for range 50 {
			if err = os.RemoveAll(dir); err == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("store %s not removed: %v", dir, err)
	})
	return dir
}

// deleteIngestDurables deletes the ingest durable on every partition, as an operator
// could: every partition's delivery ends underneath the running consumer.
func deleteIngestDurables(t *testing.T, b mq.Broker) {
	t.Helper()
	e := embeddedOf(t, b)
	js, topo := mq.JetStreamOf(e), mq.TopologyOf(e)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for p := range topo.Partitions {
		require.NoError(t, js.DeleteConsumer(ctx, topo.PartitionStream(p), topo.IngestConsumer),
			"delete %s on %s", topo.IngestConsumer, topo.PartitionStream(p))
	}
}

// parkedMessages reads tenant's parked events through the public DeadLetterManager, in
// small pages so every conformance case that reads parks also pages.
func parkedMessages(t *testing.T, b mq.Broker, tenant mq.TenantID) []*mq.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dm, ok := b.(mq.DeadLetterManager)
	require.True(t, ok, "%T is no DeadLetterManager", b)
	var msgs []*mq.Message
	for cursor := ""; ; {
		page, next, err := dm.DeadLetters(ctx, tenant, mq.DeadLetterQuery{Limit: 2, Cursor: cursor})
		require.NoError(t, err, "parked messages of %s", tenant)
		msgs = append(msgs, page...)
		if next == "" {
			return msgs
		}
		cursor = next
	}
}
