package mq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// The worker's poison policy: a failed event is nak'ed with a delay that doubles with
// each attempt, and after MaxDeliveries the broker parks it on the dead-letter queue
// with the reason in its headers, then acknowledges it.

// maxDeadErrorLen caps HeaderDeadError: the handler's error is the host's text and may
// be long; the header is for an operator's first look.
const maxDeadErrorLen = 1024

// run makes one attempt at e and reports whether its lane must wait for e to come
// back: it failed and was nak'ed, or the handler nak'ed it.
func (d *dispatcher) run(e *entry, t *tries) (hold bool) {
	// The attempt's consumer span covers the handler and a park; Message.Ctx carries
	// it, still cancelled with the CreateConsumer ctx.
	span := &e.op
	ctx := d.core.startProcess(d.ctx, d.starts[e.part], e.msg, span, t.last)
	e.msg.Ctx = ctx
	// Until handle returns: a call that ends its goroutine leaves it so (see call).
	err := errHandlerExited
	defer func() { span.end(err) }()
	// An event delivered beyond MaxDeliveries that never failed here (its handler
	// returned without settling, the ack wait ran out, or a process died in it) is
	// still handed to the handler: only a failure proves it poison, and a host that
	// holds events for a batch must not find them parked. Message.Attempt tells the
	// handler how often it came.
	err = d.core.handle("worker", d.handler, e.msg)
	if err == nil {
		// An ack that failed leaves the event to come back by the ack wait, perhaps at
		// another worker: its tenant's next event must not start before it.
		return e.made(wasNaked) || (e.made(wasUnsent) && !e.made(wasAcked))
	}
	return d.fail(ctx, e, t, err)
}

// fail settles e after its handler call failed with err: nothing more when the
// handler acked it, held when it nak'ed it, parked on its last delivery allowed, else
// nak'ed for the retry delay. It reports whether e's tenant waits for e to come back.
func (d *dispatcher) fail(ctx context.Context, e *entry, t *tries, err error) (hold bool) {
	t.lastErr = err.Error()
	switch {
	case e.made(wasAcked):
		return false // the handler settled it and still failed: nothing to retry
	case e.made(wasNaked):
		return true
	case d.policy.maxDeliveries > 0 && e.attempt >= d.policy.maxDeliveries:
		return d.giveUp(ctx, e, t)
	}
	if err := e.m.NakWithDelay(d.retryDelay(e)); err != nil {
		d.core.log.Warn("mq: cannot nak a failed event; the ack wait redelivers it",
			"stream", d.core.partitions[e.part], "seq", e.seq, "error", err)
	}
	return true
}

// retryDelay is the wait after e's delivery failed: RetryDelay doubled per earlier
// attempt, at most MaxRetryDelay and never beyond the durable's ack wait, so a failed
// event is back before anything its tenant held behind it would be.
func (d *dispatcher) retryDelay(e *entry) time.Duration {
	delay, most := d.policy.retryDelay, d.policy.maxRetryDelay
	for i := 1; i < e.attempt && delay < most; i++ {
		// Capped before it doubles: a MaxRetryDelay near the largest duration (left
		// to the ack wait to bound) overflowed the doubling into a negative delay,
		// which nakked at once, a poison event redelivered in a hot loop.
		if delay > most/2 {
			delay = most
			break
		}
		delay *= 2
	}
	if e.ackWait > 0 {
		delay = min(delay, e.ackWait)
	}
	return delay
}

// giveUp parks e, with why, and acknowledges it. When the park fails the event
// is nak'ed for the longest retry delay and tried again then, so nothing is lost.
func (d *dispatcher) giveUp(attempt context.Context, e *entry, t *tries) (hold bool) {
	// The park's producer span is a child of the attempt's consumer span; the park
	// itself is bounded on its own, not by the consumer's ctx.
	ctx, cancel := context.WithTimeout(trace.ContextWithSpan(context.Background(), trace.SpanFromContext(attempt)),
		d.core.topo.PublishTimeout*(publishRetries+1))
	defer cancel()
	if err := d.core.deadLetter(ctx, e.msg, d.parkHeaders(e, t, DeadReasonHandlerFailed), t.lastErr); err != nil {
		msg := "mq: cannot park a poison event; it is retried"
		if errors.Is(err, ErrPayloadTooLarge) {
			// Publish kept room for the park (park_room.go), so the server's limits
			// changed since: no retry fits until an operator raises them or removes
			// the event. Kept rather than dropped, as every event that failed.
			msg = "mq: a poison event is too large to park even without its error text; " +
				"it is retried, holding its tenant, until the server's max payload (or the dead-letter stream's max message size) takes it"
		}
		d.core.log.Error(msg, "stream", d.core.partitions[e.part], "seq", e.seq, "attempt", e.attempt,
			"topic", e.msg.key, "error", err)
		_ = e.m.NakWithDelay(d.retryDelay(e))
		return true
	}
	d.core.log.Warn("mq: parked a poison event on the dead-letter queue", "stream", d.core.partitions[e.part],
		"seq", e.seq, "attempt", e.attempt, "topic", e.msg.key, "error", t.lastErr)
	if err := e.settler.Ack(); err != nil {
		// Parked but still pending: it comes back, and its park's idempotency key
		// keeps it from being parked twice within the duplicate window.
		d.core.log.Warn("mq: cannot acknowledge a parked event", "stream", d.core.partitions[e.part], "seq", e.seq, "error", err)
		return false
	}
	e.observe(settledAck, 0)
	return false
}

// parkHeaders are the options that say why (reason) e was parked, but for the
// handler's error, which park adds cut to what fits.
func (d *dispatcher) parkHeaders(e *entry, t *tries, reason string) []PublishOpt {
	first, last := t.first, t.last
	if first.IsZero() {
		first, last = time.Now(), time.Now()
	}
	return []PublishOpt{
		WithHeader(HeaderDeadReason, reason),
		WithHeader(HeaderDeadAttempts, strconv.Itoa(e.attempt)),
		WithHeader(HeaderDeadPartition, strconv.Itoa(e.part)),
		WithHeader(HeaderDeadSequence, strconv.FormatUint(e.seq, 10)),
		WithHeader(HeaderDeadFirstAttempt, first.UTC().Format(time.RFC3339Nano)),
		WithHeader(HeaderDeadLastAttempt, last.UTC().Format(time.RFC3339Nano)),
		// One park per event, even when the park or its ack is retried.
		WithIdempotencyKey(parkKey(e.part, e.seq, e.msg.ID)),
	}
}

// oneLine makes s a header value: control characters become spaces, it is cut to at
// most n bytes on a rune boundary, and blanks at either end go (NATS headers do not
// keep them, so the park would be refused: an error ending in a newline once left its
// event retried for ever).
func oneLine(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		cut := n
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return strings.Trim(s, " ")
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
