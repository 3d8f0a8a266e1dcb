package mq

import (
	"context"
	"encoding/binary"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// BenchmarkPublishToHub: the latency from a publish's start to the hub's delivery of
// the event, through the history that sources every partition, reported as p50-ns and
// p99-ns. pace=one publishes the next event once the last one reached the hub (the
// seed's measurement); pace=back-to-back publishes all b.N events first, so the
// history's sourcing backlog adds to the later events' latency. impl=raw publishes
// with nats.go and reads the history with an ordered consumer of its own, as the hub
// does; impl=mq is Publish and Subscribe.
func BenchmarkPublishToHub(b *testing.B) {
	for _, pace := range []string{"one", "back-to-back"} {
		b.Run("pace="+pace, func(b *testing.B) {
			b.Run("impl=raw", func(b *testing.B) {
				e := benchBroker(b, true)
				t := newBenchTarget(b, e, e.core, rawJS(b, e).Conn())
				benchHub(b, pace == "one", func(deliver func([]byte)) {
					cons, err := t.raw.OrderedConsumer(context.Background(), e.topo.HistoryStream, jetstream.OrderedConsumerConfig{
						FilterSubjects: []string{e.subs.ingestAll()},
						DeliverPolicy:  jetstream.DeliverNewPolicy,
					})
					if err != nil {
						b.Fatal(err)
					}
					cc, err := cons.Consume(func(m jetstream.Msg) { deliver(m.Data()) })
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(cc.Stop)
				}, func(payload []byte) error {
					_, err := t.raw.Publish(context.Background(), t.subject, payload,
						jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(t.stream))
					return err
				})
			})
			b.Run("impl=mq", func(b *testing.B) {
				e := benchBroker(b, true)
				benchHub(b, pace == "one", func(deliver func([]byte)) {
					if err := e.Subscribe(b.Context(), "bench", func(m *Message) error {
						deliver(m.Data)
						return nil
					}); err != nil {
						b.Fatal(err)
					}
				}, func(payload []byte) error {
					return e.Publish(context.Background(), benchTopic, payload)
				})
			})
		})
	}
}

// benchHub subscribes, publishes b.N events of 256 B numbered in their first 8 bytes
// (awaiting each one's delivery first when oneAtATime), waits until every event was
// delivered and reports the latencies' p50 and p99.
func benchHub(b *testing.B, oneAtATime bool, subscribe func(deliver func([]byte)), publish func([]byte) error) {
	b.Helper()
	b.ReportAllocs()
	sent := make([]atomic.Int64, b.N) // unix ns; the handler reads it on another goroutine
	lat := make([]time.Duration, b.N)
	got := make(chan struct{}, b.N)
	subscribe(func(data []byte) {
		i := binary.BigEndian.Uint64(data)
		if i < uint64(b.N) {
			lat[i] = time.Duration(time.Now().UnixNano() - sent[i].Load())
			got <- struct{}{}
		}
	})
	payload := make([]byte, benchPayload)
	b.ResetTimer()
	awaitOne := func() {
		select {
		case <-got:
		case <-time.After(time.Minute):
			b.Fatal("the hub did not deliver an event within a minute")
		}
	}
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint64(payload, uint64(i))
		sent[i].Store(time.Now().UnixNano())
		if err := publish(payload); err != nil {
			b.Fatal(err)
		}
		if oneAtATime {
			awaitOne()
		}
	}
	if !oneAtATime {
		for range b.N {
			awaitOne()
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[b.N/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[b.N*99/100].Nanoseconds()), "p99-ns")
}
