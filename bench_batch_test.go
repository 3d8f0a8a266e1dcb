package mq

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// batchSizes are the events per batch of BenchmarkPublishBatch.
var batchSizes = []int{1, 10, 100, 1000}

// rawSyncCallers is how many goroutines share a batch's events in impl=raw-sync: the
// 32 concurrent callers of BenchmarkPublish, each publishing synchronously.
const rawSyncCallers = 32

// BenchmarkPublishBatch: one tenant's batch of 1, 10, 100 and 1000 events of 256 B,
// one batch per op, returning once every event is confirmed, with EmbeddedNATS's two
// sync settings. ns/event and events/s make batch sizes and impls comparable; B/op and
// allocs/op are per batch. The impls, all on the same partition of the same topology:
//   - raw-sync: nats.go's synchronous publish, the batch's events shared by up to 32
//     goroutines on one connection;
//   - raw-async: nats.go's PublishAsync (window 4096) of every event, then every ack;
//   - raw-fast: JetStream's fast-ingest batch (allow_batched, nats-server 2.14 and
//     later, set on the partition for this impl only) through orbit.go's
//     FastPublisher, committed by the last event;
//   - mq-pipelined and mq-atomic: PublishBatch in its two forms.
//
// Every impl but raw-fast sends a message id per event, as PublishBatch does, so a
// retry stores each event once; a fast batch has no per-event retry to need one.
func BenchmarkPublishBatch(b *testing.B) {
	for _, mode := range syncModes {
		b.Run("sync="+mode.name, func(b *testing.B) { benchPublishBatch(b, embeddedTarget(mode.noSync)) })
	}
}

func benchPublishBatch(b *testing.B, open func(*testing.B) benchTarget) {
	payload := make([]byte, benchPayload)
	for _, size := range batchSizes {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) {
			for _, raw := range rawBatchImpls {
				b.Run("impl="+raw.name, func(b *testing.B) {
					t := open(b)
					if raw.batched {
						allowBatched(b, t.admin, t.stream)
					}
					benchBatches(b, size, func() error {
						return raw.publish(t.raw, t.subject, t.stream, payload, size)
					})
				})
			}
			for _, atomic := range []bool{false, true} {
				name := "impl=mq-pipelined"
				if atomic {
					name = "impl=mq-atomic"
				}
				b.Run(name, func(b *testing.B) {
					t := open(b)
					batch := Batch{Tenant: benchTopic.Tenant, Atomic: atomic, Events: make([]BatchEvent, size)}
					for i := range batch.Events {
						batch.Events[i] = BatchEvent{Table: benchTopic.Table, Data: payload}
					}
					benchBatches(b, size, func() error {
						return t.broker.PublishBatch(context.Background(), batch)
					})
				})
			}
		})
	}
}

// rawBatchImpls are the impls of BenchmarkPublishBatch written with nats.go alone;
// batched ones need allow_batched on the partition.
var rawBatchImpls = []struct {
	name    string
	batched bool
	publish func(js jetstream.JetStream, subject, stream string, payload []byte, size int) error
}{
	{"raw-sync", false, rawSyncBatch},
	{"raw-async", false, rawAsyncBatch},
	{"raw-fast", true, rawFastBatch},
}

// benchBatches runs publish, which sends one batch of size events, b.N times and
// reports the cost per event.
func benchBatches(b *testing.B, size int, publish func() error) {
	b.Helper()
	b.SetBytes(int64(size * benchPayload))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := publish(); err != nil {
			b.Fatal(err)
		}
	}
	reportPerEvent(b, b.N*size)
}

// reportPerEvent reports ns/event and events/s over events published in b's timed run.
func reportPerEvent(b *testing.B, events int) {
	b.Helper()
	d := b.Elapsed()
	if events == 0 || d <= 0 {
		return
	}
	b.ReportMetric(float64(d.Nanoseconds())/float64(events), "ns/event")
	b.ReportMetric(float64(events)/d.Seconds(), "events/s")
}

func rawSyncBatch(js jetstream.JetStream, subject, stream string, payload []byte, size int) error {
	callers := min(size, rawSyncCallers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := c; i < size; i += callers {
				if _, err := js.Publish(context.Background(), subject, payload,
					jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(stream)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func rawAsyncBatch(js jetstream.JetStream, subject, stream string, payload []byte, size int) error {
	futures := make([]jetstream.PubAckFuture, size)
	for i := range futures {
		f, err := js.PublishAsync(subject, payload, jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(stream))
		if err != nil {
			return err
		}
		futures[i] = f
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		}
	}
	return nil
}

func rawFastBatch(js jetstream.JetStream, subject, _ string, payload []byte, size int) error {
	fp, err := jetstreamext.NewFastPublisher(js)
	if err != nil {
		return err
	}
	for range size - 1 {
		if _, err := fp.Add(subject, payload); err != nil {
			return err
		}
	}
	_, err = fp.Commit(context.Background(), subject, payload)
	return err
}

// allowBatched sets allow_batched on stream, which fast-ingest batches need.
func allowBatched(b *testing.B, js jetstream.JetStream, stream string) {
	b.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		b.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowBatchPublish = true
	if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
}
