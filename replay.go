package mq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Replay bounds, and the lifetime of the ephemeral consumers replay and the hub create.
const (
	replayBatch           = 256
	replayPullWait        = 2 * time.Second
	ephemeralInactive     = time.Minute
	consumerDeleteTimeout = time.Second
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
func (c *natsCore) replay(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if send == nil {
		return errors.New("replay: nil send")
	}
	subject, _, err := c.subs.ingestTopic(topic)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if afterAnyStored(since) {
		return nil // nothing is stored that late
	}
	r := &replayRun{c: c, subject: subject, since: since}
	defer r.drop()
	return r.run(ctx, send)
}

// replayRun is one replay in progress.
type replayRun struct {
	c       *natsCore
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
	// event received from it, which the next one must follow.
	cons      jetstream.Consumer
	delivered uint64
}

func (r *replayRun) run(ctx context.Context, send func(*Message) bool) error {
	last, err := r.c.historyLastSeq(ctx)
	if err != nil {
		return r.c.mapRequestError("replay "+r.subject, err)
	}
	if last == 0 {
		return nil // an empty history
	}
	r.last = last
	if r.owed, err = r.open(ctx); err != nil {
		return err
	}
	for r.owed > 0 {
		more, err := r.pull(ctx, send)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// pull fetches the next batch and sends it, and reports whether the replay goes on.
func (r *replayRun) pull(ctx context.Context, send func(*Message) bool) (bool, error) {
	batch, err := r.cons.Fetch(int(min(r.owed, replayBatch)), jetstream.FetchMaxWait(replayPullWait))
	if err != nil {
		return false, r.c.mapRequestError("replay "+r.subject, err)
	}
	got, gap := 0, false
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			return false, fmt.Errorf("replay %s: %w", r.subject, err)
		}
		if meta.Sequence.Consumer != r.delivered+1 {
			gap = true // what came between was lost on the way
			break
		}
		r.delivered = meta.Sequence.Consumer
		if meta.Sequence.Stream > r.last {
			return false, nil // stored after the replay began: the live subscription has it
		}
		got++
		r.owed--
		r.sent = meta.Sequence.Stream
		if !send(r.c.message(ctx, m, nil)) {
			return false, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if r.c.closed.Load() {
			return false, fmt.Errorf("replay %s: %w", r.subject, ErrClosed)
		}
		if r.owed == 0 {
			return false, nil
		}
	}
	if !gap {
		switch err := batch.Error(); {
		case err != nil && !lostInTransit(err):
			return false, r.c.mapRequestError("replay "+r.subject, err)
		case err == nil && got > 0:
			return true, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return r.reask(ctx)
}

// lostInTransit reports whether a pull's error means its answer, or part of it, may
// never have arrived: asking again from the last event sent recovers it.
func lostInTransit(err error) bool {
	return noAnswer(err) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerLeadershipChanged)
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
	cons, err := r.c.js.CreateConsumer(ctx, r.c.topo.HistoryStream, cfg)
	if err != nil {
		return 0, r.c.mapRequestError("replay "+r.subject, err)
	}
	r.cons, r.delivered = cons, 0
	return cons.CachedInfo().NumPending, nil
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
