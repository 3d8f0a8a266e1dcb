package mq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Opening a store that an earlier mq wrote, when the ingest durable was named
// wh-ingest and sorted after the history's source consumers (see
// ingestConsumerSortsFirst). Such a store must not simply be started: the server
// would recover each partition's JS_SRC_* consumer first and remove every event the
// history had copied and the worker had not acknowledged, before this broker can act.

// prepareLegacyStore runs before the server starts. On every partition of dir that
// still holds the earlier durable it removes the history's source consumers from the
// store, so the server recovers the earlier durable alone and keeps everything it has
// not acknowledged; the history creates its source consumers again when it attaches,
// from the last event it copied. What this costs, and only on this one start: an
// event the worker had acknowledged and the history had not yet copied leaves the
// partition without reaching the history (the hub and replays miss it; the worker
// does not). A source consumer's directory is named after it; this is the layout of
// nats-server's file store for the in-process account ($G), read in v2.15.2.
func (e *EmbeddedNATS) prepareLegacyStore(dir string) error {
	for p := range e.topo.Partitions {
		obs := filepath.Join(storeStreamDir(dir, e.topo.PartitionStream(p)), "obs")
		if _, err := os.Stat(filepath.Join(obs, legacyIngestConsumer)); err != nil {
			continue // no earlier durable here (or no store yet)
		}
		entries, err := os.ReadDir(obs)
		if err != nil {
			return fmt.Errorf("embedded nats: store %s: %w", obs, err)
		}
		for _, entry := range entries {
			if !strings.HasPrefix(entry.Name(), "JS_SRC_") {
				continue
			}
			if err := os.RemoveAll(filepath.Join(obs, entry.Name())); err != nil {
				return fmt.Errorf("embedded nats: store %s: remove the history's source consumer %s: %w", obs, entry.Name(), err)
			}
			e.log.Info("mq: the store has the earlier ingest durable; removed the history's source consumer before the start, so the start keeps every unacknowledged event",
				"stream", e.topo.PartitionStream(p), "consumer", entry.Name(), "durable", legacyIngestConsumer)
		}
	}
	return nil
}

// migrateIngestConsumer removes the earlier durable (legacyIngestConsumer) once the
// current one exists: the current one starts from the partition's first event, so it
// holds everything the old one had not acknowledged before the old one lets go. Left
// in place, the old durable would hold every later event forever.
func (e *EmbeddedNATS) migrateIngestConsumer(ctx context.Context, stream string) error {
	err := e.js.DeleteConsumer(ctx, stream, legacyIngestConsumer)
	switch {
	case err == nil:
		e.log.Info("mq: removed the ingest durable of an earlier version; its unacknowledged events go to the current one",
			"stream", stream, "removed", legacyIngestConsumer, "current", e.topo.IngestConsumer)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	default:
		return fmt.Errorf("consumer %s/%s: remove the earlier version's durable: %w", stream, legacyIngestConsumer, err)
	}
	return nil
}
