package mq

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Creating the topology at a start and waiting for the history to attach its sources.

// createStream creates cfg's stream or updates it in place. The in-process server
// refusing it (an API error, not a lost request) means the options ask for what it
// cannot hold, such as partitions larger than the store may reserve, or for a change
// it does not allow to a stream the store holds: ErrInvalidConfig, with its reason.
func (e *EmbeddedNATS) createStream(ctx context.Context, cfg jetstream.StreamConfig) error {
	_, err := e.js.CreateOrUpdateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &apiErr) && apiErr.Code == http.StatusServiceUnavailable: // JetStream not ready yet
		return fmt.Errorf("%w: stream %s: %w", ErrUnavailable, cfg.Name, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("%w: stream %s: %w", ErrInvalidConfig, cfg.Name, err)
	}
	return fmt.Errorf("stream %s: %w", cfg.Name, err)
}

// boot creates the topology and restores what the store holds.
func (e *EmbeddedNATS) boot(ctx context.Context) error {
	removed, err := e.checkPartitions(ctx)
	if err != nil {
		return err
	}
	for p := range e.topo.Partitions {
		cfg := e.topo.partitionConfig(p)
		if err := e.createStream(ctx, cfg); err != nil {
			return err
		}
		// The durable comes before any publish: an interest stream stores a publish
		// nowhere when no consumer's filter covers it. An existing one is updated in
		// place, keeping its ack floor and pending events: that is how a store an
		// earlier version wrote, whose durable has no priority policy, gets pinned.
		if _, err := e.js.CreateOrUpdateConsumer(ctx, cfg.Name, e.topo.ingestConsumerConfig(p)); err != nil {
			return fmt.Errorf("consumer %s/%s: %w", cfg.Name, e.topo.IngestConsumer, err)
		}
		if err := e.migrateIngestConsumer(ctx, cfg.Name); err != nil {
			return err
		}
	}
	e.dropIdleSourceConsumers(ctx)
	for _, cfg := range []jetstream.StreamConfig{e.topo.historyConfig(), e.topo.deadLetterConfig()} {
		if err := e.createStream(ctx, cfg); err != nil {
			return err
		}
	}
	kv, err := e.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      e.budgetBucket(),
		Description: "per-tenant byte budgets of the embedded mq broker",
		History:     1,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("budget bucket %s: %w", e.budgetBucket(), err)
	}
	e.kv = kv
	if err := e.forgetPartitions(ctx, removed); err != nil {
		return err
	}
	if err := e.watchBudgets(ctx); err != nil {
		return err
	}
	e.doubtful = make([][]uint64, e.topo.Partitions)
	for p := range e.topo.Partitions {
		if err := e.rebuildBacklog(ctx, p); err != nil {
			return err
		}
	}
	e.doubtfulEnd, e.doubtfulDone = make(chan struct{}), make(chan struct{})
	go e.releaseDoubtful()
	e.awaitSources(ctx)
	return nil
}

// awaitSources waits, bounded by sourceAttachWait, until the history has attached
// every partition: an event a worker acknowledges on a partition the history has no
// source consumer on yet (a new store, more partitions) is removed before the history
// copies it, and the hub and ReplaySince never see it.
// The boot sets the history's sources once every partition exists (the start detaches
// them, embedded_detach.go), and the server attaches them at once. A source it misses
// is tried again only about 12 s later (a 2 s throttle plus a 10 s backoff): when the
// server attached the sources itself during its recovery, it missed a partition
// restored after the history about once in 130 starts of a loaded conformance run,
// and attached it 8.9 to 11.4 s into this wait (measured, 3 starts). The bound
// outlasts such a retry, and the wait says why the start is slow. Attached means the
// source consumer exists; the copies resume at once when the boot could delete the
// recovered one first (embedded_stale_sources.go), 10 or 20 s later when it kept it.
func (e *EmbeddedNATS) awaitSources(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, sourceAttachWait)
	defer cancel()
	began := time.Now()
	warned := false
	var missing []string // as last read
	var cause error      // the server's, or the read's
	for {
		m, c, err := e.unattachedSources(ctx)
		switch {
		case err != nil:
			cause = err
		case len(m) == 0:
			if warned {
				e.log.Info("mq: the history attached every partition", "stream", e.topo.HistoryStream,
					"after", time.Since(began).Round(time.Millisecond))
			}
			return
		default:
			missing, cause = m, c
		}
		if !warned && time.Since(began) > sourceAttachSlow {
			warned = true
			e.log.Warn("mq: the history has not attached every partition yet; the start waits for the server to try again",
				"stream", e.topo.HistoryStream, "partitions", missing, "error", cause)
		}
		if sleepCtx(ctx, 20*time.Millisecond) != nil {
			e.log.Error("mq: the history has not attached every partition; events acknowledged before it does may never reach the hub or a replay",
				"stream", e.topo.HistoryStream, "partitions", missing, "error", cause,
				"waited", time.Since(began).Round(time.Millisecond))
			return
		}
	}
}

// unattachedSources returns the partitions the history has not attached, and the
// server's error for the first of them that has one.
func (e *EmbeddedNATS) unattachedSources(ctx context.Context) (missing []string, cause error, err error) {
	stream, err := e.js.Stream(ctx, e.topo.HistoryStream)
	if err != nil {
		return nil, nil, err
	}
	attached := map[string]bool{}
	for _, src := range stream.CachedInfo().Sources {
		if src.Active >= 0 {
			attached[src.Name] = true
		} else if cause == nil && src.Error != nil {
			cause = src.Error
		}
	}
	for p := range e.topo.Partitions {
		if name := e.topo.PartitionStream(p); !attached[name] {
			missing = append(missing, name)
		}
	}
	return missing, cause, nil
}
