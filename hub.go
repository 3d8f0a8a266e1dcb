package mq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
)

// message builds the Message for a delivered JetStream message.
func (c *natsCore) message(ctx context.Context, m jetstream.Msg, settler Settler) *Message {
	var ts time.Time
	var attempt int
	var seq uint64
	if meta, err := m.Metadata(); err == nil {
		ts, attempt, seq = meta.Timestamp, int(meta.NumDelivered), meta.Sequence.Stream
	}
	return c.delivered(ctx, m, ts, attempt, seq, settler)
}

// delivered builds the Message of m from its metadata, already parsed.
func (c *natsCore) delivered(ctx context.Context, m jetstream.Msg, ts time.Time, attempt int, seq uint64, settler Settler) *Message {
	key := c.subs.keyOrSubject(m.Subject())
	tenant, _, _ := strings.Cut(key, ".") // a key's first token is its tenant
	id := eventID(TenantID(tenant), m.Headers().Get(HeaderIdempotencyKey))
	return newKeyedMessage(ctx, key, m.Data(), WithTimestamp(ts), WithMessageHeaders(userHeaders(m.Headers())),
		WithDelivery(id, attempt, seq), WithSettler(settler))
}

// subscribe runs the hub: an ordered, ack-less consumer on the history from the next
// event on, one per call, so every process sees every event.
func (c *natsCore) subscribe(ctx context.Context, handler Handler) error {
	if ctx == nil {
		return errNilContext("subscribe")
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if handler == nil {
		return errors.New("subscribe: nil handler")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// From the sequence after the last one stored, not "new": an ordered consumer that
	// resets after a reconnect before its first event would start "new" again and skip
	// what was stored meanwhile.
	last, err := c.historyLastSeq(ctx)
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	cons, err := c.js.OrderedConsumer(ctx, c.topo.HistoryStream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{c.subs.ingestAll()},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       last + 1,
		InactiveThreshold: ephemeralInactive,
	})
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	var stopped atomic.Bool
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if stopped.Load() {
			return
		}
		msg := c.message(ctx, m, nil)
		msg.Ctx = otel.GetTextMapPropagator().Extract(ctx, headerCarrier(msg.Headers))
		if err := c.handle("hub", handler, msg); err != nil && !errors.Is(err, errHandlerPanicked) { // a panic is logged already
			c.log.Warn("mq: hub handler failed; the hub has no redelivery", "topic", msg.key, "error", err)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !stopped.Load() {
			c.log.Debug("mq: hub consumer reported", "error", err)
		}
	}))
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	done := make(chan struct{})
	stop := sync.OnceFunc(func() {
		stopped.Store(true) // no handler call starts after this
		// An ordered consumer's Stop waits for its lock, which a reset retry (history
		// unreachable) holds for up to ~20 s; Close must not wait for that. Once the
		// connection closes the retry fails at once and this returns.
		go cc.Stop()
		close(done)
	})
	id, ok := c.track(stop)
	if !ok {
		stop()
		return ErrClosed
	}
	go func() {
		select {
		case <-ctx.Done():
			stop()
			c.untrack(id)
		case <-done:
		}
	}()
	return nil
}
