//go:build integration

package mq

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The restart matrix for ExternalNATS: the operator's servers restart while the
// worker left its events in one of four states, and afterwards the worker must get
// every confirmed event it has not acknowledged, each tenant's first deliveries in
// publish order. Acknowledged events are never waited for (they may come again: at
// least once); what does come again is counted as a duplicate. Every partition must
// then empty and the history hold each event exactly once: anything else is stuck.
// Before the worker comes back, what the servers keep for it must be what they kept
// before the restarts, event for event and byte for byte (checkKept), and the client,
// which outlives the restarts, must still read the budgets recorded on it.
//
// Dimensions: deployment (one server restarted in-process; a three-node R3 cluster,
// rolled one node at a time or stopped and started whole) x timing (restart at once;
// restart once the history copied everything and the broker idled 2 s) x restarts
// (the servers' first; two more, see matrixRounds) x worker state.
//
// Measured with the durable renamed to sort after "JS_" (Validate bypassed): the
// single server restarted after the history caught up lost every unacknowledged event
// of every state in both rounds; restarted at once it lost none (the source consumer
// had not yet stored its acknowledgements), and the cluster lost none either way.
//
// A worker state is one partition's: the shipped topology has four partitions, and
// each state's tenants hash to their own, whose durable and history source the server
// keeps apart from the others'. So one fixture carries all four states through the
// same restarts, and the fixtures (deployment x timing) run side by side: they mostly
// wait on the servers' timers. Measured: a history's sources re-attach about 20 s
// after a single server restarts, at once after a rolling restart, and 36-41 s (once
// about 80 s) after the whole cluster stopped and started: the history's first request
// for a source consumer goes unanswered while the partitions elect their leaders, and
// the server waits 30 s for it (stream.go, srcConsumerWaitTime) before retrying with a
// backoff of 10 s per failure up to 2 min (calculateRetryBackoff). Hence the waits on
// the history below are bounded generously.

// matrixState is what the worker did with a partition's events before the restart.
type matrixState int

const (
	nothingDelivered matrixState = iota // published after the worker stopped: never delivered
	someHeld                            // the older half acked, the newer half held unsettled
	someNaked                           // every other one acked, the rest nak'ed (their redeliveries held)
	acksOutOfOrder                      // all held, then two in three acked newest first: the ack floor stays below them
	matrixStates
)

func (s matrixState) String() string {
	return [...]string{"nothing delivered", "some held unsettled", "some nak'ed", "acks out of order"}[s]
}

const (
	// matrixAckWait is the durable's, as the operator applies it here: short, so that
	// what the worker held comes back within the test.
	matrixAckWait         = 2 * time.Second
	matrixTenantsPerState = 2
	matrixEventsPerTenant = 15
	// matrixIdle is how long the broker idles after the history caught up, as a host
	// does before a restart.
	matrixIdle = 2 * time.Second
)

// matrixEvent is one published (and confirmed) event and what became of it.
type matrixEvent struct {
	round  int
	state  matrixState
	tenant TenantID
	index  int  // publish order within its tenant
	acked  bool // acknowledged before its round's restart, confirmed by the server
	first  int  // rank of its first delivery in the run, 0 while never delivered
	after  int  // deliveries after its round's restart
	done   bool // delivered after the restart and acknowledged
	// bytes is what storing it added to its partition's bytes, as the server counts
	// them: what the partition keeps for it while it is not acknowledged.
	bytes uint64
}

// matrixRounds are how often the servers restart between the worker leaving its
// events and coming back: round 1 is the servers' first restart; round 2 carries its
// events through two more, a server restarted before restarting again, twice.
var matrixRounds = [...]struct {
	name     string
	restarts int
}{{"first restart", 1}, {"later restarts (2nd and 3rd)", 2}}

