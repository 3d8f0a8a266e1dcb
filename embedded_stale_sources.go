package mq

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

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
//
// Close helps the next start find nothing left: it waits up to closeCopyWait for the
// history to store its copies (awaitCopies).

// sourceConsumerPrefix starts the name of every consumer a stream's source makes, and
// sourceStreamKey names the sourcing stream in its metadata (nats-server's
// trySetupSourceConsumer, v2.15.3).
const (
	sourceConsumerPrefix = "JS_SRC_"
	sourceStreamKey      = "_nats.src.stream"
)

// dropIdleSourceConsumers deletes, on every partition, the history's source consumers
// the server recovered that have nothing left to copy. It does nothing when
// the history has sources already (a new store's first boot, an encrypted store the
// detach leaves alone): those consumers are in use. A consumer it cannot read or
// delete is left, and only costs the wait it would have cost anyway.
func (e *EmbeddedNATS) dropIdleSourceConsumers(ctx context.Context) {
	if e.listening {
		return
	}
	history, err := e.js.Stream(ctx, e.topo.HistoryStream)
	if err != nil || len(history.CachedInfo().Config.Sources) > 0 {
		return // no history yet (a new store), or attached during the recovery
	}
	for p := range e.topo.Partitions {
		stream := e.topo.PartitionStream(p)
		left, err := e.leftToCopy(ctx, history, p)
		if err != nil {
			e.log.Debug("mq: cannot tell what the history has left to copy of a partition", "stream", stream, "error", err)
			continue
		}
		for name, n := range left.consumers {
			if n > 0 && !left.copied {
				e.log.Info("mq: the history resumes a partition from its recovered source consumer, 10 to 20 s after the start: it has events left to copy",
					"stream", stream, "consumer", name, "left", n)
				continue
			}
			if err := e.js.DeleteConsumer(ctx, stream, name); err != nil {
				e.log.Debug("mq: cannot delete a recovered source consumer", "stream", stream, "consumer", name, "error", err)
			}
		}
	}
}

// copyState is what the history has left to copy of one partition.
type copyState struct {
	// copied: the history holds a copy of the partition's last event made since the
	// partition was created, or the partition never held one. False too when that copy
	// is gone (PurgeAcked, the history's max age).
	copied bool
	// consumers is the history's source consumers on the partition, each with the
	// events it says it has not delivered yet.
	consumers map[string]uint64
}

// delivered reports whether the source consumers say they delivered everything, or
// there is none to deliver anything (the history never attached the partition).
// Delivered is not stored: the history queues what its consumer pushes, and under load
// held thousands of events so (measured: 6.5k of a 20k burst); a push is the source
// consumer's acknowledgement, so the partition drops an event the worker acknowledged
// too, and a shutdown drops the history's queue.
func (c copyState) delivered() bool {
	for _, n := range c.consumers {
		if n > 0 {
			return false
		}
	}
	return true
}

// leftToCopy reads what history has left to copy of partition p.
func (e *EmbeddedNATS) leftToCopy(ctx context.Context, history jetstream.Stream, p int) (copyState, error) {
	stream := e.topo.PartitionStream(p)
	part, err := e.js.Stream(ctx, stream)
	if err != nil {
		return copyState{}, err
	}
	info := part.CachedInfo()
	state := copyState{copied: info.State.LastSeq == 0, consumers: map[string]uint64{}}
	if !state.copied {
		m, err := history.GetLastMsgForSubject(ctx, e.core.subs.partitionFilter(p))
		switch {
		case err == nil:
			seq, ok := sourceSeq(m.Header.Get(streamSourceHeader), stream)
			state.copied = ok && seq >= info.State.LastSeq && !m.Time.Before(info.Created)
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return copyState{}, err
		}
	}
	consumers, err := historySourceConsumers(ctx, e.js, e.storeDir, stream, e.topo.HistoryStream)
	if err != nil {
		return copyState{}, err
	}
	for name, ci := range consumers {
		state.consumers[name] = ci.NumPending
	}
	return state, nil
}

