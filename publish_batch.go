package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// A batch goes one of two ways (measured in BenchmarkPublishBatch, see the README's
// Throughput):
//   - pipelined: every event is sent at once with PublishAsync and its own message id,
//     then every confirmation is awaited. Each event is stored on its own.
//   - atomic: JetStream's atomic batch publish (ADR-50, nats-server 2.12 and later)
//     through orbit.go's jetstreamext, on partitions with allow_atomic set. The server
//     stores every event of the batch or none.
//
// JetStream's fast-ingest batch (allow_batched, 2.14 and later) was measured against
// the pipelined form and not chosen: see the README's Throughput.

// MaxAtomicBatch is the most events an atomic batch holds on the NATS brokers:
// nats-server's default limit (streamDefaultMaxAtomicBatchSize). A larger one wraps
// ErrPayloadTooLarge before anything is sent; a server configured lower refuses a
// batch above its own limit, mapped the same way.
const MaxAtomicBatch = 1000

// The server's error codes for an atomic batch.
const (
	jsErrAtomicDisabled   = 10174 // the stream has no allow_atomic
	jsErrAtomicIncomplete = 10176 // a message of the batch never arrived
	jsErrAtomicTooLarge   = 10199
	jsErrAtomicDuplicate  = 10201 // a message id of the batch is already stored
)

// outBatch is a batch ready to send: its events for the tenant's partition, and the
// batch's producer span, whose context every event's headers carry.
type outBatch struct {
	part   int
	atomic bool
	events []outgoing
	span   *operation
}

// stored is what the stream said about one event of a batch.
type stored struct {
	seq uint64
	dup bool // already stored before (its message id was known)
	err error
}

// prepareBatch checks every event of b and builds it; nothing is sent. An empty
// batch gives no events and no span.
func (c *natsCore) prepareBatch(ctx context.Context, b Batch) (outBatch, error) {
	if err := c.checkOpen(); err != nil {
		return outBatch{}, err
	}
	if ctx == nil {
		return outBatch{}, errNilContext("publish batch")
	}
	// The tenant first: a host's bug that leaves it unset is refused even while its
	// batches come empty.
	if err := b.Tenant.Validate(); err != nil {
		return outBatch{}, fmt.Errorf("publish batch: %w: tenant: %w", ErrInvalidTopic, err)
	}
	if len(b.Events) == 0 {
		return outBatch{}, nil
	}
	if b.Atomic && len(b.Events) > MaxAtomicBatch {
		return outBatch{}, fmt.Errorf("%w: publish batch: %d events, an atomic batch holds at most %d",
			ErrPayloadTooLarge, len(b.Events), MaxAtomicBatch)
	}
	// Topics first: an invalid one is refused before a send begins, with no span, as
	// Publish refuses it.
	subjects := make([]string, len(b.Events))
	for i, e := range b.Events {
		subject, _, err := c.subs.ingestTopic(Topic{Tenant: b.Tenant, Table: e.Table, Scope: e.Scope})
		if err != nil {
			return outBatch{}, fmt.Errorf("publish batch: event %d: %w", i, err)
		}
		subjects[i] = subject
	}
	part := Partition(b.Tenant, c.topo.Partitions)
	ctx, span := c.startSend(ctx, opPublish, toIngest, part, b.Tenant, len(b.Events))
	span.SetAttributes(semconv.MessagingBatchMessageCount(len(b.Events)))
	out := outBatch{part: part, atomic: b.Atomic, events: make([]outgoing, len(b.Events)), span: span}
	for i, e := range b.Events {
		var err error
		out.events[i], err = c.prepare(ctx, string(b.Tenant), subjects[i], c.partitions[part], nil, e.Data, e.Options)
		if err != nil {
			err = fmt.Errorf("publish batch: event %d: %w", i, err)
			span.end(err)
			return outBatch{}, err
		}
	}
	if !b.Atomic {
		return out, nil
	}
	if i, size := c.atomicOverflow(out.events); i >= 0 {
		err := fmt.Errorf("publish batch: event %d: %w: %s: %d bytes with headers, the atomic batch's included, the server accepts %d",
			i, ErrPayloadTooLarge, out.events[i].subject, size, c.nc.MaxPayload())
		span.end(err)
		return outBatch{}, err
	}
	return out, nil
}

