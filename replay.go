package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Replay bounds, and the lifetime of the ephemeral consumers replay and the hub create.
const (
	replayBatch           = 256
	replayPullWait        = 2 * time.Second
	ephemeralInactive     = time.Minute
	consumerDeleteTimeout = time.Second
	// jsErrClusterNotAvailCode is the server's "JetStream system temporarily
	// unavailable": a cluster between leaders.
	jsErrClusterNotAvailCode = 10008
)

// replay sends every event of topic in the history stored at or after since, up to
// what was stored when it began: the history's last sequence then bounds which events
// are sent, and the count the server reported for the replay's consumer bounds how
// many. It counts what it received against that bound, never what the server says is
// left: an ack-less consumer counts a batch lost in transit as delivered, so trusting
// it ends a replay early with nil. Whatever looks lost (a pull that brought nothing,
// a gap in the consumer's sequence, a pull left unanswered) is asked for again from
// the event after the last one sent; only a history that no longer holds it ends the
// replay short, because the event aged out.
//
// Each request is bounded by PublishTimeout, as each publish attempt is, and so is
// each wait for the next event: what fails for want of an answer is asked again
// within that bound, and a server that stays silent is ErrUnavailable then, not at
// the caller's deadline.
func (c *natsCore) replay(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) (err error) {
	if ctx == nil {
		return errNilContext("replay")
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if send == nil {
		return fmt.Errorf("replay: nil send: %w", ErrInvalidConfig)
	}
	subject, p, err := c.subs.ingestTopic(topic)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	// One span per call; the messages sent carry it, so a handler's spans nest in it.
	ctx, span := c.startReplay(ctx, topic, p)
	sent := 0
	defer func() {
		span.SetAttributes(semconv.MessagingBatchMessageCount(sent))
		span.messages = sent
		span.end(err)
	}()
	each := send
	send = func(m *Message) bool { sent++; return each(m) }
	if err := ctx.Err(); err != nil {
		return err
	}
	if afterAnyStored(since) {
		return nil // nothing is stored that late
	}
	// Close ends a replay as it stops a consumer: whatever request or wait it is in.
	// The messages sent carry the caller's own ctx, which outlives the replay.
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id, ok := c.track(cancel)
	if !ok {
		return fmt.Errorf("replay %s: %w", subject, ErrClosed)
	}
	defer c.untrack(id)
	r := &replayRun{c: c, ctx: ctx, caller: caller, subject: subject, since: since}
	err = r.run(send)
	if !errors.Is(err, ErrUnavailable) {
		// Deleting over a silent connection would only delay the error; the
		// consumer's inactive threshold removes it anyway.
		r.drop()
	}
	return err
}

// replayRun is one replay in progress.
type replayRun struct {
	c *natsCore
	// ctx is the caller's: its end is the caller's error, where the end of a bound
	// of the replay's own is ErrUnavailable.
	ctx context.Context
	// caller is the caller's ctx itself, which the messages sent carry.
	caller  context.Context
	subject string
	since   time.Time

	// last is the history's last sequence when the replay began: what comes after
	// it is the live tail, which the caller's subscription has.
	last uint64
	// owed bounds what is left to send: the count when the replay began less what
	// was received, and never more than a later count of what is still stored.
	owed uint64
	// sent is the stream sequence of the last event sent, 0 before the first.
	sent uint64

	// cons is the current consumer; delivered is the consumer sequence of the last
	// event received from it, which the next one must follow. retried says a pull
	// that found no responders was sent to it once more.
	cons      jetstream.Consumer
	delivered uint64
	retried   bool

	// reopen says the next pull asks again on a new consumer.
	reopen bool

	// deadline bounds the wait for the next event, from the end of the last batch
	// that brought one (a slow send does not count against it); stall is the last
	// reason the wait went on, for the error if it runs out.
	deadline time.Time
	stall    error
}

func (r *replayRun) run(send func(*Message) bool) error {
	var last uint64
	err := r.ask(r.ctx, func(ctx context.Context) (err error) {
		last, err = r.c.historyLastSeq(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if last == 0 {
		return nil // an empty history
	}
	r.last = last
	if r.owed, err = r.open(r.ctx); err != nil {
		return err
	}
	for r.owed > 0 {
		more, err := r.pull(send)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// pull fetches the next batch and sends it, and reports whether the replay goes on.
func (r *replayRun) pull(send func(*Message) bool) (bool, error) {
	if r.deadline.IsZero() {
		r.deadline, r.stall = time.Now().Add(r.c.topo.PublishTimeout), nil
	}
	wait, cancel := context.WithDeadline(r.ctx, r.deadline)
	defer cancel()
	if err := wait.Err(); err != nil {
		return false, r.spent(err)
	}
	if r.reopen {
		if more, err := r.reask(wait); err != nil || !more {
			return false, err
		}
	}
	fetch, cancelFetch := context.WithTimeout(wait, replayPullWait)
	defer cancelFetch()
	batch, err := r.cons.Fetch(int(min(r.owed, replayBatch)), jetstream.FetchContext(fetch))
	if err != nil {
		if fetch.Err() != nil {
			return false, r.spent(err) // the wait ran out as the pull was being sent
		}
		return false, r.failed(err)
	}
	got, gap := 0, false
	for m := range batch.Messages() {
		meta, err := deliveryOf(m)
		if err != nil {
			return false, fmt.Errorf("replay %s: %w", r.subject, err)
		}
		if meta.consumerSeq != r.delivered+1 {
			gap = true // what came between was lost on the way
			break
		}
		r.delivered = meta.consumerSeq
		if meta.streamSeq > r.last {
			return false, nil // stored after the replay began: the live subscription has it
		}
		got++
		r.owed--
		r.sent = meta.streamSeq
		if !send(r.c.delivered(r.caller, m, meta, nil)) {
			return false, nil
		}
		if err := r.ctx.Err(); err != nil {
			return false, r.failed(err)
		}
		if r.c.closed.Load() {
			return false, fmt.Errorf("replay %s: %w", r.subject, ErrClosed)
		}
		if r.owed == 0 {
			return false, nil
		}
	}
	if got > 0 {
		r.deadline = time.Time{} // the next wait starts once this batch was sent
	}
	switch err := batch.Error(); {
	case gap:
		r.stall, r.reopen = fmt.Errorf("events after consumer sequence %d were lost in transit", r.delivered), true
	case err != nil && !lostInTransit(err):
		return false, r.failed(err)
	case got > 0:
		// Even if the pull ended early (a slow send outlasted its wait), the next one
		// goes on from this consumer: a gap shows whatever was lost meanwhile.
	case errors.Is(err, nats.ErrNoResponders) && !r.retried:
		// Reported on a healthy 3-node cluster: a pull right after its consumer was
		// created found no responders. Send it once more before replacing the
		// consumer, which a failed node may have taken with it.
		r.stall, r.retried = err, true
		if err := sleepCtx(wait, publishRetryWait); err != nil {
			return false, r.spent(err)
		}
	case err != nil:
		r.stall, r.reopen = err, true
	default:
		r.stall, r.reopen = fmt.Errorf("a pull of %d events brought none", min(r.owed, replayBatch)), true
	}
	if err := r.ctx.Err(); err != nil {
		return false, r.failed(err)
	}
	return true, nil
}

// lostInTransit reports whether a pull's error means its answer, or part of it, may
// never have arrived: asking again from the last event sent recovers it.
func lostInTransit(err error) bool {
	return transient(err) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerLeadershipChanged)
}

// transient reports whether a request failed for want of an answer (none came, no
// responder yet, the connection is being re-established, the cluster is between
// leaders), so that the same request may succeed if sent again.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	return noAnswer(err) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || // sent while reconnecting: ExternalNATS keeps no buffer
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrClusterNotAvailCode)
}

// reask replaces the consumer with one from the event after the last one sent, so
// nothing lost is skipped, and lowers the bound to what the history still holds. It
// reports whether anything is left: if not, the rest aged out of the history.
func (r *replayRun) reask(ctx context.Context) (bool, error) {
	pending, err := r.open(ctx)
	if err != nil {
		return false, err
	}
	r.owed = min(r.owed, pending)
	return r.owed > 0, nil
}

// open creates the replay's consumer, replacing the one before, from the event after
// the last one sent (from since before the first), and returns what it has pending.
func (r *replayRun) open(ctx context.Context) (uint64, error) {
	r.drop()
	cfg := jetstream.ConsumerConfig{
		// Named here, so that a create sent again after a lost answer finds the
		// consumer the first one made rather than leaving it behind.
		Name:              "mq_replay_" + nuid.Next(),
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     r.subject,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: ephemeralInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	switch {
	case r.sent > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.sent+1
	case !beforeAnyStored(r.since): // the zero Time is before any
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &r.since
	}
	var cons jetstream.Consumer
	err := r.ask(ctx, func(ctx context.Context) (err error) {
		cons, err = r.c.js.CreateConsumer(ctx, r.c.topo.HistoryStream, cfg)
		return err
	})
	if err != nil {
		return 0, err
	}
	r.cons, r.delivered, r.retried, r.reopen = cons, 0, false, false
	return cons.CachedInfo().NumPending, nil
}

// ask runs one request of the replay bounded by PublishTimeout, as a publish bounds
// each attempt (and by ctx), and sends it again, publishRetryWait apart, while it
// fails transiently within that bound. An attempt waits a third of the bound at most,
// as many attempts as a publish makes: an answer lost in an outage shorter than the
// bound is asked for again, not waited for until the bound ran out. Sending again is
// harmless: each request reads, or creates the consumer under the name it already
// has.
func (r *replayRun) ask(ctx context.Context, req func(context.Context) error) error {
	bound, cancel := context.WithTimeout(ctx, r.c.topo.PublishTimeout)
	defer cancel()
	each := r.c.topo.PublishTimeout / (publishRetries + 1)
	for {
		attempt, cancelAttempt := context.WithTimeout(bound, each)
		err := req(attempt)
		cancelAttempt()
		if err == nil {
			return nil
		}
		if !transient(err) || sleepCtx(bound, publishRetryWait) != nil {
			return r.failed(err)
		}
	}
}

// failed maps what ended the replay: ErrClosed once the broker is closing, whatever
// the failure it caused looks like; the caller's error once its context is done; a
// transient failure, whose bound ran out, ErrUnavailable; the rest as any request's.
func (r *replayRun) failed(err error) error {
	switch {
	case r.c.closed.Load() && r.ctx.Err() != nil:
		return fmt.Errorf("replay %s: %w", r.subject, ErrClosed) // Close cancelled it: no context's error
	case r.c.closed.Load():
		return fmt.Errorf("replay %s: %w: %w", r.subject, ErrClosed, err)
	case r.ctx.Err() != nil:
		return fmt.Errorf("replay %s: %w", r.subject, r.ctx.Err())
	case transient(err):
		if r.stall != nil && !errors.Is(err, r.stall) {
			return fmt.Errorf("%w: replay %s: no answer within %s (%v): %w", ErrUnavailable, r.subject, r.c.topo.PublishTimeout, r.stall, err)
		}
		return fmt.Errorf("%w: replay %s: no answer within %s: %w", ErrUnavailable, r.subject, r.c.topo.PublishTimeout, err)
	}
	return r.c.mapRequestError("replay "+r.subject, err)
}

// spent is the end of a wait for the next event that ran out: ErrUnavailable, naming
// why the wait went on.
func (r *replayRun) spent(err error) error {
	if r.ctx.Err() != nil || r.c.closed.Load() {
		return r.failed(err)
	}
	if r.stall != nil {
		err = r.stall
	}
	return fmt.Errorf("%w: replay %s: nothing arrived within %s: %w", ErrUnavailable, r.subject, r.c.topo.PublishTimeout, err)
}

// drop deletes the current consumer, if any.
func (r *replayRun) drop() {
	if r.cons != nil {
		r.c.deleteConsumer(r.c.topo.HistoryStream, r.cons.CachedInfo().Name)
		r.cons = nil
	}
}

// historyLastSeq is the history's last sequence now.
func (c *natsCore) historyLastSeq(ctx context.Context) (uint64, error) {
	s, err := c.js.Stream(ctx, c.topo.HistoryStream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}

// deleteConsumer removes an ephemeral consumer, best effort: its inactive threshold
// removes it anyway.
func (c *natsCore) deleteConsumer(stream, name string) {
	if !c.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumerDeleteTimeout)
	defer cancel()
	_ = c.js.DeleteConsumer(ctx, stream, name)
}
