package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "bench",
		summary: "publish and batch throughput of the library beside raw nats.go on a live cluster, ratios side by side",
		usage: "-url nats://host:4222[,...] [-events 10000] [-callers 32] [-batch 100] [-payload 256] [-tenant mqctl-bench] " +
			"[auth flags] [topology flags]",
		run: runBench,
	})
}

// benchNote is the part of bench's help an operator must read before running it.
const benchNote = `
bench publishes real events into the existing topology, through ExternalNATS (which
creates nothing) and through a plain nats.go connection with the same options to the
same subjects: 6 x -events in all, under the given tenant and table "bench". They go
to that tenant's ingest partition, so the ingest workers consume them (and the
history keeps them) like any other tenant's: pick a tenant the application ignores.
Each phase runs raw, mq, mq, raw on halves of its calls, so a cluster slowing down
through the run weighs on both alike.
`

// benchTable is the table every bench event is published to.
const benchTable = "bench"

// benchPhase is one row of the table: calls numbered 0..calls-1, call i sending
// size(i) events, done by raw nats.go and by the library.
type benchPhase struct {
	name    string
	calls   int
	size    func(i int) int
	raw, mq func(ctx context.Context, size int) error
}

// benchRun is what one impl measured in one phase.
type benchRun struct {
	events  int
	elapsed time.Duration
	lat     []time.Duration // one per call
}

func (r benchRun) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.events) / r.elapsed.Seconds()
}

// quantile returns the q-quantile of the calls' latencies (nearest rank).
func (r benchRun) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (r *benchRun) add(o benchRun) {
	r.events += o.events
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
}

// benchRow is one finished (or running) phase.
type benchRow struct {
	name    string
	raw, mq benchRun
}

func runBench(ctx context.Context, e *env, args []string) int {
	c := commands["bench"]
	fs := c.flags(e)
	base := fs.Usage
	fs.Usage = func() { base(); fmt.Fprint(fs.Output(), benchNote) }
	nf := addNATSFlags(fs, waitVerifies)
	events := fs.Int("events", 10000, "events per phase and impl")
	callers := fs.Int("callers", 32, "concurrent callers in every phase")
	batch := fs.Int("batch", 100, fmt.Sprintf("events per batch, 1 to %d (an atomic batch's limit)", mq.MaxAtomicBatch))
	payload := fs.Int("payload", 256, "bytes per event")
	tenant := fs.String("tenant", "mqctl-bench", "the tenant the events are published under")
	if code := parse(e, fs, args); code >= 0 {
		return code
	}
	cfg, ok := nf.config(fs)
	if !ok {
		return 2
	}
	topic := mq.Topic{Tenant: mq.TenantID(*tenant), Table: benchTable}
	var bad error
	switch {
	case *events <= 0 || *callers <= 0 || *payload < 0:
		bad = errors.New("-events and -callers must be positive, -payload not negative")
	case *batch <= 0 || *batch > mq.MaxAtomicBatch:
		bad = fmt.Errorf("-batch must be 1 to %d", mq.MaxAtomicBatch)
	default:
		bad = topic.Validate()
	}
	if bad != nil {
		fmt.Fprintf(e.stderr, "mqctl bench: %v\n", bad)
		return 2
	}

	broker, err := mq.NewNATS(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl bench: %v\n", err)
		return connectExit(err)
	}
	defer broker.Close()
	// ExternalNATS records budgets without enforcing them (the tenants of a partition
	// share its max_bytes), so bench sets none: the partition's own limits apply.
	raw, err := newRawPublisher(ctx, cfg, topic)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl bench: raw nats.go: %v\n", err)
		return 1
	}
	defer raw.js.Conn().Close()

	data := make([]byte, *payload)
	phases := benchPhases(broker, raw, topic, data, *events, *batch)
	header := fmt.Sprintf("publishing %d events of %d B under tenant %s, table %s, subject %s (stream %s),\n"+
		"%d callers, batches of %d; the ingest workers consume them like any tenant's\n\n",
		6**events, *payload, topic.Tenant, benchTable, raw.subject, raw.stream, *callers, *batch)
	live := isTerminal(e.stdout)
	if !live {
		fmt.Fprint(e.stdout, header)
	}
	// A live table is written before the first phase too, so nothing is published
	// when the results could not be shown.
	const results = "the bench's table"
	if live {
		var out bytes.Buffer
		out.WriteString(clearScreen + header)
		writeBench(&out, nil)
		_, _ = e.stdout.Write(out.Bytes())
	}
	if e.outputLost("mqctl bench", results) {
		return 1
	}
	rows := make([]benchRow, 0, len(phases))
	for _, ph := range phases {
		rows = append(rows, benchRow{name: ph.name})
		row := &rows[len(rows)-1]
		half := ph.calls / 2
		// raw, mq, mq, raw: each impl gets one early and one late half.
		for _, step := range []struct {
			mq       bool
			from, to int
		}{{false, 0, half}, {true, 0, half}, {true, half, ph.calls}, {false, half, ph.calls}} {
			call, into := ph.raw, &row.raw
			if step.mq {
				call, into = ph.mq, &row.mq
			}
			r, err := measure(ctx, *callers, step.from, step.to, ph.size, call)
			into.add(r)
			if live {
				var out bytes.Buffer
				out.WriteString(clearScreen + header)
				writeBench(&out, rows)
				_, _ = e.stdout.Write(out.Bytes())
			}
			if err != nil {
				if !live {
					writeBench(e.stdout, rows)
				}
				impl := "raw"
				if step.mq {
					impl = "mq"
				}
				fmt.Fprintf(e.stderr, "mqctl bench: %s, %s: %v\n", ph.name, impl, err)
				return 1
			}
			if e.outputLost("mqctl bench", results) {
				return 1
			}
		}
	}
	if !live {
		writeBench(e.stdout, rows)
	}
	if e.outputLost("mqctl bench", results) {
		return 1
	}
	return 0
}