// matrixRun is one fixture's pass through every round.
type matrixRun struct {
	name    string
	f       *externalFixture
	e       *ExternalNATS
	topo    NATSTopology
	idle    bool
	restart func(t *testing.T, before func())
	tenants [matrixStates][]TenantID

	mu        sync.Mutex
	events    map[string]*matrixEvent
	firsts    int
	published uint64
	stale     int // deliveries of an earlier round's events in this one
}

// matrixTenants picks, for each state, tenants hashing to the partition of that
// state's number.
func matrixTenants(t *testing.T, partitions int) (out [matrixStates][]TenantID) {
	t.Helper()
	require.Equal(t, int(matrixStates), partitions, "one partition per worker state")
	for i := 0; ; i++ {
		tenant := TenantID("tenant-" + strconv.Itoa(i))
		if p := matrixState(Partition(tenant, partitions)); len(out[p]) < matrixTenantsPerState {
			out[p] = append(out[p], tenant)
		}
		full := true
		for _, ts := range out {
			full = full && len(ts) == matrixTenantsPerState
		}
		if full {
			return out
		}
	}
}

// withMatrixAckWait gives every ingest durable the matrix's short ack wait.
func withMatrixAckWait(t *testing.T) func(*shape) {
	return func(s *shape) {
		for p := range s.topo.Partitions {
			s.consumer(t, s.topo.PartitionStream(p)).AckWait = matrixAckWait
		}
	}
}

func runRestartMatrix(t *testing.T, name string, f *externalFixture, idle bool, restart func(*testing.T, func())) {
	t.Helper()
	e := f.broker(t, func(c *NATSConfig) {
		c.AckWait = matrixAckWait
		c.TopologyWait = time.Minute
	})
	r := &matrixRun{name: name, f: f, e: e, topo: e.topo, idle: idle, restart: restart,
		tenants: matrixTenants(t, e.topo.Partitions), events: map[string]*matrixEvent{}}
	for _, tenant := range slices.Concat(r.tenants[:]...) {
		require.NoError(t, e.SetMaxBytes(t.Context(), tenant, matrixBudget(tenant)))
	}
	for round := range matrixRounds {
		r.runRound(t, round+1)
	}
}

func (r *matrixRun) runRound(t *testing.T, round int) {
	t.Helper()
	// Status waits PublishTimeout for the consumer list the restricted user is refused,
	// and then trusts the refusal for a minute: read once now, so that the read before
	// a restart at once does not hold the restart back.
	r.partitionStatus(t)
	r.publish(t, round, someHeld, someNaked, acksOutOfOrder)
	r.workBeforeRestart(t, round)
	untouched := r.partition(nothingDelivered)
	delivered := r.durableInfo(t, untouched).Delivered.Consumer
	r.publish(t, round, nothingDelivered)
	require.Equal(t, delivered, r.durableInfo(t, untouched).Delivered.Consumer,
		"round %d: the durable delivered events published after the worker stopped", round)

	// Measured, never asserted: how long the restart itself took (without the waits
	// for the history and the reads of what the servers keep) and how long until
	// everything settled after it.
	began, waited := time.Now(), time.Duration(0)
	var kept []PartitionStatus
	for range matrixRounds[round-1].restarts {
		r.restart(t, func() {
			w := time.Now()
			if r.idle {
				r.awaitHistoryCaughtUp(t)
				time.Sleep(matrixIdle)
			}
			if kept == nil { // before the round's first restart, once idle
				kept = r.keptBefore(t, round)
			}
			waited += time.Since(w)
		})
	}
	restarting, restarted := time.Since(began)-waited, time.Now()
	for _, tenant := range slices.Concat(r.tenants[:]...) {
		assert.Equal(t, matrixBudget(tenant), r.e.MaxBytes(tenant), "%s round %d: the budget recorded for %s after the restart", r.name, round, tenant)
	}
	r.checkKept(t, round, kept)
	r.deliverAfterRestart(t, round)
	settled := time.Since(restarted)
	r.report(t, round)
	r.awaitPartitionsEmptyAndHistoryExact(t, round)
	t.Logf("restart matrix: %s, %s: measured: waiting for the history and idling took %v, restarting %v, the worker had every unacknowledged event and the durables were idle %v after it, the partitions were empty and the history complete %v after it",
		r.name, matrixRounds[round-1].name, waited.Round(100*time.Millisecond), restarting.Round(100*time.Millisecond), settled.Round(100*time.Millisecond), time.Since(restarted).Round(100*time.Millisecond))
}