// atomicOverflow returns the first of events the server would refuse as too large
// once sent as one atomic batch, with its size then; i is -1 when every event fits.
func (c *natsCore) atomicOverflow(events []outgoing) (i, size int) {
	limit := c.nc.MaxPayload()
	for i, ev := range events {
		if size := ev.wire + atomicHeaders(i, len(events)); int64(size) > limit {
			return i, size
		}
	}
	return -1, 0
}

// atomicHeaders is what jetstreamext's PublishMsgBatch adds to the header block of
// the i-th of n events: the batch's id (a nuid), the event's sequence in the batch
// from 1, and on the last event the commit ("1"); each a "name: value\r\n" line.
func atomicHeaders(i, n int) int {
	const line = len(": \r\n")
	size := len(jetstreamext.BatchIDHeader) + line + batchIDLen + len(jetstreamext.BatchSeqHeader) + line + digits(i+1)
	if i == n-1 {
		size += len(jetstreamext.BatchCommitHeader) + line + len("1")
	}
	return size
}

// batchIDLen is the length of an atomic batch's id, a nuid.
var batchIDLen = len(nuid.Next())

// digits is the length of n >= 0 in decimal.
func digits(n int) int {
	d := 1
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// sendBatch sends b and reports each event's outcome, in b's order.
func (c *natsCore) sendBatch(ctx context.Context, b outBatch) []stored {
	if b.atomic {
		results, fallBack := c.sendAtomic(ctx, b)
		if !fallBack {
			return results
		}
		// A message id of the batch is already stored: an earlier attempt (ours, or
		// the caller's retry) stored the batch, or a key was reused. Event by event,
		// each stored one is found a duplicate and the rest is stored.
	}
	if c.chunkBatches {
		return c.sendChunked(ctx, b)
	}
	return c.sendPipelined(ctx, b.events)
}

// sendChunked sends a batch that need not be atomic as atomic chunks of at most
// MaxAtomicBatch events: with an fsync per write the server syncs once per atomic
// batch rather than once per event (measured at 100 events: 14.7k events/s atomic
// against 4.0k pipelined). A chunk refused whole (an id already stored, a limit) goes
// again pipelined, event by event, so each event gets its own outcome as the contract
// promises; the message ids keep every event stored once. A chunk smaller than
// minAtomicChunk, or with an event too large for an atomic batch, is pipelined from
// the start.
func (c *natsCore) sendChunked(ctx context.Context, b outBatch) []stored {
	results := make([]stored, len(b.events))
	for lo := 0; lo < len(b.events); lo += MaxAtomicBatch {
		chunk := b
		chunk.atomic, chunk.events = true, b.events[lo:min(lo+MaxAtomicBatch, len(b.events))]
		// A chunk with an event that has no room for the batch's headers (one near
		// the max payload) would be refused: it is pipelined from the start.
		if i, _ := c.atomicOverflow(chunk.events); len(chunk.events) < minAtomicChunk || i >= 0 {
			copy(results[lo:], c.sendPipelined(ctx, chunk.events))
			continue
		}
		res, fallBack := c.sendAtomic(ctx, chunk)
		if fallBack || refusedWhole(res) {
			res = c.sendPipelined(ctx, chunk.events)
		}
		copy(results[lo:], res)
	}
	return results
}

// refusedWhole reports whether an atomic chunk failed for something its events may
// not share (a limit, a size): sent one by one, some may be stored. A chunk that went
// unanswered or found the broker closed is not sent again: its retries are spent,
// and its callers have waited long enough. A chunk refused for the server's open
// batches, ErrUnavailable too, is sent again: one by one it takes no batch slot.
func refusedWhole(results []stored) bool {
	err := batchError(results)
	return err != nil && (tooManyBatches(err) || !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrClosed) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded))
}