// rawPublisher is the nats.go baseline: the connection ExternalNATS would dial, the
// subject and stream the library publishes topic's events to.
type rawPublisher struct {
	js              jetstream.JetStream
	subject, stream string
	stall           time.Duration // how long PublishAsync waits for room in the window
}

func newRawPublisher(ctx context.Context, cfg mq.NATSConfig, topic mq.Topic) (*rawPublisher, error) {
	nc, err := mq.ConnectNATS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// The window and the timeout of the library's pipelined batches: without a timeout
	// a lost answer would hold the run forever.
	topo := cfg.NATSTopology.WithDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096), jetstream.WithPublishAsyncTimeout(topo.PublishTimeout))
	if err != nil {
		nc.Close()
		return nil, err
	}
	// The ingest subject as the operator's manifests filter it,
	// <prefix>.ingest.<partition>.<topic key>; the stream is found by subject, as
	// ExternalNATS finds it, since the operator may name it anything.
	key, err := topic.Key()
	if err != nil {
		nc.Close()
		return nil, err
	}
	subject := topo.Prefix + ".ingest." + strconv.Itoa(mq.Partition(topic.Tenant, topo.Partitions)) + "." + key
	stream, err := js.StreamNameBySubject(ctx, subject)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("find the stream of %s: %w", subject, err)
	}
	return &rawPublisher{js: js, subject: subject, stream: stream, stall: topo.PublishTimeout}, nil
}

// publish is nats.go's synchronous publish, with a message id as the library sends.
func (p *rawPublisher) publish(ctx context.Context, data []byte) error {
	_, err := p.js.Publish(ctx, p.subject, data, jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(p.stream))
	return err
}

