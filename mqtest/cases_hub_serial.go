package mqtest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// hubSerialCases hold the hub to "to handler, one at a time" (mq.Subscriber): a host's
// hub handler may keep state without a lock, so a broker that runs tenants' calls in
// parallel, each tenant still in order, breaks it as surely as one that reorders.
func hubSerialCases() []testCase {
	return []testCase{
		{
			name: "SubscribeCallsItsHandlerOneAtATimeAcrossTenants",
			proves: "The hub never begins a handler call while another of the same " +
				"subscription is in flight, even for different tenants: each call is held " +
				"for the quiet window, in which a broker calling concurrently would begin " +
				"another.",
			publishes: "2 events each on acme/t and globex/t, interleaved",
			run:       subscribeOneAtATime,
		},
	}
}

func subscribeOneAtATime(t *testing.T, h Harness) {
	e := setup(t, h)
	var mu sync.Mutex
	running, peak := 0, 0
	overlap := make(chan struct{})
	overlapped := sync.OnceFunc(func() { close(overlap) })
	put, hub := e.mailbox()
	require.NoError(t, e.b.Subscribe(e.ctx, "one-at-a-time", func(m *mq.Message) error {
		mu.Lock()
		running++
		peak = max(peak, running)
		if running > 1 {
			overlapped() // let the held call go: the failure is certain
		}
		mu.Unlock()
		// Held, so a broker that would call concurrently has the time to: the quiet
		// window is the suite's bound on watching for what must not happen.
		select {
		case <-overlap:
		case <-time.After(quiet):
		case <-e.ctx.Done():
		}
		mu.Lock()
		running--
		mu.Unlock()
		if e.live() {
			put(newDelivery(m))
		}
		return nil
	}), "subscribe")
	for _, d := range []string{"1", "2"} {
		for _, tenant := range []mq.TenantID{Acme, Globex} {
			e.publish(topic(tenant, "t", ""), d)
		}
	}
	got := byTenant(next(t, hub, 4))
	for _, tenant := range []mq.TenantID{Acme, Globex} {
		assert.Equal(t, []string{"1", "2"}, got[tenant], "the hub's order for %s", tenant)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, peak, "hub handler calls in flight at once: mq.Subscriber promises its handler one call at a time, tenants included")
}
