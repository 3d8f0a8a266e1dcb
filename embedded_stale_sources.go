package mq

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Dropping the source consumers a restart recovered, so the history copies at once.
//
// Each partition keeps the history's source consumer (JS_SRC_<hash>) in the store, and
// the server recovers it with the partition. When the boot gives the history its
// sources back (embedded_detach.go), the server updates that recovered consumer in place
// rather than making a new one, and the updated consumer sends nothing, not even its
// heartbeats, until the history's health check gives up on it and sets it up again:
// 10 or 20 s after the start (measured, nats-server v2.15.3, every idle restart). For
// that time the hub and ReplaySince saw none of the events published after the start.
// A consumer made anew delivers at once.
//
// So the boot deletes a recovered source consumer before the history attaches, when
// nothing is left to copy: the history holds a copy of the partition's last event,
// made since the partition was created (a partition removed and made again starts its
// sequences over, below the old one's copies), or the consumer says it delivered
// everything. Either alone misses common restarts: the consumer's state is written
// lazily, and after a Close at once it still counted an event the history had copied
// (seen in a test); the history's copies expire with its max age, and after an idle
// longer than that it holds none. One with events left to copy is kept: the events
// the worker acknowledged already are held in the partition by its interest alone,
// and deleting it would remove them before the history copied them. The history then
// resumes from it when the server sets it up again, 10 or 20 s later, with nothing
// lost: after a crash, or a Close, while the history was behind.
//
// A broker that listens is left as it was: until the history attaches, nothing would
// hold those events for it, and a worker outside the process may acknowledge them.

// sourceConsumerPrefix starts the name of every consumer a stream's source makes, and
// sourceStreamKey names the sourcing stream in its metadata (nats-server's
// trySetupSourceConsumer, v2.15.3).
const (
	sourceConsumerPrefix = "JS_SRC_"
	sourceStreamKey      = "_nats.src.stream"
)

// dropIdleSourceConsumers deletes, on every partition, the history's source consumers
// the server recovered from dir that have nothing left to copy. It does nothing when
// the history has sources already (a new store's first boot, an encrypted store the
// detach leaves alone): those consumers are in use. A consumer it cannot read or
// delete is left, and only costs the wait it would have cost anyway.
func (e *EmbeddedNATS) dropIdleSourceConsumers(ctx context.Context, dir string) {
	if e.listening {
		return
	}
	history, err := e.js.Stream(ctx, e.topo.HistoryStream)
	if err != nil || len(history.CachedInfo().Config.Sources) > 0 {
		return // no history yet (a new store), or attached during the recovery
	}
	for p := range e.topo.Partitions {
		stream := e.topo.PartitionStream(p)
		entries, err := os.ReadDir(filepath.Join(storeStreamDir(dir, stream), storeConsumersDir))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				e.log.Debug("mq: cannot list a partition's stored consumers", "stream", stream, "error", err)
			}
			continue
		}
		copied := e.historyHoldsLastOf(ctx, history, p)
		for _, entry := range entries {
			name := entry.Name()
			if !entry.IsDir() || !strings.HasPrefix(name, sourceConsumerPrefix) {
				continue
			}
			cons, err := e.js.PushConsumer(ctx, stream, name) // a source consumer pushes
			if err != nil {
				e.log.Debug("mq: cannot read a recovered source consumer", "stream", stream, "consumer", name, "error", err)
				continue
			}
			info := cons.CachedInfo()
			if info.Config.Metadata[sourceStreamKey] != e.topo.HistoryStream {
				continue // another stream's, made through a listening broker: not the history's to judge
			}
			if left := info.NumPending; left > 0 && !copied {
				e.log.Info("mq: the history resumes a partition from its recovered source consumer, 10 to 20 s after the start: it has events left to copy",
					"stream", stream, "consumer", name, "left", left)
				continue
			}
			if err := e.js.DeleteConsumer(ctx, stream, name); err != nil {
				e.log.Debug("mq: cannot delete a recovered source consumer", "stream", stream, "consumer", name, "error", err)
			}
		}
	}
}

// historyHoldsLastOf reports whether history holds a copy of partition p's last event,
// made since p was created, or p never held one.
func (e *EmbeddedNATS) historyHoldsLastOf(ctx context.Context, history jetstream.Stream, p int) bool {
	stream := e.topo.PartitionStream(p)
	part, err := e.js.Stream(ctx, stream)
	if err != nil {
		return false
	}
	info := part.CachedInfo()
	last := info.State.LastSeq
	if last == 0 {
		return true
	}
	m, err := history.GetLastMsgForSubject(ctx, e.core.subs.partitionFilter(p))
	if err != nil || m.Time.Before(info.Created) {
		return false
	}
	seq, ok := sourceSeq(m.Header.Get(streamSourceHeader), stream)
	return ok && seq >= last
}
