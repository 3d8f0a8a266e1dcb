package mq

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// The benchmarks compare each path of EmbeddedNATS with raw nats.go doing the same
// JetStream work on the same in-process server in the same run, as sub-benchmarks
// impl=raw and impl=mq, so `benchstat -col /impl` prints the library's cost as a
// ratio. Run them with `make bench`.

const benchPayload = 256

// syncModes are EmbeddedNATS's two sync settings, the benchmark parameter sync=:
// always is the default (an fsync after every write, SyncAlways), periodic is NoSync
// (the server's periodic sync, every two minutes by default).
var syncModes = []struct {
	name   string
	noSync bool
}{{"always", false}, {"periodic", true}}

// benchBroker opens an EmbeddedNATS in a temp dir with tenant acme's budget unbounded.
// noSync picks the sync setting; the benchmarks that do not measure it use periodic.
func benchBroker(b *testing.B, noSync bool) *EmbeddedNATS {
	b.Helper()
	e, err := NewEmbedded(context.Background(), EmbeddedOptions{StoreDir: b.TempDir(), NoSync: noSync, Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	if err := e.SetMaxBytes(context.Background(), "acme", 1<<40); err != nil {
		b.Fatal(err)
	}
	return e
}

// rawJS is a second in-process connection to e's server, as a nats.go user would have.
func rawJS(b *testing.B, e *EmbeddedNATS) jetstream.JetStream {
	nc, err := nats.Connect("", nats.InProcessServer(e.srv))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return js
}

// benchTopic is the one tenant's topic every publish benchmark writes to.
var benchTopic = Topic{Tenant: "acme", Table: "bench"}

// benchTarget is what a publish benchmark runs against: the library's broker and a
// raw nats.go JetStream context on a connection of its own to the same servers, with
// benchTopic's ingest subject and partition stream, where raw publishes go.
type benchTarget struct {
	broker interface {
		Publisher
		BatchPublisher
	}
	raw             jetstream.JetStream // PublishAsync's window at 4096, PublishBatch's
	subject, stream string
	// admin may change the stream's configuration: raw itself on EmbeddedNATS.
	admin jetstream.JetStream
}

// newBenchTarget builds the target of broker's core and the raw connection nc.
func newBenchTarget(b *testing.B, broker interface {
	Publisher
	BatchPublisher
}, c *natsCore, nc *nats.Conn) benchTarget {
	b.Helper()
	// The window changes nothing for synchronous publishes.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	subject, p, _ := c.subs.ingestTopic(benchTopic)
	return benchTarget{broker: broker, raw: js, subject: subject, stream: c.partitions[p], admin: js}
}

// embeddedTarget opens a fresh EmbeddedNATS per benchmark, with the sync setting noSync.
func embeddedTarget(noSync bool) func(*testing.B) benchTarget {
	return func(b *testing.B) benchTarget {
		e := benchBroker(b, noSync)
		return newBenchTarget(b, e, e.core, rawJS(b, e).Conn())
	}
}

// BenchmarkPublish: publishes of 256 B from 1 and from 32 concurrent callers of one
// tenant, each call confirmed by the partition before it returns, with EmbeddedNATS's
// two sync settings. impl=raw is nats.go's synchronous publish on one connection, what
// a caller without this library would write.
func BenchmarkPublish(b *testing.B) {
	for _, mode := range syncModes {
		b.Run("sync="+mode.name, func(b *testing.B) { benchPublish(b, embeddedTarget(mode.noSync)) })
	}
}

func benchPublish(b *testing.B, open func(*testing.B) benchTarget) {
	payload := make([]byte, benchPayload)
	for _, callers := range []int{1, 32} {
		b.Run("callers="+strconv.Itoa(callers), func(b *testing.B) {
			b.Run("impl=raw", func(b *testing.B) {
				t := open(b)
				benchCallers(b, callers, func() error {
					_, err := t.raw.Publish(context.Background(), t.subject, payload,
						jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(t.stream))
					return err
				})
			})
			b.Run("impl=mq", func(b *testing.B) {
				t := open(b)
				benchCallers(b, callers, func() error {
					return t.broker.Publish(context.Background(), benchTopic, payload)
				})
			})
		})
	}
}

// benchCallers runs publish b.N times in all from exactly callers goroutines (RunParallel
// would tie their number to GOMAXPROCS).
func benchCallers(b *testing.B, callers int, publish func() error) {
	b.Helper()
	b.SetBytes(benchPayload)
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := publish(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkConsume: drain b.N stored events through the ingest durable, acking each
// (a plain ack, unconfirmed, in all), with the same pull batch per partition. The
// clock starts at the first delivery: a worker that joins the group listens joinWait
// (200 ms) for the others before it takes a partition, a one-off cost that would
// otherwise dominate a short run and is not the consume-and-ack path.
func BenchmarkConsume(b *testing.B) {
	for _, tenants := range []int{1, 1000} {
		b.Run("tenants="+strconv.Itoa(tenants), func(b *testing.B) { benchConsume(b, tenants) })
	}
}

// benchConsume is BenchmarkConsume with the events spread round-robin over tenants: one
// tenant is one lane, the least the worker's bookkeeping can cost; a thousand keep many
// lanes ready at once over every partition, as a multi-tenant ingest does.
func benchConsume(b *testing.B, tenants int) {
	topics := []Topic{benchTopic}
	for i := 1; i < tenants; i++ {
		topics = append(topics, Topic{Tenant: TenantID("tenant-" + strconv.Itoa(i)), Table: benchTopic.Table})
	}
	payload := make([]byte, benchPayload)
	fill := func(b *testing.B, e *EmbeddedNATS) {
		b.Helper()
		for _, t := range topics[1:] {
			if err := e.SetMaxBytes(context.Background(), t.Tenant, 1<<40); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < b.N; i++ {
			if err := e.Publish(context.Background(), topics[i%len(topics)], payload); err != nil {
				b.Fatal(err)
			}
		}
	}
	// A run counts its deliveries, restarting the clock at the first; the atomic add
	// orders the reset before the close of done. It also reports the process's CPU
	// time per event (server and client together, both in this process): on a machine
	// whose cores are all busy, the library's own cost shows there first.
	type run struct {
		n    atomic.Int64
		done chan struct{}
		cpu  atomic.Int64 // processCPU at the first delivery
	}
	start := func() *run { return &run{done: make(chan struct{})} }
	count := func(b *testing.B, r *run) {
		switch r.n.Add(1) {
		case 1:
			cpu, _ := processCPU() // where it is not known, it is not reported at the end either
			r.cpu.Store(int64(cpu))
			b.ResetTimer()
			if b.N == 1 {
				close(r.done)
			}
		case int64(b.N):
			close(r.done)
		}
	}
	wait := func(b *testing.B, r *run) {
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			b.Fatalf("consumed %d of %d", r.n.Load(), b.N)
		}
		b.StopTimer()
		if cpu, ok := processCPU(); ok {
			b.ReportMetric(float64(int64(cpu)-r.cpu.Load())/float64(b.N), "cpu-ns/op")
		}
	}
	// raw consumes with nats.go alone; with handOff, its callback passes each event to
	// one goroutine that acks it, the least a consumer that runs tenants in parallel
	// beside its pull must do.
	raw := func(handOff bool) func(b *testing.B) {
		return func(b *testing.B) {
			e := benchBroker(b, true)
			fill(b, e)
			js := rawJS(b, e)
			r := start()
			b.SetBytes(benchPayload)
			handle := func(m jetstream.Msg) {
				_ = m.Ack()
				count(b, r)
			}
			quit := make(chan struct{})
			defer close(quit)
			if handOff {
				events := make(chan jetstream.Msg, e.topo.Prefetch)
				ack := handle
				go func() {
					for {
						select {
						case m := <-events:
							ack(m)
						case <-quit:
							return
						}
					}
				}()
				handle = func(m jetstream.Msg) {
					select {
					case events <- m:
					case <-quit:
					}
				}
			}
			var ccs []jetstream.ConsumeContext
			for p := range e.topo.Partitions {
				cons, err := js.Consumer(context.Background(), e.topo.PartitionStream(p), e.topo.IngestConsumer)
				if err != nil {
					b.Fatal(err)
				}
				cc, err := cons.Consume(handle, jetstream.PullMaxMessages(e.topo.Prefetch/e.topo.Partitions),
					jetstream.PullPriorityGroup(e.topo.IngestGroup))
				if err != nil {
					b.Fatal(err)
				}
				ccs = append(ccs, cc)
			}
			wait(b, r)
			for _, cc := range ccs {
				cc.Stop()
			}
		}
	}
	b.Run("impl=raw", raw(false))
	b.Run("impl=raw-handoff", raw(true))
	b.Run("impl=mq", func(b *testing.B) {
		e := benchBroker(b, true)
		fill(b, e)
		c, err := e.CreateConsumer(context.Background(), ConsumerConfig{Durable: WorkerDurable})
		if err != nil {
			b.Fatal(err)
		}
		r := start()
		b.SetBytes(benchPayload)
		stop, _, err := c.Consume(func(m *Message) error {
			_ = m.Ack()
			count(b, r)
			return nil
		}, 0)
		if err != nil {
			b.Fatal(err)
		}
		wait(b, r)
		stop()
	})
}

// BenchmarkKey: the topic key of a table and scope that need escaping.
func BenchmarkKey(b *testing.B) {
	t := Topic{Tenant: "acme-co", Table: "default.clicks", Scope: "org_" + strconv.Itoa(42)}
	for b.Loop() {
		if _, err := t.Key(); err != nil {
			b.Fatal(err)
		}
	}
}