// partition is the stream of state's tenants.
func (r *matrixRun) partition(s matrixState) string { return r.topo.PartitionStream(int(s)) }

// matrixBudget is the budget the matrix records for tenant, a different one each.
func matrixBudget(tenant TenantID) int64 {
	n, _ := strconv.Atoi(strings.TrimPrefix(string(tenant), "tenant-"))
	return int64(n+1) << 20
}

// publish stores the round's events of states, the tenants' interleaved, over two
// tables each so a tenant's order spans subjects. One call at a time, on partitions
// nothing is taken from meanwhile (no worker has acknowledged any of the round's
// events, and the earlier rounds' are gone): each event's bytes are what its publish
// added to its partition.
func (r *matrixRun) publish(t *testing.T, round int, states ...matrixState) {
	t.Helper()
	ctx := testCtx(t)
	bytes := map[matrixState]uint64{}
	for _, s := range states {
		bytes[s] = r.streamBytes(t, r.partition(s))
	}
	for i := range matrixEventsPerTenant {
		for _, s := range states {
			for _, tenant := range r.tenants[s] {
				data := fmt.Sprintf("r%d/%s/%02d", round, tenant, i)
				require.NoError(t, r.e.Publish(ctx, Topic{Tenant: tenant, Table: "t" + strconv.Itoa(i%2)}, []byte(data)))
				was := bytes[s]
				bytes[s] = r.streamBytes(t, r.partition(s))
				require.Greater(t, bytes[s], was, "%s: publishing %s added no bytes to %s", r.name, data, r.partition(s))
				r.mu.Lock()
				r.events[data] = &matrixEvent{round: round, state: s, tenant: tenant, index: i, bytes: bytes[s] - was}
				r.published++
				r.mu.Unlock()
			}
		}
	}
}

// deliver records a delivery of m and reports whether it is the event's first.
func (r *matrixRun) deliver(t *testing.T, m *Message, round int, afterRestart bool) (*matrixEvent, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events[string(m.Data)]
	if ev == nil {
		t.Errorf("%s: delivered an event never published: %q", r.name, m.Data)
		return nil, false
	}
	if ev.round < round {
		r.stale++
	}
	if afterRestart && ev.round == round {
		ev.after++
	}
	if ev.first > 0 {
		return ev, false
	}
	r.firsts++
	ev.first = r.firsts
	return ev, true
}

// ack acknowledges m and waits for the server's confirmation; only a confirmed ack
// takes the event out of what must come after the restart.
func (r *matrixRun) ack(m *Message) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.DoubleAck(ctx) == nil
}

