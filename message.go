package mq

import (
	"context"
	"time"
)

// Message is one delivered event.
//
// A Message handed to a handler must be settled (Ack, DoubleAck, Nak, NakWithDelay) at
// most once, during the handler or after it returned (a worker may hold messages for a
// batch). Messages delivered by Subscribe and ReplaySince carry no settlement: their
// settle methods do nothing.
type Message struct {
	// Data is the event's payload.
	Data []byte
	// Timestamp is when the broker stored the event, on the stream it was read from:
	// the partition for Consume, the history (a little later) for Subscribe and
	// ReplaySince.
	Timestamp time.Time
	// Headers are the event's headers as published (options and trace context),
	// without any "Nats-" header, the idempotency key included.
	Headers Headers
	// ID identifies the event: the idempotency key it was published with, as the
	// caller gave it, or else the broker's own id for it. Every delivery of one event
	// carries the same ID, so a handler can make its writes idempotent by it.
	ID string
	// Attempt is this delivery's number, 1 on the first; it grows with every
	// redelivery (a nak, an ack wait run out, a restart). Always 1 on Subscribe and
	// ReplaySince, which do not redeliver. Zero when the broker cannot tell.
	Attempt int
	// Sequence is where the event was read: its sequence on its partition on the
	// worker path, on the history for Subscribe and ReplaySince. Within one partition
	// (so within one tenant) it grows in publish order. Zero when the broker has none.
	Sequence uint64
	// Ctx is the context a handler should work under. On the hub path (Subscribe) it
	// carries the publisher's trace context; on the worker path (Consume) it is the
	// context given to CreateConsumer with the delivery's consumer span (a child of
	// the publisher's) in it; on ReplaySince it is the caller's with the replay span.
	Ctx context.Context

	key     string
	settler Settler
}

// Settler settles one delivered message with the broker that delivered it. Broker
// implementations supply one through [WithSettler]; a jetstream.Msg is a Settler.
type Settler interface {
	Ack() error
	DoubleAck(ctx context.Context) error
	Nak() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
}

// MessageOpt configures a Message built with NewMessage.
type MessageOpt func(*Message)

// WithSettler binds the message's settle methods to s.
func WithSettler(s Settler) MessageOpt { return func(m *Message) { m.settler = s } }

// WithTimestamp sets the message's stored time.
func WithTimestamp(t time.Time) MessageOpt { return func(m *Message) { m.Timestamp = t } }

// WithDelivery sets what a broker knows of this delivery: the event's ID, the attempt
// and the sequence it was read at.
func WithDelivery(id string, attempt int, sequence uint64) MessageOpt {
	return func(m *Message) { m.ID, m.Attempt, m.Sequence = id, attempt, sequence }
}

// WithMessageHeaders sets the message's headers.
func WithMessageHeaders(h Headers) MessageOpt { return func(m *Message) { m.Headers = h } }

// NewMessage builds a message for topic. Brokers use it to hand deliveries to handlers;
// tests use it to park events directly. An invalid topic still yields a message whose
// TopicKey is empty. A message without a settler settles as a no-op.
func NewMessage(ctx context.Context, topic Topic, data []byte, opts ...MessageOpt) *Message {
	key, _ := topic.Key()
	return newKeyedMessage(ctx, key, data, opts...)
}

func newKeyedMessage(ctx context.Context, key string, data []byte, opts ...MessageOpt) *Message {
	if ctx == nil {
		ctx = context.Background()
	}
	m := &Message{Ctx: ctx, Data: data, key: key}
	for _, opt := range opts {
		opt(m)
	}
	return m
}

// TopicKey returns the message's topic key as delivered, undecoded: cheap and meant for
// log lines. See [Topic.Key].
func (m *Message) TopicKey() string { return m.key }

// Topic decodes the message's topic key. A key this package could not have written (a
// foreign subject) decodes to a Topic with no tenant whose Table is the whole key, so
// nothing is dropped.
func (m *Message) Topic() Topic {
	t, err := ParseTopicKey(m.key)
	if err != nil {
		return Topic{Table: m.key}
	}
	return t
}

// Ack acknowledges the message without waiting for the broker's confirmation.
func (m *Message) Ack() error {
	if m.settler == nil {
		return nil
	}
	return m.settler.Ack()
}

// DoubleAck acknowledges the message and waits until the broker confirmed it: use it
// after the event was durably written elsewhere.
func (m *Message) DoubleAck(ctx context.Context) error {
	if m.settler == nil {
		return nil
	}
	return m.settler.DoubleAck(ctx)
}

// Nak asks for the message to be delivered again.
func (m *Message) Nak() error {
	if m.settler == nil {
		return nil
	}
	return m.settler.Nak()
}

// NakWithDelay asks for the message to be delivered again, no sooner than delay; a
// delay of zero or less is a plain Nak. The delay does not outlast a restart of
// EmbeddedNATS without a listener, whose boot delivers again at once what was pending.
func (m *Message) NakWithDelay(delay time.Duration) error {
	if m.settler == nil {
		return nil
	}
	return m.settler.NakWithDelay(delay)
}

// InProgress tells the broker the handler is still working on the message, restarting
// its ack wait.
func (m *Message) InProgress() error {
	if m.settler == nil {
		return nil
	}
	return m.settler.InProgress()
}
