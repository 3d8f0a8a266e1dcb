//go:build integration

package mq

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// largestPublish finds the most data Publish takes on topic with opts, by asking it:
// what the caller sees, whatever the broker reserves.
func largestPublish(t *testing.T, e *EmbeddedNATS, topic Topic, opts ...PublishOpt) int {
	t.Helper()
	ctx := testCtx(t)
	lo, hi := 0, 2*int(e.core.nc.MaxPayload())
	for lo < hi {
		mid := (lo + hi + 1) / 2
		switch err := e.Publish(ctx, topic, make([]byte, mid), opts...); {
		case err == nil:
			lo = mid
		case errors.Is(err, ErrPayloadTooLarge):
			hi = mid - 1
		default:
			require.NoError(t, err)
		}
	}
	return lo
}

// openForLargest is a broker whose tenant acme has room for many events of the
// largest size.
func openForLargest(t *testing.T) (*EmbeddedNATS, context.Context) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	return e, ctx
}

// TestWorker_AFailingEventOfTheLargestSizePublishTakesIsParkedWithItsErrorCut: the
// park adds the Mq-Dead-* headers, so a park of an event at the server's max payload
// was refused on every try, and the event was retried for ever, holding its tenant.
// Now it is parked with its data, its own headers and every Mq-Dead-* one, the error
// cut short, and its tenant's next event is handled.
func TestWorker_AFailingEventOfTheLargestSizePublishTakesIsParkedWithItsErrorCut(t *testing.T) {
	e, ctx := openForLargest(t)
	const tenant TenantID = "acme"
	probe := Topic{Tenant: tenant, Table: "probe"}
	size := largestPublish(t, e, probe, WithHeader("X-Row", "1"))
	poison := bytes.Repeat([]byte("P"), size)
	require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "rows"}, poison, WithHeader("X-Row", "1")))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "rows"}, []byte("next")))

	failure := strings.Repeat("long failure ", 200)
	handled := make(chan string, 1)
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{MaxDeliveries: 2})
	require.NoError(t, err)
	stop, _, err := cons.Consume(func(m *Message) error {
		switch {
		case m.Topic().Table == probe.Table:
		case len(m.Data) == size:
			return errors.New(failure)
		default:
			handled <- string(m.Data)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	select {
	case got := <-handled:
		assert.Equal(t, "next", got)
	case <-ctx.Done():
		t.Fatal("the tenant's next event never came: its poison event was never parked")
	}

	parked, _, err := e.DeadLetters(ctx, tenant, DeadLetterQuery{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	p := parked[0]
	assert.True(t, bytes.Equal(poison, p.Data), "the data parked whole")
	assert.Equal(t, "1", p.Headers.Get("X-Row"))
	for _, h := range []string{HeaderDeadReason, HeaderDeadAttempts, HeaderDeadPartition, HeaderDeadSequence,
		HeaderDeadFirstAttempt, HeaderDeadLastAttempt} {
		assert.NotEmpty(t, p.Headers.Get(h), h)
	}
	cut := p.Headers.Get(HeaderDeadError)
	assert.NotEmpty(t, cut, "some of the error kept")
	assert.Less(t, len(cut), maxDeadErrorLen, "the error cut below its usual length")
	assert.True(t, strings.HasPrefix(failure, cut), "the error's start kept: %q", cut)
}

// TestDeadLetter_AnEventOfTheLargestSizePublishTakesIsRedrivenAndParkedByTheHost: the
// room Publish keeps for a park serves a redrive, which adds Mq-Event-Id and its own
// idempotency key, and the host's own park of the redriven event, with a header of
// its own.
func TestDeadLetter_AnEventOfTheLargestSizePublishTakesIsRedrivenAndParkedByTheHost(t *testing.T) {
	e, ctx := openForLargest(t)
	const tenant TenantID = "acme"
	topic := Topic{Tenant: tenant, Table: "rows"}
	// A key of the same length as the event's: a probe's own would make the event a
	// duplicate.
	size := largestPublish(t, e, Topic{Tenant: tenant, Table: "probe"}, WithIdempotencyKey("row-0"))
	require.NoError(t, e.Publish(ctx, topic, make([]byte, size), WithIdempotencyKey("row-1")))
	got, failed := consumeAll(t, e)
	next := func() *Message { // the next delivery of topic, past the probes
		for {
			if m := receive(t, got, failed); m.Topic() == topic {
				return m
			}
		}
	}
	require.NoError(t, e.DeadLetter(ctx, next(), WithHeader("X-Why", "bad row")), "the host parks it")

	n, err := e.Redrive(ctx, tenant, DeadLetterSelector{All: true})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	again := next()
	assert.Equal(t, "row-1", again.ID, "the redrive keeps the event's ID")
	require.NoError(t, e.DeadLetter(ctx, again, WithHeader("X-Why", "bad row")), "the host parks the redriven event")
	c, err := e.DeadLetterCounts(ctx, tenant, "")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), c.Total)
}