// workBeforeRestart runs the worker until it has put the round's events of every
// state but nothingDelivered into their state, then stops it and waits until no pull
// of it is left on the server.
func (r *matrixRun) workBeforeRestart(t *testing.T, round int) {
	t.Helper()
	c := r.consumer(t)
	want := (int(matrixStates) - 1) * matrixTenantsPerState * matrixEventsPerTenant
	var mu sync.Mutex
	var outOfOrder []*Message
	firsts, inflight := 0, 0
	done := make(chan struct{})
	var once sync.Once
	stop, failed, err := c.Consume(func(m *Message) error {
		mu.Lock()
		inflight++
		mu.Unlock()
		ev, first := r.deliver(t, m, round, false)
		if ev != nil && first {
			switch ev.state {
			case someHeld:
				if ev.index < matrixEventsPerTenant/2 {
					r.setAcked(ev, r.ack(m))
				}
			case someNaked:
				if ev.index%2 == 0 {
					r.setAcked(ev, r.ack(m))
				} else {
					_ = m.Nak()
				}
			case acksOutOfOrder:
				mu.Lock()
				outOfOrder = append(outOfOrder, m)
				all := len(outOfOrder) == matrixTenantsPerState*matrixEventsPerTenant
				mu.Unlock()
				if all {
					// One partition's callbacks run one at a time: nothing is appended
					// meanwhile.
					for _, held := range slices.Backward(outOfOrder) {
						if ev := r.lookup(held); ev.index%3 != 0 {
							r.setAcked(ev, r.ack(held))
						}
					}
				}
			case nothingDelivered:
				t.Errorf("%s round %d: an event of %q was delivered before the restart", r.name, round, ev.state)
			}
		}
		// Redeliveries are held: the worker has not finished them.
		mu.Lock()
		defer mu.Unlock()
		inflight--
		if first {
			firsts++
		}
		if firsts == want && inflight == 0 {
			once.Do(func() { close(done) })
		}
		return nil
	}, 256)
	require.NoError(t, err)
	select {
	case <-done:
	case err := <-failed:
		t.Fatalf("%s round %d: delivery ended before the restart: %v", r.name, round, err)
	case <-time.After(time.Minute):
		t.Fatalf("%s round %d: the worker never got the round's events", r.name, round)
	}
	stop()
	r.awaitNoPulls(t)
}

func (r *matrixRun) lookup(m *Message) *matrixEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events[string(m.Data)]
}

func (r *matrixRun) setAcked(ev *matrixEvent, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev.acked = ok
}

// consumer returns the worker's consumer, once the broker can find the durables again.
func (r *matrixRun) consumer(t *testing.T) Consumer {
	t.Helper()
	var c Consumer
	require.Eventually(t, func() bool {
		var err error
		c, err = r.e.CreateConsumer(t.Context(), ConsumerConfig{Durable: WorkerDurable})
		return err == nil
	}, time.Minute, 100*time.Millisecond, "%s: the worker's consumer never came back", r.name)
	return c
}

// missing counts the round's events not acknowledged before the restart and not yet
// delivered and acknowledged after it.
func (r *matrixRun) missing(round int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ev.round == round && !ev.acked && !ev.done {
			n++
		}
	}
	return n
}

