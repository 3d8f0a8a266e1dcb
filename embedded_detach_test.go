//go:build integration

package mq

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_TheServerRecoversTheStoreWithTheHistoryDetachedAndTheStartAttachesIt:
// after detachHistory a plain nats-server recovers the store with a history that has
// no sources, so it attaches no partition during the recovery, and keeps every event
// of the history and of the partitions (the checksum it checks matches). The next
// start attaches every partition before it returns: a replay has every event once,
// and an event published after it reaches the history once.
func TestEmbeddedNATS_TheServerRecoversTheStoreWithTheHistoryDetachedAndTheStartAttachesIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	require.NoError(t, e.SetMaxBytes(ctx, tp.Tenant, 1<<20))
	const n = 20
	for range n {
		require.NoError(t, e.Publish(ctx, tp, []byte("event")))
	}
	require.Eventually(t, func() bool { return replayCount(t, e, tp) == n }, 10*time.Second, 20*time.Millisecond, "the history never held every event")
	history, partition := e.topo.HistoryStream, e.topo.PartitionStream(Partition(tp.Tenant, e.topo.Partitions))
	require.NoError(t, e.Close())
	require.NoError(t, e.detachHistory(dir))

	srv := runServer(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	_, js := connectUpstream(t, srv)
	h := mustStream(t, js, history).CachedInfo()
	assert.Empty(t, h.Config.Sources, "the server recovered the history with its sources")
	assert.Equal(t, uint64(n), h.State.Msgs, "the history's events after the server's recovery")
	assert.Equal(t, uint64(n), mustStream(t, js, partition).CachedInfo().State.Msgs, "the partition's unacknowledged events")
	srv.Shutdown()
	srv.WaitForShutdown()

	e = openEmbedded(t, dir)
	missing, _, err := e.unattachedSources(ctx)
	require.NoError(t, err)
	assert.Empty(t, missing, "NewEmbedded returned before the history attached every partition")
	assert.Equal(t, n, replayCount(t, e, tp), "a replay after the start")
	require.NoError(t, e.Publish(ctx, tp, []byte("after")))
	// The history's copies resume 10 to 20 s after a start, with or without the detach
	// (measured; the README's durability section says so).
	assert.Eventually(t, func() bool { return replayCount(t, e, tp) == n+1 }, time.Minute, 50*time.Millisecond,
		"an event published after the start never reached the history")
	assert.Len(t, drain(t, e, n+1), n+1, "the worker gets every event")
	assert.Equal(t, n+1, replayCount(t, e, tp), "each event in the history once")
}

// A crash inside detachHistory leaves a configuration the server accepts: between its
// two renames (only the new checksum left) the next start finishes it; before them
// (both new files left) the old pair stands. Either way the start detaches the history.
func TestDetachHistory_FinishesOrDropsWhatACrashLeft(t *testing.T) {
	for _, c := range []struct {
		name     string
		renamed  bool // the new configuration replaced the old one before the crash
		newFiles []string
	}{
		{"crash between the renames", true, []string{storeMetaSum}},
		{"crash before the renames", false, []string{storeMetaFile, storeMetaSum}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			e := openEmbedded(t, dir)
			require.NoError(t, e.Close())
			sdir := filepath.Join(dir, "jetstream", "$G", "streams", e.topo.HistoryStream)
			meta, sum := filepath.Join(sdir, storeMetaFile), filepath.Join(sdir, storeMetaSum)
			old, err := os.ReadFile(meta)
			require.NoError(t, err)
			require.NoError(t, e.detachHistory(dir)) // the detached pair, to stage as a crash left it
			detached, err := os.ReadFile(meta)
			require.NoError(t, err)
			detachedSum, err := os.ReadFile(sum)
			require.NoError(t, err)
			oldSum, err := storeChecksum(e.topo.HistoryStream, old)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(sum, []byte(oldSum), 0o600))
			if !c.renamed {
				require.NoError(t, os.WriteFile(meta, old, 0o600))
			}
			for _, f := range c.newFiles {
				data := detached
				if f == storeMetaSum {
					data = detachedSum
				}
				require.NoError(t, os.WriteFile(filepath.Join(sdir, f+storeMetaPending), data, 0o600))
			}

			require.NoError(t, e.detachHistory(dir))
			got, err := os.ReadFile(meta)
			require.NoError(t, err)
			gotSum, err := os.ReadFile(sum)
			require.NoError(t, err)
			want, err := storeChecksum(e.topo.HistoryStream, got)
			require.NoError(t, err)
			assert.Equal(t, want, string(gotSum), "the checksum does not match the configuration: the server would skip the history")
			assert.NotContains(t, string(got), `"sources"`, "the history still has its sources")
			for _, f := range []string{storeMetaFile, storeMetaSum} {
				assert.NoFileExists(t, filepath.Join(sdir, f+storeMetaPending))
			}
			reopened := openEmbedded(t, dir)
			missing, _, err := reopened.unattachedSources(testCtx(t))
			require.NoError(t, err)
			assert.Empty(t, missing, "the start after the crash did not attach every partition")
		})
	}
}
