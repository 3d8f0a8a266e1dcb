//go:build integration

package mq

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sourceConsumers is each partition's source consumers in the store under dir: name
// and creation time.
func sourceConsumers(t *testing.T, e *EmbeddedNATS, dir string) map[string]time.Time {
	t.Helper()
	ctx := testCtx(t)
	got := map[string]time.Time{}
	for p := range e.topo.Partitions {
		stream := e.topo.PartitionStream(p)
		entries, err := os.ReadDir(filepath.Join(storeStreamDir(dir, stream), storeConsumersDir))
		require.NoError(t, err)
		for _, entry := range entries {
			if !strings.HasPrefix(entry.Name(), sourceConsumerPrefix) {
				continue
			}
			c, err := e.js.PushConsumer(ctx, stream, entry.Name())
			require.NoError(t, err, "source consumer %s on %s", entry.Name(), stream)
			got[stream+"/"+entry.Name()] = c.CachedInfo().Created
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
// (the history holds none). After each start an event published reaches the history,
// once, and the worker gets every event.
func TestEmbeddedNATS_ARestartGivesTheHistoryNewSourceConsumers(t *testing.T) {
	for _, c := range []struct {
		name   string
		idle   time.Duration
		maxAge time.Duration
	}{
		{"at once after the history copied", 0, 0},
		{"after an idle moment", time.Second, 0},
		{"after an idle longer than the history keeps events", 2 * time.Second, time.Second},
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

// A recovered source consumer with events left to copy is kept: the events the worker
// acknowledged are held in the partition by its interest alone, and deleting it would
// have removed them before the history copied them. Made here with a plain nats-server
// on the detached store: events published and acknowledged by the durable while the
// history has no sources. The next start keeps the consumer, and the history gets
// every event.
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
	old := sourceConsumers(t, e, dir)
	require.Len(t, old, e.topo.Partitions)
	require.NoError(t, e.Close())
	require.NoError(t, e.detachHistory(dir))

	const acked = 5
	srv := runServer(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	_, js := connectUpstream(t, srv)
	for range acked {
		_, err := js.Publish(ctx, subject, []byte("while detached"))
		require.NoError(t, err)
	}
	cons, err := js.Consumer(ctx, partition, e.topo.IngestConsumer)
	require.NoError(t, err)
	got := 0
	for got < acked+1 { // the event from before, unacknowledged, and the new ones
		batch, err := cons.Fetch(acked+1, jetstream.FetchPriorityGroup(e.topo.IngestGroup), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.NoError(t, m.DoubleAck(ctx))
			got++
		}
		require.NoError(t, batch.Error())
	}
	for name := range old {
		if stream, cons, _ := strings.Cut(name, "/"); stream == partition {
			src, err := js.PushConsumer(ctx, stream, cons)
			require.NoError(t, err)
			// At least: its state is written lazily, and may still count the event from
			// before, copied already.
			require.GreaterOrEqual(t, src.CachedInfo().NumPending, uint64(acked), "the events the history's source consumer has left to copy")
		}
	}
	require.GreaterOrEqual(t, mustStream(t, js, partition).CachedInfo().State.Msgs, uint64(acked),
		"the partition keeps the acknowledged events for the history's source consumer")
	srv.Shutdown()
	srv.WaitForShutdown()

	e = openEmbedded(t, dir)
	kept := sourceConsumers(t, e, dir)
	for name, created := range old {
		if strings.HasPrefix(name, partition+"/") {
			assert.Equal(t, created, kept[name], "the source consumer with events left to copy was replaced")
		}
	}
	assert.Eventually(t, func() bool { return replayCount(t, e, tp) == 1+acked }, time.Minute, 50*time.Millisecond,
		"the history never got the events the worker acknowledged while it had no sources")
}