// tooManyBatches reports whether the server refused err's batch for holding too many
// open batches.
func tooManyBatches(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jsErrAtomicTooManyInflight || apiErr.ErrorCode == jsErrBatchTooManyInflight)
}

// minAtomicChunk is the smallest chunk sendChunked sends atomic. A single-server
// stream stages each atomic batch in a file store of its own, created and removed per
// batch: measured under fsync, an atomic batch costs about 2.2 ms plus 45 µs an event,
// and a pipelined event about 280 µs, so from about 10 events on the atomic chunk is
// faster; 12 leaves a margin.
const minAtomicChunk = 12

// sendAtomic sends b as one atomic batch. Its events are stored one after another,
// so the last one's sequence gives every sequence. A lost answer sends the batch
// again, with a new batch id and the same message ids; fallBack reports that the
// server refused the batch for a message id it already stores.
func (c *natsCore) sendAtomic(ctx context.Context, b outBatch) (results []stored, fallBack bool) {
	fail := func(err error) []stored {
		results := make([]stored, len(b.events))
		for i := range results {
			results[i].err = err
		}
		return results
	}
	var lastErr error
	for attempt := 0; attempt <= publishRetries; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, publishRetryWait); err != nil {
				return fail(fmt.Errorf("publish batch: %w (after %v)", err, lastErr)), false
			}
		}
		msgs := make([]*nats.Msg, len(b.events))
		for i, ev := range b.events {
			h := nats.Header(cloneHeaders(ev.header))
			h.Set(jetstream.MsgIDHeader, ev.header.Get(HeaderIdempotencyKey))
			h.Set(jetstream.ExpectedStreamHeader, ev.stream)
			msgs[i] = &nats.Msg{Subject: ev.subject, Data: ev.data, Header: h}
		}
		actx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
		ack, err := jetstreamext.PublishMsgBatch(actx, c.js, msgs,
			jetstreamext.BatchFlowControl{AckFirst: true, AckTimeout: c.topo.PublishTimeout})
		cancel()
		if err == nil {
			results := make([]stored, len(b.events))
			first := ack.Sequence - uint64(len(b.events)) + 1
			for i := range results {
				results[i].seq = first + uint64(i)
			}
			return results, false
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fail(fmt.Errorf("publish batch: %w", ctxErr)), false
		}
		var apiErr *jetstream.APIError
		code := 0
		if errors.As(err, &apiErr) {
			code = int(apiErr.ErrorCode)
		}
		if code == jsErrAtomicDuplicate {
			return nil, true
		}
		lastErr = err
		if retry := noAnswer(err) || code == jsErrAtomicIncomplete; !retry || c.nc.IsClosed() {
			break
		}
	}
	return fail(c.mapBatchError(b, lastErr)), false
}

// mapBatchError maps an atomic batch's failure as mapPublishError maps one event's,
// plus what only a batch is refused for. The client refusing an event over the max
// payload is not expected (prepareBatch and sendChunked check atomicOverflow first),
// but it is mapped all the same.
func (c *natsCore) mapBatchError(b outBatch, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsErrAtomicDisabled:
			c.lostTopology(b.events[0].stream, err)
			return fmt.Errorf("%w: stream %s does not allow atomic batches (allow_atomic): %w", ErrTopology, b.events[0].stream, err)
		case jsErrAtomicTooLarge:
			return fmt.Errorf("%w: stream %s refused an atomic batch of %d events: %w", ErrPayloadTooLarge, b.events[0].stream, len(b.events), err)
		}
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: an event of an atomic batch of %d to stream %s: %w", ErrPayloadTooLarge, len(b.events), b.events[0].stream, err)
	}
	return c.mapPublishError(b.events[0], err)
}