// deliverAfterRestart runs the worker, acknowledging everything, until every event
// of the round it had not acknowledged before the restart came and was acknowledged
// (or a generous bound passed: then report counts the lost), and until no durable has
// anything left to deliver, so every duplicate is counted.
func (r *matrixRun) deliverAfterRestart(t *testing.T, round int) {
	t.Helper()
	c := r.consumer(t)
	stop, failed, err := c.Consume(func(m *Message) error {
		ev, _ := r.deliver(t, m, round, true)
		if !r.ack(m) {
			return fmt.Errorf("ack failed") // nak'ed: it comes again
		}
		if ev != nil && ev.round == round {
			r.mu.Lock()
			ev.done = true
			r.mu.Unlock()
		}
		return nil
	}, 256)
	require.NoError(t, err)
	defer func() {
		stop()
		r.awaitNoPulls(t)
	}()
	// A lost event never comes: bounded, and the loss is reported with the counts.
	deadline := time.Now().Add(90 * time.Second)
	for r.missing(round) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		for p := range r.topo.Partitions {
			ci := r.durableInfo(t, r.topo.PartitionStream(p))
			if ci == nil || ci.NumPending > 0 || ci.NumAckPending > 0 {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "%s round %d: a durable kept events it never delivered or that were never settled", r.name, round)
	select {
	case err := <-failed:
		t.Fatalf("%s round %d: delivery ended after the restart: %v", r.name, round, err)
	default:
	}
}

// report logs one line per state of the round, and asserts none lost and every
// tenant's first deliveries in publish order.
func (r *matrixRun) report(t *testing.T, round int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range matrixStates {
		var confirmed, acked, delivered, after, again int
		byTenant := map[TenantID][]*matrixEvent{}
		for _, ev := range r.events {
			if ev.round != round || ev.state != s {
				continue
			}
			confirmed++
			after += ev.after
			switch {
			case ev.acked:
				acked++
				if ev.after > 0 {
					again++
				}
			case ev.after > 0:
				delivered++
			}
			if ev.first > 0 {
				byTenant[ev.tenant] = append(byTenant[ev.tenant], ev)
			}
		}
		unacked := confirmed - acked
		lost := unacked - delivered
		inOrder := true
		for tenant, evs := range byTenant {
			slices.SortFunc(evs, func(a, b *matrixEvent) int { return a.first - b.first })
			for i := 1; i < len(evs); i++ {
				if evs[i].index < evs[i-1].index {
					inOrder = false
					t.Errorf("%s round %d %s: tenant %s first got event %d after %d", r.name, round, s, tenant, evs[i].index, evs[i-1].index)
				}
			}
		}
		t.Logf("restart matrix: %s, %s, %s: confirmed %d, acked before %d, delivered after %d of %d unacked, lost %d, duplicates %d (acked ones again %d), first deliveries in tenant order %v",
			r.name, matrixRounds[round-1].name, s, confirmed, acked, delivered, unacked, lost, after-delivered, again, inOrder)
		assert.Zero(t, lost, "%s round %d %s: confirmed events the worker never acknowledged were not delivered after the restart", r.name, round, s)
		assert.Equal(t, matrixTenantsPerState*matrixEventsPerTenant, confirmed)
	}
	if r.stale > 0 {
		t.Logf("restart matrix: %s, %s: %d deliveries of earlier rounds' acknowledged events", r.name, matrixRounds[round-1].name, r.stale)
		r.stale = 0
	}
}

// partitionStatus is each partition as the library's Status reads it, as mqctl status
// shows it (the workers' heartbeats are not listened for).
func (r *matrixRun) partitionStatus(t *testing.T) []PartitionStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := r.e.Status(ctx, StatusOptions{ListenWorkers: time.Nanosecond})
	require.NoError(t, err, "%s: status", r.name)
	return st.Partitions
}

// unacked is, for each partition, its Partition, Stream, and the Messages and Bytes of
// the round's events the worker left unacknowledged.
func (r *matrixRun) unacked(round int) []PartitionStatus {
	var want []PartitionStatus
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.topo.Partitions {
		want = append(want, PartitionStatus{Partition: p, Stream: r.topo.PartitionStream(p)})
	}
	for _, ev := range r.events {
		if ev.round == round && !ev.acked {
			w := &want[Partition(ev.tenant, r.topo.Partitions)]
			w.Messages++
			w.Bytes += ev.bytes
		}
	}
	return want
}

// keptBefore is each partition as Status reads it before a restart, once every durable
// has counted what the worker left unacknowledged. The server counts a stored event
// into its durables' pending asynchronously (nats-server's signalConsumersLoop), so a
// read right after the last publish can be short: measured once in CI, one event short
// on the partition published to just before a restart at once. A lost event is never
// counted, so this returns the last read after a while and checkKept reports it.
func (r *matrixRun) keptBefore(t *testing.T, round int) []PartitionStatus {
	t.Helper()
	want := r.unacked(round)
	var kept []PartitionStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		kept = r.partitionStatus(t)
		counted := len(kept) == len(want)
		for p := 0; counted && p < len(kept); p++ {
			counted = kept[p].Pending+kept[p].AckPending == want[p].Messages
		}
		if counted || time.Now().After(deadline) {
			return kept
		}
	}
}

