package mq

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkConsumeConcurrency: handlers that each take 1 ms (a database write), over
// 64 tenants on the default 4 partitions, with ConsumerConfig.Concurrency 1, 4, 16 and
// 64 side by side in one run. The events/s metric is the figure to compare; before the
// lanes, a worker ran one handler per partition whatever the tenant mix.
func BenchmarkConsumeConcurrency(b *testing.B) {
	const tenants = 64
	payload := make([]byte, benchPayload)
	for _, n := range []int{1, 4, 16, 64} {
		b.Run("concurrency="+strconv.Itoa(n), func(b *testing.B) {
			e := benchBroker(b, true)
			ctx := context.Background()
			ids := make([]TenantID, tenants)
			for i := range ids {
				ids[i] = TenantID(fmt.Sprintf("tenant-%d", i))
				if err := e.SetMaxBytes(ctx, ids[i], 1<<40); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < b.N; i++ {
				if err := e.Publish(ctx, Topic{Tenant: ids[i%tenants], Table: "bench"}, payload); err != nil {
					b.Fatal(err)
				}
			}
			c, err := e.CreateConsumer(ctx, ConsumerConfig{Concurrency: n})
			if err != nil {
				b.Fatal(err)
			}
			var done atomic.Int64
			all := make(chan struct{})
			b.ResetTimer()
			stop, _, err := c.Consume(func(m *Message) error {
				time.Sleep(time.Millisecond)
				if err := m.Ack(); err != nil {
					return err
				}
				if done.Add(1) == int64(b.N) {
					close(all)
				}
				return nil
			}, 0)
			if err != nil {
				b.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatalf("consumed %d of %d", done.Load(), b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			stop()
		})
	}
}
