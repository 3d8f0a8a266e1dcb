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
// nothing is left to copy: the history holds a copy of the partition's last event, or
// the consumer says it delivered everything. Either alone misses common restarts: the
// consumer's state is written lazily, and after a Close under traffic it still counted
// events the history had copied (seen in a test); the history's copies expire with its
// max age, and after an idle quarter of an hour it holds none. One with events left
// to copy is kept: those the worker acknowledged already are held in the partition by
// its interest alone, and deleting it would remove them before the history copied
// them. The history then resumes from it after the server's retry, seconds later,
// with nothing lost.

// sourceConsumerPrefix starts the name of every consumer a stream's source makes
// (nats-server's trySetupSourceConsumer, v2.15.3). Only the history sources the
// partitions.
const sourceConsumerPrefix = "JS_SRC_"

// dropIdleSourceConsumers deletes, on every partition, the source consumers the server
// recovered from dir for a detached history that have nothing left to copy. It does
// nothing when the history has sources already (a new store's first boot, an
// encrypted store the detach leaves alone): those consumers are in use. A consumer it
// cannot read or delete is left, and only costs the wait it would have cost anyway.
func (e *EmbeddedNATS) dropIdleSourceConsumers(ctx context.Context, dir string) {
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
			if !copied {
				cons, err := e.js.PushConsumer(ctx, stream, name) // a source consumer pushes
				if err != nil {
					e.log.Debug("mq: cannot read a recovered source consumer", "stream", stream, "consumer", name, "error", err)
					continue
				}
				if left := cons.CachedInfo().NumPending; left > 0 {
					e.log.Info("mq: the history resumes a partition from its recovered source consumer, seconds after the start: it has events left to copy",
						"stream", stream, "consumer", name, "left", left)
					continue
				}
			}
			if err := e.js.DeleteConsumer(ctx, stream, name); err != nil {
				e.log.Debug("mq: cannot delete a recovered source consumer", "stream", stream, "consumer", name, "error", err)
			}
		}
	}
}

// historyHoldsLastOf reports whether history holds a copy of partition p's last event,
// or p never held one.
func (e *EmbeddedNATS) historyHoldsLastOf(ctx context.Context, history jetstream.Stream, p int) bool {
	stream := e.topo.PartitionStream(p)
	part, err := e.js.Stream(ctx, stream)
	if err != nil {
		return false
	}
	last := part.CachedInfo().State.LastSeq
	if last == 0 {
		return true
	}
	m, err := history.GetLastMsgForSubject(ctx, e.core.subs.partitionFilter(p))
	if err != nil {
		return false
	}
	seq, ok := sourceSeq(m.Header.Get(streamSourceHeader), stream)
	return ok && seq >= last
}
