package mq

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Test-only shims for the conformance run in package mq_test, which reaches the
// embedded broker's JetStream objects only through these.

// JetStreamOf returns the JetStream context e publishes and consumes with.
func JetStreamOf(e *EmbeddedNATS) jetstream.JetStream { return e.js }

// TopologyOf returns e's topology, defaults applied.
func TopologyOf(e *EmbeddedNATS) NATSTopology { return e.topo }

// ParkedMessages reads tenant's parked events back from the dead-letter stream in the
// order they were parked, as Messages with data, stored time, headers (without the
// broker's own) and the topic key they were parked under.
func ParkedMessages(ctx context.Context, e *EmbeddedNATS, tenant TenantID) ([]*Message, error) {
	return parkedFrom(ctx, e.js, e.core, tenant)
}

// parkedFrom reads tenant's parked events from c's dead-letter stream through js (an
// operator's handle where c's user may not create consumers there).
func parkedFrom(ctx context.Context, js jetstream.JetStream, c *natsCore, tenant TenantID) ([]*Message, error) {
	stream, err := js.Stream(ctx, c.deadLetters)
	if err != nil {
		return nil, fmt.Errorf("parked messages: %w", err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.subs.tenantDeadLetters(tenant)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("parked messages: %w", err)
	}
	pending := cons.CachedInfo().NumPending
	out := make([]*Message, 0, pending)
	for uint64(len(out)) < pending {
		batch, err := cons.Fetch(int(pending)-len(out), jetstream.FetchMaxWait(replayPullWait))
		if err != nil {
			return nil, fmt.Errorf("parked messages: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			out = append(out, c.message(ctx, m, nil))
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("parked messages: %w", err)
		}
		if got == 0 {
			return nil, fmt.Errorf("parked messages: %d of %d arrived", len(out), pending)
		}
	}
	return out, nil
}