// sendPipelined sends every event at once and awaits each confirmation, bounded by
// PublishTimeout after the last send. The events whose answer was lost are sent
// again with their message ids, at most publishRetries times, so each is stored once.
func (c *natsCore) sendPipelined(ctx context.Context, events []outgoing) []stored {
	results := make([]stored, len(events))
	todo := make([]int, len(events))
	for i := range todo {
		todo[i] = i
	}
	stall := jetstream.WithStallWait(c.topo.PublishTimeout)
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, publishRetryWait); err != nil {
				for _, i := range todo {
					results[i].err = fmt.Errorf("publish %s: %w (after %v)", events[i].subject, err, results[i].err)
				}
				return results
			}
		}
		futures := make([]jetstream.PubAckFuture, len(todo))
		for k, i := range todo {
			// A caller that gave up gets nothing more sent: PublishMsgAsync takes no
			// ctx, and an event sent after the reservation was let go with its error
			// would be stored uncounted by the budget.
			if err := ctx.Err(); err != nil {
				results[i].err = err
				continue
			}
			ev := events[i]
			// As in send: the headers hold the message id and the expected stream, so
			// nothing is copied per event or attempt.
			msg := &nats.Msg{Subject: ev.subject, Data: ev.data, Header: nats.Header(ev.header)}
			futures[k], results[i].err = c.asyncJS().PublishMsgAsync(msg, stall, noRetries)
		}
		timeout := time.NewTimer(c.topo.PublishTimeout)
		var again []int
		for k, i := range todo {
			if f := futures[k]; f != nil {
				results[i].seq, results[i].dup, results[i].err = await(ctx, f, timeout.C)
			}
			switch err := results[i].err; {
			case err == nil:
			case ctx.Err() != nil:
				results[i].err = fmt.Errorf("publish %s: %w", events[i].subject, ctx.Err())
			case noAnswer(err) && !c.nc.IsClosed() && attempt < publishRetries:
				again = append(again, i)
			default:
				results[i].err = c.mapPublishError(events[i], err)
			}
		}
		timeout.Stop()
		todo = again
	}
	return results
}

// asyncJS is the JetStream context of pipelined batches. Its own, because its
// window and its timeout apply to every async publish made through it: a future whose
// answer never comes is dropped after PublishTimeout instead of holding the window.
func (c *natsCore) asyncJS() jetstream.JetStream {
	c.asyncOnce.Do(func() {
		js, err := jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(asyncWindow),
			jetstream.WithPublishAsyncTimeout(c.topo.PublishTimeout))
		if err != nil { // only for options it refuses, which these are not
			js = c.js
		}
		c.async = js
	})
	return c.async
}

// asyncWindow bounds the events a process has sent in pipelined batches and not yet
// seen confirmed; a batch larger than the room left waits for room.
const asyncWindow = 4096

// await waits for f's answer, for ctx, or for timeout, whichever comes first. A
// timeout reads as a lost answer, nats.ErrTimeout.
func await(ctx context.Context, f jetstream.PubAckFuture, timeout <-chan time.Time) (seq uint64, dup bool, err error) {
	select {
	case ack := <-f.Ok():
		return ack.Sequence, ack.Duplicate, nil
	case err := <-f.Err():
		return 0, false, err
	case <-ctx.Done():
		return 0, false, ctx.Err()
	case <-timeout:
		return 0, false, nats.ErrTimeout
	}
}

// batchError is the *BatchError of results, or nil when every event is stored.
func batchError(results []stored) error {
	var be *BatchError
	for i, r := range results {
		if r.err == nil {
			continue
		}
		if be == nil {
			be = &BatchError{Err: r.err}
		}
		be.Failed = append(be.Failed, i)
	}
	if be == nil {
		return nil
	}
	return be
}
