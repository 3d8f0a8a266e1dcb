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
// the history's last sequence when the replay began: the count the server reported
// bounds the batches, and the sequence bound keeps an event that aged out meanwhile
// from being replaced by one from the live tail.
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
	last, err := c.historyLastSeq(ctx)
	if err != nil {
		return c.mapRequestError("replay "+subject, err)
	}
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     subject,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: ephemeralInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if !beforeAnyStored(since) { // the zero Time included
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &since
	}
	cons, err := c.js.CreateConsumer(ctx, c.topo.HistoryStream, cfg)
	if err != nil {
		return c.mapRequestError("replay "+subject, err)
	}
	defer c.deleteConsumer(c.topo.HistoryStream, cons.CachedInfo().Name)
	remaining := cons.CachedInfo().NumPending
	for remaining > 0 {
		batch, err := cons.Fetch(int(min(remaining, replayBatch)), jetstream.FetchMaxWait(replayPullWait))
		if err != nil {
			return c.mapRequestError("replay "+subject, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			remaining--
			if meta, err := m.Metadata(); err == nil && meta.Sequence.Stream > last {
				return nil // stored after the replay began: the live subscription has it
			}
			if !send(c.message(ctx, m, nil)) {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if c.closed.Load() {
				return fmt.Errorf("replay %s: %w", subject, ErrClosed)
			}
			if remaining == 0 {
				break
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return c.mapRequestError("replay "+subject, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if got == 0 {
			if !c.nc.IsConnected() {
				return fmt.Errorf("%w: replay %s: not connected", ErrUnavailable, subject)
			}
			// Nothing came: done if the history aged out what was left, else a pull
			// was lost (a quick reconnect) and the next one asks again.
			info, err := cons.Info(ctx)
			if err != nil {
				return c.mapRequestError("replay "+subject, err)
			}
			if info.NumPending == 0 {
				return nil
			}
			remaining = min(remaining, info.NumPending)
		}
	}
	return nil
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

// deadLetter parks msg's data and headers under its own topic key on the dead-letter
