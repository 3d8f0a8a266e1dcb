package mqtest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wavehouse/mq"
)

// Concurrency: different tenants run at once, a tenant never twice.

func differentTenantsRunAtOnce(t *testing.T, h Harness) {
	e := setup(t, h)
	tenants := e.manyTenants(6)
	const concurrency, per = 3, 3
	var mu sync.Mutex
	inFlight := map[mq.TenantID]int{}
	running, peak, twice := 0, 0, 0
	release := make(chan struct{})
	letGo := sync.OnceFunc(func() { close(release) })
	defer letGo()
	c := e.consume(mq.ConsumerConfig{Concurrency: concurrency}, func(m *mq.Message) error {
		tenant := m.Topic().Tenant
		mu.Lock()
		if inFlight[tenant] > 0 {
			twice++
		}
		inFlight[tenant]++
		running++
		peak = max(peak, running)
		mu.Unlock()
		select {
		case <-release:
		case <-e.ctx.Done():
		}
		mu.Lock()
		inFlight[tenant]--
		running--
		mu.Unlock()
		return e.ackEach(m)
	})
	for i := range per {
		for _, id := range tenants {
			e.publish(topic(id, "t", ""), fmt.Sprint(i))
		}
	}
	want := 1
	if h.Caps.ConcurrentTenants {
		want = concurrency
	}
	peakIs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
	assert.True(t, eventually(func() bool { return peakIs() >= want }),
		"%d calls in flight at once, want %d (Caps.ConcurrentTenants %v)", peakIs(), want, h.Caps.ConcurrentTenants)
	time.Sleep(quiet) // for a call beyond the first want to begin
	assert.Equal(t, want, peakIs(), "calls in flight at once (Caps.ConcurrentTenants %v, Concurrency %d)",
		h.Caps.ConcurrentTenants, concurrency)
	letGo()
	got := byTenant(next(t, c.deliveries, per*len(tenants)))
	for _, id := range tenants {
		assert.Equal(t, seq("", per), got[id], "tenant %s's order", id)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, twice, "calls that began while their tenant had one in flight")
}