// publishAsync sends size events with PublishAsync, then waits for every ack. A full
// window is waited on, as the library's pipelined batch waits, so callers x batch
// above the window slows both alike instead of failing raw.
func (p *rawPublisher) publishAsync(ctx context.Context, data []byte, size int) error {
	futures := make([]jetstream.PubAckFuture, size)
	for i := range futures {
		f, err := p.js.PublishAsync(p.subject, data, jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(p.stream),
			jetstream.WithStallWait(p.stall))
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
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// benchPhases are the table's rows: single publishes, then batches of batch events
// pipelined and atomic, each against raw PublishAsync.
func benchPhases(b *mq.ExternalNATS, raw *rawPublisher, topic mq.Topic, data []byte, events, batch int) []benchPhase {
	one := func(int) int { return 1 }
	batches := (events + batch - 1) / batch
	batchSize := func(i int) int {
		if i == batches-1 {
			return events - i*batch
		}
		return batch
	}
	mqBatch := func(atomic bool) func(context.Context, int) error {
		return func(ctx context.Context, size int) error {
			bt := mq.Batch{Tenant: topic.Tenant, Atomic: atomic, Events: make([]mq.BatchEvent, size)}
			for i := range bt.Events {
				bt.Events[i] = mq.BatchEvent{Table: topic.Table, Data: data}
			}
			return b.PublishBatch(ctx, bt)
		}
	}
	rawAsync := func(ctx context.Context, size int) error { return raw.publishAsync(ctx, data, size) }
	return []benchPhase{
		{
			name: "publish", calls: events, size: one,
			raw: func(ctx context.Context, _ int) error { return raw.publish(ctx, data) },
			mq:  func(ctx context.Context, _ int) error { return b.Publish(ctx, topic, data) },
		},
		{name: "batch-pipelined", calls: batches, size: batchSize, raw: rawAsync, mq: mqBatch(false)},
		{name: "batch-atomic", calls: batches, size: batchSize, raw: rawAsync, mq: mqBatch(true)},
	}
}

// measure makes calls from..to-1 from up to callers goroutines, timing each call and
// the whole; it stops at the first error.
func measure(ctx context.Context, callers, from, to int, size func(int) int, call func(context.Context, int) error) (benchRun, error) {
	if from >= to {
		return benchRun{}, nil
	}
	var (
		next   atomic.Int64
		mu     sync.Mutex
		run    benchRun
		first  error
		wg     sync.WaitGroup
		failed atomic.Bool
	)
	next.Store(int64(from))
	start := time.Now()
	for range min(callers, to-from) {
		wg.Go(func() {
			var lat []time.Duration
			events := 0
			defer func() {
				mu.Lock()
				run.lat = append(run.lat, lat...)
				run.events += events
				mu.Unlock()
			}()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				n := size(i)
				t0 := time.Now()
				if err := call(ctx, n); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					failed.Store(true)
					return
				}
				lat = append(lat, time.Since(t0))
				events += n
			}
		})
	}
	wg.Wait()
	run.elapsed = time.Since(start)
	return run, first
}

// writeBench prints the rows as a table, in the spirit of nats bench: events/s of
// each impl, their ratio, and the latency of one call.
func writeBench(w io.Writer, rows []benchRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tRAW EVENTS/S\tMQ EVENTS/S\tMQ/RAW\tRAW P50\tRAW P99\tMQ P50\tMQ P99")
	for _, r := range rows {
		ratio := "-"
		if r.raw.rate() > 0 && r.mq.rate() > 0 {
			ratio = fmt.Sprintf("%.2f", r.mq.rate()/r.raw.rate())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.name, rate(r.raw), rate(r.mq), ratio,
			latency(r.raw, 0.5), latency(r.raw, 0.99), latency(r.mq, 0.5), latency(r.mq, 0.99))
	}
	_ = tw.Flush()
}

func rate(r benchRun) string {
	if r.events == 0 {
		return "-"
	}
	return strconv.FormatFloat(r.rate(), 'f', 0, 64)
}

func latency(r benchRun, q float64) string {
	if len(r.lat) == 0 {
		return "-"
	}
	return r.quantile(q).Round(time.Microsecond).String()
}
