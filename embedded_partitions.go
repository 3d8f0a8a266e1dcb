package mq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// checkPartitions compares the partitions a store holds with the topology's count. A
// tenant's partition is its hash modulo N, so a changed N strands the events on a
// partition beyond the new count (no worker pulls it) and splits a tenant's events
// across two partitions (consumed side by side, out of order). Both are refused while
// any partition holds an event; once every one is empty the change is safe, and the
// partitions beyond the new count are removed.
func (e *EmbeddedNATS) checkPartitions(ctx context.Context) error {
	held := map[string]uint64{}
	var beyond []string
	prefix := strings.TrimSuffix(e.topo.PartitionStream(0), "0")
	changed := false
	names := e.js.StreamNames(ctx)
	for name := range names.Name() {
		suffix, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		p, err := strconv.Atoi(suffix)
		if err != nil || p < 0 || e.topo.PartitionStream(p) != name {
			continue
		}
		s, err := e.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		info := s.CachedInfo()
		if info.State.Msgs > 0 {
			held[name] = info.State.Msgs
		}
		if p >= e.topo.Partitions {
			beyond = append(beyond, name)
			changed = true
		} else if n, ok := info.Config.Metadata[metaPartitions]; ok && n != strconv.Itoa(e.topo.Partitions) {
			changed = true
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return fmt.Errorf("list streams: %w", err)
	}
	if !changed {
		return nil
	}
	if len(held) > 0 {
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(held)) {
			parts = append(parts, fmt.Sprintf("%s holds %d", name, held[name]))
		}
		return fmt.Errorf("%w: the store holds partitions of another count than Partitions %d, and events on them (%s): "+
			"open it with its count until a worker drained them and the history copied them, then change it", ErrInvalidConfig, e.topo.Partitions, strings.Join(parts, ", "))
	}
	for _, name := range beyond {
		if err := e.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("remove empty partition %s beyond Partitions %d: %w", name, e.topo.Partitions, err)
		}
		e.log.Info("mq: removed an empty partition beyond the topology's count", "stream", name, "partitions", e.topo.Partitions)
	}
	return nil
}
