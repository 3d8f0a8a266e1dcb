package mqtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// Fill parameters: a budget a few events fill, and a bound on the events it may take.
const (
	fillBudget = 4 << 10
	fillLimit  = 1 << 16
)

// FillByPublishing is a Harness.Fill for a broker that enforces SetMaxBytes: it shrinks
// tenant's budget to 4 KiB, then publishes the smallest event there is (no data, the
// one-byte table "t", no scope, no header, no trace context) until one is refused with
// mq.ErrQueueFull.
//
// Why no later event fits: the refused event costs the least any event can, and what
// the tenant holds only grows until its events are consumed; so every later event,
// which costs at least as much, is refused too, whatever its size, table or headers.
// (A fill with larger events, or on a longer table, leaves room for a smaller one.)
// It fails t if the broker refuses anything else or still takes events after 65536.
func FillByPublishing(t *testing.T, b mq.Broker, tenant mq.TenantID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.SetMaxBytes(ctx, tenant, fillBudget), "mqtest: FillByPublishing: shrink %s's budget", tenant)
	tp := mq.Topic{Tenant: tenant, Table: "t"}
	for i := range fillLimit {
		err := b.Publish(ctx, tp, nil)
		if errors.Is(err, mq.ErrQueueFull) {
			return
		}
		require.NoError(t, err, "mqtest: FillByPublishing: empty event %d on %s: want it stored, or refused "+
			"with an error wrapping mq.ErrQueueFull (errors.Is) once the budget is used up", i, tp)
	}
	t.Fatalf("mqtest: FillByPublishing: %s took %d empty events under a %d-byte budget: "+
		"the broker does not enforce SetMaxBytes, so its harness must shrink its queue before publishing",
		tenant, fillLimit, fillBudget)
}
