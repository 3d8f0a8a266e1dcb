package mqtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wavehouse/mq"
)

// optionalContextCases hold the optional interfaces to their context: a host calls
// Health every few seconds and OldestSequence before a replay, each under a deadline
// of its own, and must be able to tell its ended ctx from a broker at fault.
func optionalContextCases() []testCase {
	return []testCase{
		{
			name: "HealthWithACancelledContextReturnsTheContextsError",
			proves: "Health under a context already cancelled returns an error wrapping " +
				"context.Canceled, as mq.HealthChecker promises. Skipped for a broker that " +
				"is no mq.HealthChecker.",
			publishes: "nothing",
			run:       healthWithACancelledContext,
		},
		{
			name: "OldestSequenceWithADoneContextReturnsTheContextsError",
			proves: "OldestSequence under a context already cancelled or expired returns an " +
				"error wrapping that context's error, as mq.HistoryHorizon promises. " +
				"Skipped for a broker that is no mq.HistoryHorizon.",
			publishes: "nothing",
			run:       oldestSequenceWithADoneContext,
		},
	}
}

func healthWithACancelledContext(t *testing.T, h Harness) {
	e := setup(t, h)
	hc := optional[mq.HealthChecker](t, e.b)
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	assert.ErrorIs(t, hc.Health(cancelled), context.Canceled,
		"Health under a cancelled context: mq.HealthChecker promises ctx's error, so a host can tell it from the broker's")
}

func oldestSequenceWithADoneContext(t *testing.T, h Harness) {
	e := setup(t, h)
	hh := optional[mq.HistoryHorizon](t, e.b)
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for _, ctx := range []context.Context{cancelled, expired} {
		_, err := hh.OldestSequence(ctx)
		assert.ErrorIs(t, err, ctx.Err(),
			"OldestSequence under a done context: mq.HistoryHorizon promises ctx's error when ctx ends first")
	}
}
