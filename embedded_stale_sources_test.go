//go:build integration

package mq

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sourceConsumers is each partition's source consumers in the store under dir: name
// and creation time.
func sourceConsumers(t *testing.T, e *EmbeddedNATS, dir string) map[string]time.Time {
	t.Helper()
	got := map[string]time.Time{}
	for p := range e.topo.Partitions {
		stream := e.topo.PartitionStream(p)
		found, err := historySourceConsumers(testCtx(t), e.js, dir, stream, e.topo.HistoryStream)
		require.NoError(t, err)
		for name, ci := range found {
			got[stream+"/"+name] = ci.Created
		}
	}
	return got
}

// A restart replaces every partition's recovered source consumer with one made by the
// start: the recovered one, updated in place by the history's attach, sent nothing for
// 10 to 20 s (measured), and the hub saw none of the events published meanwhile. Each
// case restarts twice. Either sign that nothing is left to copy is enough: a restart
// at once after the history copied (the consumer's own state, written lazily, may
// still count events), and one after an idle longer than the history keeps its copies
// (the history holds none). An event published after the last start reaches the
// history, once, and the worker gets every event.
func TestEmbeddedNATS_ARestartGivesTheHistoryNewSourceConsumers(t *testing.T) {
	for _, c := range []struct {
		name   string
		idle   time.Duration
		maxAge time.Duration
	}{
		{"at once after the history copied", 0, 0},
		{"after an idle moment", time.Second, 0},
		{"after an idle longer than the history keeps events", 0, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "store")
			ctx := testCtx(t)
			tp := Topic{Tenant: "acme", Table: "t"}
			open := func() *EmbeddedNATS {
				return openEmbedded(t, dir, func(o *EmbeddedOptions) { o.Topology.HistoryMaxAge = c.maxAge })
			}
			e := open()
			require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
			want := 0
			for restart := 1; restart <= 2; restart++ {
				require.NoError(t, e.Publish(ctx, tp, []byte("event")))
				want++
				// The history copied it (or, with a short max age, copied and perhaps
				// dropped it already).
				require.Eventually(t, func() bool {
					return c.maxAge > 0 || replayCount(t, e, tp) == want
				}, time.Minute, 20*time.Millisecond, "restart %d: the history never copied the event", restart)
				old := sourceConsumers(t, e, dir)
				require.Len(t, old, e.topo.Partitions, "before restart %d: one source consumer per partition", restart)
				if c.maxAge > 0 {
					// Its copies expired: the consumer's state, written within 100 ms
					// of a change, says it delivered everything long since.
					require.Eventually(t, func() bool { return replayCount(t, e, tp) == 0 }, time.Minute, 20*time.Millisecond,
						"restart %d: the history's copies never expired", restart)
				}
				time.Sleep(c.idle)
				require.NoError(t, e.Close())
				e = open()
				current := sourceConsumers(t, e, dir)
				require.Len(t, current, e.topo.Partitions, "restart %d: one source consumer per partition", restart)
				for name, created := range current {
					assert.NotEqual(t, old[name], created, "restart %d: %s is the one recovered, not one made by the start", restart, name)
				}
			}
			if c.maxAge == 0 {
				require.NoError(t, e.Publish(ctx, tp, []byte("after")))
				want++
				require.Eventually(t, func() bool { return replayCount(t, e, tp) == want }, time.Minute, 20*time.Millisecond,
					"an event published after the start never reached the history")
				assert.Equal(t, want, replayCount(t, e, tp), "each event in the history once")
			}
			assert.Len(t, drain(t, e, want), want, "the worker gets every event")
		})
	}
}

// ackWhileDetached closes e and, with a plain nats-server on its detached store,
// publishes n events to subject on partition and has the durable acknowledge every
// event it holds there: they stay in the partition for the history's recovered
// source consumer alone, which has them left to copy. It returns that consumer's name
// and creation time. The server deletes a source consumer nobody listens to after 10 s
// (nats-server's sourceHealthCheckInterval), so this must not take longer.
func ackWhileDetached(t *testing.T, e *EmbeddedNATS, dir, subject, partition string, n int) (string, time.Time) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, e.Close())
	require.NoError(t, e.detachHistory(dir))
	srv := runServer(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	_, js := connectUpstream(t, srv)
	for range n {
		_, err := js.Publish(ctx, subject, []byte("while detached"))
		require.NoError(t, err)
	}
	cons, err := js.Consumer(ctx, partition, e.topo.IngestConsumer)
	require.NoError(t, err)
	for cons.CachedInfo().NumPending+uint64(cons.CachedInfo().NumAckPending) > 0 {
		batch, err := cons.Fetch(n, jetstream.FetchPriorityGroup(e.topo.IngestGroup), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.NoError(t, m.DoubleAck(ctx))
		}
		require.NoError(t, batch.Error())
		_, err = cons.Info(ctx)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, mustStream(t, js, partition).CachedInfo().State.Msgs, uint64(n),
		"the partition keeps the acknowledged events for the history's source consumer")
	found, err := historySourceConsumers(ctx, js, dir, partition, e.topo.HistoryStream)
	require.NoError(t, err)
	for name, ci := range found {
		// At least: its state is written lazily, and may still count events it
		// delivered before.
		require.GreaterOrEqual(t, ci.NumPending, uint64(n), "the events the history's source consumer has left to copy")
		return name, ci.Created
	}
	t.Fatalf("no source consumer on %s", partition)
	return "", time.Time{}
}

