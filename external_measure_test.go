//go:build integration

package mq

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The measurements of the seed's design risks 3 (publish-to-hub latency through the
// history) and 4 (one tenant's publish throughput). They print figures and assert
// nothing about them; set WH_MQ_MEASURE=1 to run them.
func skipUnlessMeasuring(t *testing.T) {
	if os.Getenv("WH_MQ_MEASURE") != "1" {
		t.Skip("set WH_MQ_MEASURE=1 to measure")
	}
}

func TestExternalNATS_MeasurePublishToHubLatency(t *testing.T) {
	skipUnlessMeasuring(t)
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	const n = 2000
	var mu sync.Mutex
	sent := make(map[string]time.Time, n)
	lat := make([]time.Duration, 0, n)
	done := make(chan struct{})
	require.NoError(t, e.Subscribe(ctx, "measure", func(m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, time.Since(sent[string(m.Data)]))
		if len(lat) == n {
			close(done)
		}
		return nil
	}))
	payload := make([]byte, 256)
	for i := range n {
		id := fmt.Sprintf("%06d", i)
		copy(payload, id)
		mu.Lock()
		sent[id] = time.Now()
		mu.Unlock()
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "lat"}, []byte(id)))
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the hub did not see every event")
	}
	slices.Sort(lat)
	t.Logf("measured publish-to-hub latency over %d events: p50 %v p99 %v max %v",
		n, lat[n/2], lat[n*99/100], lat[n-1])
}

func TestExternalNATS_MeasureOneTenantsPublishThroughput(t *testing.T) {
	skipUnlessMeasuring(t)
	f := newExternalFixture(t)
	e := f.broker(t)
	ctx := testCtx(t)
	const callers, each = 32, 500
	payload := make([]byte, 256)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				if err := e.Publish(ctx, Topic{Tenant: "acme", Table: "tput"}, payload); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("measured one tenant's publish throughput: %d x 256 B from %d callers in %v, %.0f/s",
		callers*each, callers, d.Round(time.Millisecond), float64(callers*each)/d.Seconds())
}
