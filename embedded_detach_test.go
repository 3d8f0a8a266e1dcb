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
	t.Parallel() // most of it waits for the history's copies to resume
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
	// The plain server's own start left the source consumers' state as it was: the
	// boot may keep one, and the history then resumes seconds later.
	assert.Eventually(t, func() bool { return replayCount(t, e, tp) == n+1 }, time.Minute, 50*time.Millisecond,
		"an event published after the start never reached the history")
	assert.Len(t, drain(t, e, n+1), n+1, "the worker gets every event")
	assert.Equal(t, n+1, replayCount(t, e, tp), "each event in the history once")
}

// A crash inside detachHistory leaves a configuration the server accepts. Between its
// two renames (only the new checksum left) the next start finishes it; before them
// (both new files, or only the new configuration, left) the old pair stands; a new
// checksum that is not the configuration's (the store opened by something else since)
// is dropped. Each store then starts with every partition attached.
func TestDetachHistory_FinishesOrDropsWhatACrashLeft(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		renamed   bool     // the new configuration replaced the old one before the crash
		left      []string // the new files left behind
		staleSum  bool     // the new checksum left is not the detached configuration's
		wantFinal string   // "detached" or "old": the pair finishDetach leaves
	}{
		{"crash between the renames", true, []string{storeMetaSum}, false, "detached"},
		{"crash before the renames", false, []string{storeMetaFile, storeMetaSum}, false, "old"},
		{"crash while writing the new files", false, []string{storeMetaFile}, false, "old"},
		{"a new checksum of another configuration", false, []string{storeMetaSum}, true, "old"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			e := openEmbedded(t, dir)
			require.NoError(t, e.Close())
			history := e.topo.HistoryStream
			sdir := storeStreamDir(dir, history)
			meta, sum := filepath.Join(sdir, storeMetaFile), filepath.Join(sdir, storeMetaSum)
			read := func(path string) []byte {
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				return b
			}
			old, oldSum := read(meta), read(sum)
			require.NoError(t, e.detachHistory(dir)) // the detached pair, staged below as a crash left it
			detached, detachedSum := read(meta), read(sum)
			require.NotContains(t, string(detached), `"sources"`)
			pending := map[string][]byte{storeMetaFile: detached, storeMetaSum: detachedSum}
			if c.staleSum {
				pending[storeMetaSum] = []byte("0123456789abcdef")
			}
			require.NoError(t, os.WriteFile(sum, oldSum, 0o600))
			if !c.renamed {
				require.NoError(t, os.WriteFile(meta, old, 0o600))
			}
			for _, f := range c.left {
				require.NoError(t, os.WriteFile(filepath.Join(sdir, f+storeMetaPending), pending[f], 0o600))
			}

			require.NoError(t, finishDetach(history, meta, sum))
			want := map[string][2][]byte{"detached": {detached, detachedSum}, "old": {old, oldSum}}[c.wantFinal]
			assert.Equal(t, string(want[0]), string(read(meta)), "the configuration finishDetach left")
			assert.Equal(t, string(want[1]), string(read(sum)), "the checksum finishDetach left")
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