// historySourceConsumers returns the source consumers of the stream history on stream,
// as js reads them, found in the file store under dir: the server hides a source
// consumer from the consumer list. Another stream's, made through a listening broker,
// are left out.
func historySourceConsumers(ctx context.Context, js jetstream.JetStream, dir, stream, history string) (map[string]*jetstream.ConsumerInfo, error) {
	entries, err := os.ReadDir(filepath.Join(storeStreamDir(dir, stream), storeConsumersDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	found := map[string]*jetstream.ConsumerInfo{}
	for _, entry := range entries {
		name := entry.Name()
		if !entry.IsDir() || !strings.HasPrefix(name, sourceConsumerPrefix) {
			continue
		}
		cons, err := js.PushConsumer(ctx, stream, name) // a source consumer pushes
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue // its directory outlived it
		}
		if err != nil {
			return nil, err
		}
		if ci := cons.CachedInfo(); ci.Config.Metadata[sourceStreamKey] == history {
			found[name] = ci
		}
	}
	return found, nil
}

// closeCopyWait bounds how long Close waits for the history to store its copies.
const closeCopyWait = 5 * time.Second

// copySteadyRounds is how many rounds of awaitCopies (20 ms apart) the history must
// stay still to count as having stored what it was sent, where no copy of a
// partition's last event is left to compare with.
const copySteadyRounds = 5

// awaitCopies waits, bounded by closeCopyWait, until the history stored its copies of
// what every partition held. Under load the history runs behind (10-20k events a
// partition, see the README), and at the shutdown it loses what it had queued and not
// stored: once the worker acknowledged such an event, no partition keeps it either
// (see copyState.delivered), and the hub and replays never see it. What its source
// consumer had not pushed yet is kept, but the next start then keeps that consumer,
// and the hub waits 10 to 20 s. Close calls this after the last publish of this
// process: the history catches up at its own pace, without new events.
//
// A partition is done once the history holds a copy of its last event. When that copy
// is gone (PurgeAcked trims each tenant on its own, so the last event's copy may go
// while older ones stay; the history's max age), it is done once every event was
// pushed, the history's source for it shows no lag, and the history stays still for
// copySteadyRounds rounds. The stillness is the real test: the history stores its
// queue in one goroutine, and a queue left changes it within milliseconds unless that
// goroutine stalls for longer than the rounds. It returns at once when the
// connection is down.
func (e *EmbeddedNATS) awaitCopies() {
	if !e.nc.IsConnected() {
		return // a request would wait out the bound for an answer that cannot come
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeCopyWait)
	defer cancel()
	history, err := e.js.Stream(ctx, e.topo.HistoryStream)
	if err != nil {
		e.log.Debug("mq: cannot read the history before closing", "stream", e.topo.HistoryStream, "error", err)
		return
	}
	waiting := make([]int, e.topo.Partitions) // the partitions not done yet
	for p := range waiting {
		waiting[p] = p
	}
	var last uint64
	steady := -1 // the first round has nothing to compare with
	for {
		info, err := history.Info(ctx)
		if err != nil {
			e.stopAwaitingCopies(ctx, waiting, err)
			return
		}
		still := true // every partition left has all pushed and no lag
		left := make([]int, 0, len(waiting))
		for _, p := range waiting {
			stream := e.topo.PartitionStream(p)
			state, err := e.leftToCopy(ctx, history, p)
			switch {
			case err != nil && ctx.Err() != nil:
				e.stopAwaitingCopies(ctx, waiting, err)
				return
			case err != nil:
				e.log.Debug("mq: cannot tell what the history has left to copy of a partition; not waiting for it", "stream", stream, "error", err)
			case state.copied:
			default:
				left = append(left, p)
				still = still && state.delivered() && sourceLag(info, stream) == 0
			}
		}
		waiting = left
		if still && info.State.LastSeq == last {
			steady++
		} else {
			steady = 0
		}
		last = info.State.LastSeq
		if len(waiting) == 0 || steady >= copySteadyRounds {
			return
		}
		if sleepCtx(ctx, 20*time.Millisecond) != nil {
			e.stopAwaitingCopies(ctx, waiting, ctx.Err())
			return
		}
	}
}

// stopAwaitingCopies says why awaitCopies stops before the partitions waiting are
// done: at Warn when its bound ran out, else (the server did not answer as asked) at
// Debug.
func (e *EmbeddedNATS) stopAwaitingCopies(ctx context.Context, waiting []int, err error) {
	streams := make([]string, len(waiting))
	for i, p := range waiting {
		streams[i] = e.topo.PartitionStream(p)
	}
	if ctx.Err() == nil {
		e.log.Debug("mq: cannot tell what the history has left to copy; closing", "partitions", streams, "error", err)
		return
	}
	e.log.Warn("mq: closing before the history stored its copies: events it had queued and the worker acknowledged may never reach the hub or a replay, and the next start resumes the rest 10 to 20 s later",
		"partitions", streams, "waited", closeCopyWait)
}

// sourceLag is what the history's source for stream last saw still pending at its
// consumer, less the event in hand, or 0 when the history does not source stream.
func sourceLag(info *jetstream.StreamInfo, stream string) uint64 {
	for _, si := range info.Sources {
		if si != nil && si.Name == stream {
			return si.Lag
		}
	}
	return 0
}
