package mq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
)

// message builds the Message for a delivered JetStream message.
func (c *natsCore) message(ctx context.Context, m jetstream.Msg, settler Settler) *Message {
	meta, _ := parseDelivery(m.Reply()) // without it, the zero values: not known
	return c.delivered(ctx, m, meta, settler)
}

// delivered builds the Message of m from its metadata, already parsed.
func (c *natsCore) delivered(ctx context.Context, m jetstream.Msg, meta delivery, settler Settler) *Message {
	msg := new(Message)
	c.deliveredInto(msg, ctx, m, meta, settler)
	return msg
}

// deliveredInto is delivered into a Message the caller allocated (the worker keeps it
// in the delivery's entry, one allocation fewer per delivery).
func (c *natsCore) deliveredInto(msg *Message, ctx context.Context, m jetstream.Msg, meta delivery, settler Settler) {
	key := c.subs.keyOrSubject(m.Subject())
	tenant, _, _ := strings.Cut(key, ".") // a key's first token is its tenant
	if ctx == nil {
		ctx = context.Background()
	}
	*msg = Message{Ctx: ctx, Data: m.Data(), key: key, Timestamp: meta.timestamp, Headers: userHeaders(m.Headers()),
		ID:      eventIDOr(m.Headers().Get(HeaderEventID), TenantID(tenant), m.Headers().Get(HeaderIdempotencyKey)),
		Attempt: int(meta.numDelivered), Sequence: meta.streamSeq, settler: settler}
}

// subscribe runs the hub: an ordered, ack-less consumer on the history from the next
// event on, one per call, so every process sees every event. name is what Health and
// the log call it.
func (c *natsCore) subscribe(ctx context.Context, name string, handler Handler) error {
	if ctx == nil {
		return errNilContext("subscribe")
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if handler == nil {
		return fmt.Errorf("subscribe: %w: nil handler", ErrInvalidConfig)
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
	h := c.newHubHealth(ctx, name, cons, &stopped)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if stopped.Load() {
			return
		}
		msg := c.message(ctx, m, nil)
		msg.Ctx = otel.GetTextMapPropagator().Extract(ctx, headerCarrier(msg.Headers))
		returned := false
		defer func() {
			if !returned {
				h.exited(msg.key)
			}
		}()
		err := c.handle("hub", handler, msg)
		returned = true
		if err != nil && !errors.Is(err, errHandlerPanicked) { // a panic is logged already
			c.log.Warn("mq: hub handler failed; the hub has no redelivery", "topic", msg.key, "error", err)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { h.reported(err) }))
	if err != nil {
		h.forget()
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	h.consuming.Store(&cc)
	done := make(chan struct{})
	stop := sync.OnceFunc(func() {
		stopped.Store(true) // no handler call starts after this
		h.forget()
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

// hubWatchPoll is how often an interrupted hub looks whether its consumer was made
// again.
const hubWatchPoll = 250 * time.Millisecond

// hubHealth is what Health knows of one hub. The ordered consumer recreates its
// consumer on the history after a missed heartbeat, a deleted consumer or no
// responders, retrying for good and reporting nothing more: the hub is interrupted
// from such a report until the consumer has a new name.
type hubHealth struct {
	c        *natsCore
	ctx      context.Context
	name     string
	cons     jetstream.Consumer
	stopped  *atomic.Bool
	part     *part
	forget   func()
	known    atomic.Pointer[string] // the consumer's name while it delivered
	watching atomic.Bool
	// consuming is the hub's delivery, once Consume returned it.
	consuming atomic.Pointer[jetstream.ConsumeContext]
}

// exited ends a hub whose handler ended nats.go's delivery goroutine (see
// errHandlerExited): nothing would deliver to it again, so its delivery stops, and
// Health says so, with ErrDeliveryEnded, until its ctx ends.
func (h *hubHealth) exited(topic string) {
	h.c.log.Error("mq: a hub handler ended its goroutine; the hub stopped delivering", "hub", h.name, "topic", topic,
		"error", errHandlerExited)
	h.part.fail(fmt.Errorf("%w: hub %q stopped: %w", ErrDeliveryEnded, h.name, errHandlerExited))
	h.stopped.Store(true)
	if cc := h.consuming.Load(); cc != nil {
		go (*cc).Stop() // not here: Stop waits for the delivery this goroutine is
	}
}

func (c *natsCore) newHubHealth(ctx context.Context, name string, cons jetstream.Consumer, stopped *atomic.Bool) *hubHealth {
	h := &hubHealth{c: c, ctx: ctx, name: name, cons: cons, stopped: stopped}
	h.part, h.forget = c.addPart(fmt.Sprintf("hub %q", name))
	if info := cons.CachedInfo(); info != nil {
		h.known.Store(&info.Name)
	}
	return h
}

// reported hears the ordered consumer's errors. It runs under the consumer's lock.
func (h *hubHealth) reported(err error) {
	if h.stopped.Load() {
		return
	}
	resets := errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, nats.ErrNoResponders)
	if errors.Is(err, nats.ErrConnectionClosed) {
		h.c.log.Warn("mq: hub stopped: the connection closed", "hub", h.name, "error", err)
		h.part.fail(fmt.Errorf("%w: hub %q stopped: %w", ErrDeliveryEnded, h.name, err))
		return
	}
	if !resets {
		h.c.log.Debug("mq: hub consumer reported", "hub", h.name, "error", err)
		return
	}
	if h.part.fault.Load() == nil {
		h.c.log.Warn("mq: hub stopped delivering; it recreates its consumer on the history", "hub", h.name,
			"stream", h.c.topo.HistoryStream, "error", err)
	}
	h.part.fail(fmt.Errorf("%w: hub %q stopped delivering: %w", ErrUnavailable, h.name, err))
	if h.watching.CompareAndSwap(false, true) {
		go h.watch()
	}
}

// watch waits until the ordered consumer has a consumer other than the one that was
// interrupted, then clears the fault. It ends with the hub.
func (h *hubHealth) watch() {
	for !h.stopped.Load() {
		// CachedInfo waits while the consumer is being made again.
		if info := h.cons.CachedInfo(); info != nil {
			if known := h.known.Load(); known == nil || *known != info.Name {
				h.known.Store(&info.Name)
				// A report from here on starts a watch of its own.
				h.watching.Store(false)
				h.part.heal()
				h.c.log.Info("mq: hub delivers again", "hub", h.name)
				return
			}
		}
		if sleepCtx(h.ctx, hubWatchPoll) != nil {
			break
		}
	}
	h.watching.Store(false)
}
