package mq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// checkPartitions compares the partitions a store holds with the topology's count. A
// tenant's partition is its hash modulo N, so events written under another count would
// be stranded on a partition beyond the new one (no worker pulls it) or split a tenant
// across two partitions (consumed side by side, out of order). Each partition records
// the count it was written under; one holding events under another count than N is
// refused. Empty partitions beyond N are removed, with their record of acknowledged
// events, whatever the others hold: an earlier version left them behind when the count
// went down.
func (e *EmbeddedNATS) checkPartitions(ctx context.Context) (removed []int, err error) {
	var refused []string
	beyond := map[string]int{}
	want := strconv.Itoa(e.topo.Partitions)
	// One listing with every stream's state, not a request per partition.
	streams := e.js.ListStreams(ctx)
	for info := range streams.Info() {
		name := info.Config.Name
		p, ok := e.topo.partitionOfStream(name)
		if !ok {
			continue
		}
		written, known := info.Config.Metadata[metaPartitions]
		switch {
		case info.State.Msgs > 0 && (p >= e.topo.Partitions || known && written != want):
			refused = append(refused, fmt.Sprintf("%s holds %d written under %s partitions", name, info.State.Msgs, cmp.Or(written, "more")))
		case p >= e.topo.Partitions:
			beyond[name] = p
		}
	}
	if err := streams.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return nil, fmt.Errorf("%w: Partitions %d, but the store holds events written under another count (%s): "+
			"open it with that count until a worker drained them and the history copied them, then change it",
			ErrInvalidConfig, e.topo.Partitions, strings.Join(refused, ", "))
	}
	for name, p := range beyond {
		if err := e.retire(ctx, name, p); err != nil {
			return removed, err
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// retire removes the empty partition p beyond the count. A client of the listener
// still using the old count could publish into it after it was found empty, so it
// first stops taking its subjects, then is looked at again: one that took an event
// meanwhile gets its subjects back and is refused as any partition holding events.
func (e *EmbeddedNATS) retire(ctx context.Context, name string, p int) error {
	s, err := e.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	retired := cfg
	retired.Subjects = []string{e.topo.Prefix + ".retired." + strconv.Itoa(p)}
	if _, err := e.js.UpdateStream(ctx, retired); err != nil {
		return fmt.Errorf("retire empty partition %s beyond Partitions %d: %w", name, e.topo.Partitions, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	if n := info.State.Msgs; n > 0 {
		if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %s took %d events while being retired, and its subjects could not be restored: %w", name, n, err)
		}
		return fmt.Errorf("%w: Partitions %d, but %s took %d events meanwhile: open the store with its count until a worker drained them",
			ErrInvalidConfig, e.topo.Partitions, name, n)
	}
	if err := e.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("remove empty partition %s beyond Partitions %d: %w", name, e.topo.Partitions, err)
	}
	e.log.Info("mq: removed an empty partition beyond the topology's count", "stream", name, "partitions", e.topo.Partitions)
	return nil
}

// forgetPartitions drops the records of acknowledged events of the partitions
// checkPartitions removed: one recreated later starts again from sequence 1, and the
// old record would count its new events as acknowledged.
func (e *EmbeddedNATS) forgetPartitions(ctx context.Context, removed []int) error {
	for _, p := range removed {
		if err := e.kv.Delete(ctx, ackedKey(p)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("budget bucket %s: %s: %w", e.budgetBucket(), ackedKey(p), err)
		}
	}
	return nil
}