// assertKeptAndCopied checks, after the start that follows ackWhileDetached, that the
// source consumer with events left to copy was kept and the history got every event
// of topic.
func assertKeptAndCopied(t *testing.T, e *EmbeddedNATS, dir, partition, name string, created time.Time, tp Topic, want int) {
	t.Helper()
	assert.Equal(t, created, sourceConsumers(t, e, dir)[partition+"/"+name], "the source consumer with events left to copy was replaced")
	assert.Eventually(t, func() bool { return replayCount(t, e, tp) == want }, time.Minute, 50*time.Millisecond,
		"the history never got the events the worker acknowledged while it had no sources")
}

// A recovered source consumer with events left to copy is kept: the events the worker
// acknowledged are held in the partition by its interest alone, and deleting it would
// have removed them before the history copied them. The history gets every event.
func TestEmbeddedNATS_ARestartKeepsASourceConsumerWithEventsLeftToCopy(t *testing.T) {
	t.Parallel() // most of it waits for the server's retry of the kept consumer
	dir := filepath.Join(t.TempDir(), "store")
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	e := openEmbedded(t, dir)
	require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
	require.NoError(t, e.Publish(ctx, tp, []byte("before")))
	require.Eventually(t, func() bool { return replayCount(t, e, tp) == 1 }, 10*time.Second, 20*time.Millisecond)
	subject, p, err := e.core.subs.ingestTopic(tp)
	require.NoError(t, err)
	partition := e.topo.PartitionStream(p)
	const acked = 5
	name, created := ackWhileDetached(t, e, dir, subject, partition, acked)
	e = openEmbedded(t, dir)
	assertKeptAndCopied(t, e, dir, partition, name, created, tp, 1+acked)
}

// A partition removed and made again starts its sequences over, below the copies the
// history kept of the old one: those copies must not pass for copies of the new one's
// events. Four partitions, then two (the last two, drained, are removed), then four
// again; the new partition's events are acknowledged while the history has no
// sources, and the next start keeps its source consumer.
func TestEmbeddedNATS_ARestartKeepsTheSourceConsumerOfAPartitionMadeAgain(t *testing.T) {
	t.Parallel() // most of it waits for the server's retry of the kept consumer
	dir := filepath.Join(t.TempDir(), "store")
	ctx := testCtx(t)
	partitions := func(n int) func(*EmbeddedOptions) {
		return func(o *EmbeddedOptions) { o.Topology.Partitions = n }
	}
	e := openEmbedded(t, dir, partitions(4))
	var tp Topic
	for i := 0; tp.Tenant == ""; i++ {
		if id := TenantID(fmt.Sprintf("tenant-%d", i)); Partition(id, 4) == 3 {
			tp = Topic{Tenant: id, Table: "t"}
		}
	}
	require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
	const old = 6
	for range old {
		require.NoError(t, e.Publish(ctx, tp, []byte("old")))
	}
	require.Len(t, drain(t, e, old), old)
	require.Eventually(t, func() bool { return replayCount(t, e, tp) == old }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		s, err := e.js.Stream(ctx, e.topo.PartitionStream(3))
		return err == nil && s.CachedInfo().State.Msgs == 0
	}, time.Minute, 20*time.Millisecond, "the old partition never emptied")
	require.NoError(t, e.Close())
	e = openEmbedded(t, dir, partitions(2))
	require.NoError(t, e.Close())
	e = openEmbedded(t, dir, partitions(4))
	subject, p, err := e.core.subs.ingestTopic(tp)
	require.NoError(t, err)
	require.Equal(t, 3, p)
	partition := e.topo.PartitionStream(p)
	const acked = 2 // fewer than the old partition's: its copies' sequences are higher
	name, created := ackWhileDetached(t, e, dir, subject, partition, acked)
	e = openEmbedded(t, dir, partitions(4))
	assertKeptAndCopied(t, e, dir, partition, name, created, tp, old+acked)
}

