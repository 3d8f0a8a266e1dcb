package mqtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// Health is optional: a broker that does not implement mq.HealthChecker skips these
// cases with that reason.

func healthCases() []testCase {
	return []testCase{
		{
			name: "HealthReportsAnEndedConsumeUntilStoppedAndErrClosedAfterClose",
			proves: "Health is nil while a hub and a Consume run; once the Consume's delivery " +
				"ended on its own it wraps mq.ErrDeliveryEnded, until the caller stops that " +
				"Consume; after Close it wraps mq.ErrClosed. Skipped for a broker that is no " +
				"mq.HealthChecker.",
			hooks:     []string{"EndDelivery"},
			publishes: "1 event each on acme/prime and globex/prime",
			skip:      needEndDelivery,
			run:       healthFollowsDelivery,
		},
		{
			name: "HealthWithACancelledContextReturnsTheContextsError",
			proves: "Health under a context already cancelled returns an error wrapping " +
				"context.Canceled, as mq.HealthChecker promises. Skipped for a broker that " +
				"is no mq.HealthChecker.",
			publishes: "nothing",
			run:       healthWithACancelledContext,
		},
	}
}

func healthFollowsDelivery(t *testing.T, h Harness) {
	e := setup(t, h)
	hc := optional[mq.HealthChecker](t, e.b)
	check := func() error {
		ctx, cancel := context.WithTimeout(e.ctx, wait)
		defer cancel()
		return hc.Health(ctx)
	}
	e.subscribe("health")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	e.prime(c)
	require.NoError(t, check(), "Health with a hub and a Consume running")

	h.EndDelivery(t, e.b)
	select {
	case err := <-c.failed:
		require.ErrorIs(t, err, mq.ErrDeliveryEnded)
	case <-e.ctx.Done():
		t.Fatal("delivery ended from outside was not reported on failed")
	}
	assert.ErrorIs(t, check(), mq.ErrDeliveryEnded, "Health once the Consume's delivery ended")
	c.stop()
	assert.NoError(t, check(), "Health once the caller stopped the ended Consume")

	require.NoError(t, e.b.Close())
	assert.ErrorIs(t, check(), mq.ErrClosed, "Health after Close")
}

// A host calls Health every few seconds under a deadline of its own, and must be able
// to tell its ended ctx from a broker at fault.
func healthWithACancelledContext(t *testing.T, h Harness) {
	e := setup(t, h)
	hc := optional[mq.HealthChecker](t, e.b)
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	assert.ErrorIs(t, hc.Health(cancelled), context.Canceled,
		"Health under a cancelled context: mq.HealthChecker promises ctx's error, so a host can tell it from the broker's")
}