// checkKept checks, by the library's Status, that what the servers keep for the worker
// came through the restarts exactly. Each partition's durable has as many events to
// deliver or awaiting an ack (Pending + AckPending) as the worker left unacknowledged,
// before the restarts (kept) and after them. A partition also holds acknowledged
// events until the history's source has taken them, whenever that is (before, during
// or after a restart at once), so once it has let go of them (Messages == Pending +
// AckPending: nothing held for the history), it must hold those events and their bytes
// exactly, each event's as the server counted them when it stored it. Where nothing
// was held for the history before the restarts either (the partition nothing was
// delivered from; every partition once the history caught up and idled, as measured),
// its messages and bytes are the same as before.
func (r *matrixRun) checkKept(t *testing.T, round int, kept []PartitionStatus) {
	t.Helper()
	want := r.unacked(round)
	require.Len(t, kept, len(want))
	for p, k := range kept {
		assert.Equal(t, want[p].Messages, k.Pending+k.AckPending,
			"%s round %d: before the restart, %s's durable keeps the events the worker left unacknowledged", r.name, round, k.Stream)
	}
	var after []PartitionStatus
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		st, err := r.e.Status(ctx, StatusOptions{ListenWorkers: time.Nanosecond})
		if err != nil {
			return false
		}
		after = st.Partitions
		for _, a := range after {
			if a.Messages != a.Pending+a.AckPending {
				return false
			}
		}
		return true
	}, 4*time.Minute, 100*time.Millisecond, "%s round %d: a partition never let go of the acknowledged events", r.name, round)
	var heldBefore []string
	for p, a := range after {
		k := kept[p]
		assert.Equal(t, k.Pending+k.AckPending, a.Pending+a.AckPending,
			"%s round %d: %s's durable keeps after the restart what it kept before", r.name, round, a.Stream)
		assert.Equal(t, want[p], PartitionStatus{Partition: a.Partition, Stream: a.Stream, Messages: a.Messages, Bytes: a.Bytes},
			"%s round %d: %s holds exactly the unacknowledged events and their bytes after the restart", r.name, round, a.Stream)
		if k.Messages == k.Pending+k.AckPending {
			assert.Equal(t, [2]uint64{k.Messages, k.Bytes}, [2]uint64{a.Messages, a.Bytes},
				"%s round %d: %s's messages and bytes after the restart are those before it", r.name, round, a.Stream)
		} else {
			heldBefore = append(heldBefore, fmt.Sprintf("%s %d", a.Stream, k.Messages-k.Pending-k.AckPending))
		}
	}
	t.Logf("restart matrix: %s, %s: acknowledged events held for the history before the restart: %v",
		r.name, matrixRounds[round-1].name, heldBefore)
}

// awaitPartitionsEmptyAndHistoryExact waits until every partition let go of what the
// worker acknowledged and the history copied (a partition that keeps them is stuck
// and fills up), and checks the history holds every event exactly once.
func (r *matrixRun) awaitPartitionsEmptyAndHistoryExact(t *testing.T, round int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for p := range r.topo.Partitions {
			if n, ok := r.streamMsgs(t, r.topo.PartitionStream(p)); !ok || n > 0 {
				return false
			}
		}
		return true
	}, 4*time.Minute, 100*time.Millisecond, "%s round %d: a partition still holds acknowledged events", r.name, round)
	require.Eventually(t, func() bool {
		n, ok := r.streamMsgs(t, r.topo.HistoryStream)
		return ok && n >= r.published
	}, 4*time.Minute, 100*time.Millisecond, "%s round %d: the history never got every event", r.name, round)
	n, _ := r.streamMsgs(t, r.topo.HistoryStream)
	assert.Equal(t, r.published, n, "%s round %d: the history holds every event exactly once", r.name, round)
}

