//go:build integration

package mq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// TestExternalNATS_Conformance runs the conformance suite against ExternalNATS
// connected as the restricted wavehouse user of the shipped Helm values, each case on
// its own server with the shipped N=4 manifests applied by the operator. It is not
// parallel: mqtest.Run sets the global OpenTelemetry propagator.
func TestExternalNATS_Conformance(t *testing.T) {
	var mu sync.Mutex
	fixtures := map[mq.Broker]*mq.ExternalFixture{}
	fixtureOf := func(t *testing.T, b mq.Broker) *mq.ExternalFixture {
		mu.Lock()
		defer mu.Unlock()
		x, ok := fixtures[b]
		require.True(t, ok, "broker %p has no fixture", b)
		return x
	}
	mqtest.Run(t, mqtest.Harness{
		New: func(t *testing.T) mq.Broker {
			x := mq.NewExternalFixture(t)
			e := x.Broker(t)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
				require.NoError(t, e.SetMaxBytes(ctx, tenant, conformanceBudget))
			}
			mu.Lock()
			fixtures[e] = x
			mu.Unlock()
			t.Cleanup(func() { mu.Lock(); delete(fixtures, e); mu.Unlock() })
			return e
		},
		EndDelivery: func(t *testing.T, b mq.Broker) { fixtureOf(t, b).DeleteIngestDurables(t) },
		// Restart closes the client, restarts the server on its store, and connects a
		// new client, as a deploy during a server restart would.
		Restart: func(t *testing.T, b mq.Broker) mq.Broker {
			x := fixtureOf(t, b)
			require.NoError(t, b.Close())
			x.RestartServer(t)
			e := x.Broker(t)
			mu.Lock()
			fixtures[e] = x
			mu.Unlock()
			t.Cleanup(func() { mu.Lock(); delete(fixtures, e); mu.Unlock() })
			return e
		},
		// Budgets are not enforced here, so Fill shrinks the tenant's partition first;
		// FillByPublishing then fills it with the smallest event.
		Fill: func(t *testing.T, b mq.Broker, tenant mq.TenantID) {
			fixtureOf(t, b).ShrinkPartitionOf(t, tenant, 4096)
			mqtest.FillByPublishing(t, b, tenant)
		},
		// Read as the restricted user, through the public DeadLetterManager.
		DeadLetters: parkedMessages,
		// Every flag about the operator's durable and retention stays false.
		ReservedHeaderPrefix: "Nats-",
		Caps: mqtest.Caps{
			StatsConnections:  true,
			RetryPolicy:       true,
			ConcurrentTenants: true,
			HandsBackOnStop:   true,
			SharedConsumers:   true,
			AtomicBatch:       true,
		},
	})
}
