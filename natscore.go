package mq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
)

// natsCore is the JetStream data path both NATS brokers share, over the topology of
// NATSTopology: publishing to the tenant's partition with the expected stream and
// idempotent retries, the hub, bounded replay, the worker's pull per partition, and
// dead letters. The brokers differ in who owns the topology and in budgets.
type natsCore struct {
	topo NATSTopology
	subs subjects
	nc   *nats.Conn
	js   jetstream.JetStream
	log  *slog.Logger
	// tracer makes the producer, consumer and replay spans (see tracing.go), and
	// metrics records the operations they cover (see metrics.go).
	tracer  trace.Tracer
	metrics *instruments
	starts  sendStarts
	// chunkBatches sends the batches that need not be atomic as atomic chunks
	// (sendChunked): EmbeddedNATS sets it when it fsyncs every write.
	chunkBatches bool
	// consumersDenied is the server's latest refusal of the consumer list to this
	// user (see listConsumers).
	consumersDenied atomic.Pointer[refusal]

	// partitions[p] and deadLetters name the streams found for partition p and for
	// dead letters: the topology's names in EmbeddedNATS, the operator's in ExternalNATS.
	partitions  []string
	deadLetters string

	// settler wraps each message the worker receives, so a broker can observe its
	// settlement (EmbeddedNATS releases the tenant's budget on ack).
	// ref is where the worker read m (partition -1 when its metadata did not parse),
	// so the message's metadata is parsed once per delivery. into is storage the
	// caller owns for a settler of EmbeddedNATS's (the worker's delivery entry), so
	// wrapping allocates nothing.
	settler func(m jetstream.Msg, ref eventRef, into *budgetSettler) Settler
	// ackedHere, when set, reports whether the event at ref is known acknowledged:
	// EmbeddedNATS's budgets hear of every ack made in this process.
	ackedHere func(ref eventRef) bool
	// lostTopology is told when a publish finds its stream gone or its subject held
	// by another stream.
	lostTopology func(stream string, err error)

	// replies are the reply subjects synchronous publishes wait on; request is one
	// attempt of such a publish (send), requestOnSlot.
	replies replySlots
	request func(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error)

	// returning is what EmbeddedNATS found pending on the ingest durable at open.
	returning returning

	// async is the JetStream context of pipelined batches (asyncJS).
	asyncOnce sync.Once
	async     jetstream.JetStream

	closed   atomic.Bool
	mu       sync.Mutex
	nextID   int
	stoppers map[int]func()
	// parts are the running deliveries Health answers for.
	parts map[*part]struct{}
	// workers are the running Consumes the worker view reads (gauges.go).
	workers map[*dispatcher]struct{}
}

func newNATSCore(topo NATSTopology, nc *nats.Conn, js jetstream.JetStream, log *slog.Logger, tracer trace.Tracer, metrics *instruments) *natsCore {
	c := &natsCore{
		topo: topo, subs: topo.subjects(), nc: nc, js: js, log: log, tracer: tracer, metrics: metrics,
		deadLetters:  topo.DeadLetterStream(),
		settler:      func(m jetstream.Msg, _ eventRef, _ *budgetSettler) Settler { return m },
		lostTopology: func(string, error) {},
		stoppers:     make(map[int]func()),
		parts:        make(map[*part]struct{}),
		replies:      replySlots{nc: nc},
	}
	c.request = c.requestOnSlot
	for p := range topo.Partitions {
		c.partitions = append(c.partitions, topo.PartitionStream(p))
	}
	return c
}

// track registers stop to run at Close. It reports false once the broker is closing.
func (c *natsCore) track(stop func()) (id int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return 0, false
	}
	c.nextID++
	c.stoppers[c.nextID] = stop
	return c.nextID, true
}

func (c *natsCore) untrack(id int) {
	c.mu.Lock()
	delete(c.stoppers, id)
	c.mu.Unlock()
}

// stopAll marks the broker closed and stops every consumer and subscription, so none
// reports failed when the connection goes. It reports false if it already ran.
func (c *natsCore) stopAll() bool {
	c.mu.Lock()
	if c.closed.Swap(true) {
		c.mu.Unlock()
		return false
	}
	stoppers := c.stoppers
	c.stoppers = nil
	c.mu.Unlock()
	for _, stop := range stoppers {
		stop()
	}
	return true
}

func (c *natsCore) checkOpen() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// errHandlerPanicked marks the error handle makes of a panic, which it has logged.
var errHandlerPanicked = errors.New("panicked")

// handle runs handler on msg and turns a panic into the handler's error: a poison
// event that panics would otherwise end the process, and, redelivered, every worker
// that takes it next. The panic is logged with its topic and stack, at error level:
// it is a bug in the handler. path names the caller ("worker", "hub").
func (c *natsCore) handle(path string, handler Handler, msg *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("mq: handler panicked; treated as its error", "path", path, "topic", msg.key,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("%s handler on %s: %w: %v", path, msg.key, errHandlerPanicked, r)
		}
	}()
	return handler(msg)
}

// mapRequestError wraps a failed JetStream API request: ErrClosed after Close,
// ErrUnavailable when no answer came or the connection is gone.
func (c *natsCore) mapRequestError(what string, err error) error {
	switch {
	case c.closed.Load():
		return fmt.Errorf("%s: %w: %w", what, ErrClosed, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", what, err)
	case noAnswer(err), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