// awaitHistoryCaughtUp waits until the history holds every event and every source is
// attached with nothing left to copy.
func (r *matrixRun) awaitHistoryCaughtUp(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := r.f.admin.Stream(ctx, r.topo.HistoryStream)
		if err != nil {
			return false
		}
		info := s.CachedInfo()
		if info.State.Msgs != r.published || len(info.Sources) != r.topo.Partitions {
			return false
		}
		for _, src := range info.Sources {
			if src.Active < 0 || src.Lag > 0 {
				return false
			}
		}
		return true
	}, 4*time.Minute, 50*time.Millisecond, "%s: the history never caught up", r.name)
}

// awaitNoPulls waits until no durable holds a pull request of a stopped worker, so
// nothing published next reaches it.
func (r *matrixRun) awaitNoPulls(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for p := range r.topo.Partitions {
			if ci := r.durableInfo(t, r.topo.PartitionStream(p)); ci == nil || ci.NumWaiting > 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "%s: a stopped worker's pull stayed on the server", r.name)
}

// durableInfo reads the ingest durable on stream as the operator; nil while the
// cluster cannot answer.
func (r *matrixRun) durableInfo(t *testing.T, stream string) *jetstream.ConsumerInfo {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := r.f.admin.Consumer(ctx, stream, r.topo.IngestConsumer)
	if err != nil {
		return nil
	}
	return c.CachedInfo()
}

// streamBytes is what stream holds, in bytes, read as the operator.
func (r *matrixRun) streamBytes(t *testing.T, stream string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := r.f.admin.Stream(ctx, stream)
	require.NoError(t, err)
	return s.CachedInfo().State.Bytes
}

func (r *matrixRun) streamMsgs(t *testing.T, stream string) (uint64, bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := r.f.admin.Stream(ctx, stream)
	if err != nil {
		return 0, false
	}
	return s.CachedInfo().State.Msgs, true
}

// matrixTimings are the restart timings, by name: at once, or once idle.
var matrixTimings = []struct {
	name string
	idle bool
}{{"at once", false}, {"after the history caught up and the broker idled", true}}

// runConcurrently runs each cell as a subtest, all at once whatever -parallel says:
// they mostly wait on the servers' timers.
func runConcurrently(t *testing.T, cells map[string]func(*testing.T)) {
	var wg sync.WaitGroup
	for name, cell := range cells {
		wg.Go(func() { t.Run(name, cell) })
	}
	wg.Wait()
}

func TestExternalNATS_ARestartedSingleServerDeliversEveryUnacknowledgedEvent(t *testing.T) {
	t.Parallel()
	cells := map[string]func(*testing.T){}
	for _, timing := range matrixTimings {
		name := "single server, restart " + timing.name
		cells[name] = func(t *testing.T) {
			f := newValuesFixture(t)
			ef := &externalFixture{natsFixture: f, shape: f.applyShipped(t, 1, withMatrixAckWait(t))}
			runRestartMatrix(t, name, ef, timing.idle, func(t *testing.T, before func()) {
				before()
				f.stop(t)
				f.restart(t)
			})
		}
	}
	runConcurrently(t, cells)
}

// The rolling restart at once can fail here through a nats-server race that drops
// events a durable delivered and was not acknowledged for (README, "A nats-server race
// on a cluster"; measured: 2 in 131 runs of that cell). It is kept, not skipped: a
// loss from the library would look the same.
func TestExternalNATS_ARestartedThreeNodeClusterDeliversEveryUnacknowledgedEvent(t *testing.T) {
	t.Parallel()
	cells := map[string]func(*testing.T){}
	for _, kind := range []string{"rolling restart", "full stop and start"} {
		for _, timing := range matrixTimings {
			name := "R3 cluster, " + kind + " " + timing.name
			cells[name] = func(t *testing.T) {
				c := newClusterFixture(t, 3)
				ef := &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(t, 3, withMatrixAckWait(t))}
				restart := c.rollingRestart
				if strings.HasPrefix(kind, "full") {
					restart = c.fullRestart
				}
				runRestartMatrix(t, name, ef, timing.idle, restart)
			}
		}
	}
	runConcurrently(t, cells)
}