// A broker that listens keeps its recovered source consumers: until the history
// attaches, nothing else would hold the events it has not copied, and a worker outside
// the process may acknowledge them. The history resumes from them when the server sets
// them up again, and gets every event.
func TestEmbeddedNATS_AListeningBrokersRestartKeepsItsSourceConsumers(t *testing.T) {
	t.Parallel() // most of it waits for the server's retry of the kept consumers
	dir := filepath.Join(t.TempDir(), "store")
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	listen := func(o *EmbeddedOptions) { o.ListenAddr = "127.0.0.1:0" }
	e := openEmbedded(t, dir, listen)
	require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
	require.NoError(t, e.Publish(ctx, tp, []byte("before")))
	require.Eventually(t, func() bool { return replayCount(t, e, tp) == 1 }, 10*time.Second, 20*time.Millisecond)
	old := sourceConsumers(t, e, dir)
	require.Len(t, old, e.topo.Partitions)
	require.NoError(t, e.Close())
	e = openEmbedded(t, dir, listen)
	assert.Equal(t, old, sourceConsumers(t, e, dir), "a listening broker's start replaced its source consumers")
	require.NoError(t, e.Publish(ctx, tp, []byte("after")))
	assert.Eventually(t, func() bool { return replayCount(t, e, tp) == 2 }, time.Minute, 50*time.Millisecond,
		"an event published after the start never reached the history")
}

// Close waits for the history to store its copies of a burst. The history queues what
// its source consumer pushes and ran thousands of events behind (6.5k of this 20k
// burst stored at the Close, measured); a push is the source consumer's
// acknowledgement, so the partition drops an event once the worker acknowledged it
// too, and a shutdown drops the history's queue: the hub and replays would never see
// such an event. The store the Close left is read with a plain nats-server, the
// history detached so nothing copies meanwhile: the history holds every event. The
// next start then finds nothing left to copy and makes the source consumers anew.
// The burst is published asynchronously with nats.go, faster than the history copies.
func TestEmbeddedNATS_CloseWaitsForTheHistoryToStoreABurstsCopies(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "store")
	ctx := testCtx(t)
	e := openEmbedded(t, dir)
	tp := Topic{Tenant: "acme", Table: "t"}
	subject, _, err := e.core.subs.ingestTopic(tp)
	require.NoError(t, err)
	nc, err := nats.Connect("", nats.InProcessServer(e.srv))
	require.NoError(t, err)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	require.NoError(t, err)
	const n = 20_000
	for range n {
		_, err := js.PublishAsync(subject, []byte("burst"))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the burst was never confirmed")
	}
	nc.Close()
	old := sourceConsumers(t, e, dir)
	require.Len(t, old, e.topo.Partitions)
	require.NoError(t, e.Close())

	require.NoError(t, e.detachHistory(dir))
	srv := runServer(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	_, upstream := connectUpstream(t, srv)
	assert.Equal(t, uint64(n), mustStream(t, upstream, e.topo.HistoryStream).CachedInfo().State.Msgs,
		"the history's copies in the store the Close left")
	srv.Shutdown()
	srv.WaitForShutdown()

	e = openEmbedded(t, dir)
	for name, created := range sourceConsumers(t, e, dir) {
		assert.NotEqual(t, old[name], created, "%s is the one recovered, not one made by the start", name)
	}
	assert.Equal(t, n, replayCount(t, e, tp), "a replay after the start")
}

// A Close after PurgeAcked took the copy of the partition's last event (PurgeAcked
// trims each tenant on its own) finds nothing left to copy all the same: the history's
// source caught up, every event pushed, the history still. It does not wait out its
// bound and warn of events lost. One partition: globex's events, then acme's, all
// acknowledged; acme's copies purged, globex's older ones kept.
func TestEmbeddedNATS_ACloseAfterPurgeAckedTookTheLastCopyFindsNothingLeftToCopy(t *testing.T) {
	var logs syncBuffer
	e := openEmbedded(t, "", func(o *EmbeddedOptions) {
		o.Topology.Partitions = 1
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx := testCtx(t)
	acme, globex := Topic{Tenant: "acme", Table: "t"}, Topic{Tenant: "globex", Table: "t"}
	for _, tp := range []Topic{globex, acme} {
		require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
		require.NoError(t, e.Publish(ctx, tp, []byte("event")))
	}
	require.Len(t, drain(t, e, 2), 2)
	require.Eventually(t, func() bool { return replayCount(t, e, acme) == 1 && replayCount(t, e, globex) == 1 },
		30*time.Second, 10*time.Millisecond)
	purged, err := e.PurgeAcked(ctx, WorkerDurable, map[TenantID]time.Time{globex.Tenant: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.True(t, purged)
	require.Zero(t, replayCount(t, e, acme), "acme's copies purged")
	require.Equal(t, 1, replayCount(t, e, globex), "globex's copy kept")
	require.NoError(t, e.Close())
	assert.NotContains(t, logs.String(), "closing before the history stored", "Close waited out its bound")
}
