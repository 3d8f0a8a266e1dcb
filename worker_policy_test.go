//go:build integration

package mq

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The worker's policy (issue 8) on EmbeddedNATS: per-tenant lanes with a concurrency
// beyond the partition count, the poison policy, and the graceful stop.

// tenantsOn returns n budgeted tenants, all on the partition of the first.
func tenantsOn(t *testing.T, e *EmbeddedNATS, n int) []TenantID {
	t.Helper()
	var out []TenantID
	want := -1
	for i := 0; len(out) < n; i++ {
		id := TenantID(fmt.Sprintf("tenant-%d", i))
		_, p, err := e.core.subs.ingestTopic(Topic{Tenant: id, Table: "t"})
		require.NoError(t, err)
		if want < 0 {
			want = p
		}
		if p == want {
			require.NoError(t, e.SetMaxBytes(testCtx(t), id, 1<<20))
			out = append(out, id)
		}
	}
	return out
}

// attemptLog records each handler call.
type attemptLog struct {
	mu    sync.Mutex
	calls []call
}

type call struct {
	tenant  TenantID
	data    string
	attempt int
	at      time.Time
}

func (a *attemptLog) add(m *Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, call{m.Topic().Tenant, string(m.Data), m.Attempt, time.Now()})
}

func (a *attemptLog) snapshot() []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]call(nil), a.calls...)
}

// index is the position of the first call for data (at attempt, or any when 0).
func (a *attemptLog) index(data string, attempt int) int {
	for i, c := range a.snapshot() {
		if c.data == data && (attempt == 0 || c.attempt == attempt) {
			return i
		}
	}
	return -1
}

func TestWorker_APoisonEventIsRetriedWithAGrowingDelayThenParkedWithWhyAndItsTenantMovesOn(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenants := tenantsOn(t, e, 2)
	poisoned, other := tenants[0], tenants[1]
	const maxDeliveries = 4
	delay, maxDelay := 100*time.Millisecond, 300*time.Millisecond
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{MaxDeliveries: maxDeliveries, RetryDelay: delay, MaxRetryDelay: maxDelay})
	require.NoError(t, err)
	log := &attemptLog{}
	done := make(chan struct{})
	closeDone := sync.OnceFunc(func() { close(done) })
	stop, _, err := cons.Consume(func(m *Message) error {
		log.add(m)
		if string(m.Data) == "poison" {
			return fmt.Errorf("cannot write row %d:\nconstraint violated", m.Attempt)
		}
		if string(m.Data) == "after-2" {
			defer closeDone()
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	pub := func(tenant TenantID, data string) {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "rows"}, []byte(data)))
	}
	pub(poisoned, "poison")
	pub(poisoned, "after-1")
	pub(other, "neighbour")
	pub(poisoned, "after-2")
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("the poisoned tenant never moved on: %v", log.snapshot())
	}

	calls := log.snapshot()
	var attempts []call
	for _, c := range calls {
		if c.data == "poison" {
			attempts = append(attempts, c)
		}
	}
	require.Len(t, attempts, maxDeliveries, "the poison event is tried exactly MaxDeliveries times")
	var gaps []time.Duration
	for i := range attempts {
		assert.Equal(t, i+1, attempts[i].attempt, "attempt numbers count every delivery")
		if i > 0 {
			gap := attempts[i].at.Sub(attempts[i-1].at)
			gaps = append(gaps, gap)
			want := min(delay<<(i-1), maxDelay)
			assert.GreaterOrEqual(t, gap, want-10*time.Millisecond, "retry %d came before its delay", i)
		}
	}
	t.Logf("measured gaps between attempts (configured 100ms doubling to 300ms): %v", gaps)
	last := log.index("poison", maxDeliveries)
	assert.Less(t, log.index("neighbour", 0), last, "another tenant of the partition waited for the poison event")
	assert.Greater(t, log.index("after-1", 0), last, "the poisoned tenant's next event ran before the poison event was parked")
	assert.Less(t, log.index("after-1", 0), log.index("after-2", 0), "the poisoned tenant's events kept their order")

	counts, err := e.DeadLetterCounts(ctx, poisoned, "rows")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), counts.Total, "the poison event is parked once")
	stream, err := e.js.Stream(ctx, e.topo.DeadLetterStream())
	require.NoError(t, err)
	parked, err := stream.GetLastMsgForSubject(ctx, e.topo.subjects().tenantDeadLetters(poisoned))
	require.NoError(t, err)
	assert.Equal(t, "poison", string(parked.Data))
	h := parked.Header
	assert.Equal(t, DeadReasonHandlerFailed, h.Get(HeaderDeadReason))
	assert.Equal(t, strconv.Itoa(maxDeliveries), h.Get(HeaderDeadAttempts))
	assert.Equal(t, "cannot write row 4: constraint violated", h.Get(HeaderDeadError), "the last error, on one line")
	_, p, _ := e.core.subs.ingestTopic(Topic{Tenant: poisoned, Table: "rows"})
	assert.Equal(t, strconv.Itoa(p), h.Get(HeaderDeadPartition))
	seq, err := strconv.ParseUint(h.Get(HeaderDeadSequence), 10, 64)
	require.NoError(t, err)
	assert.NotZero(t, seq)
	first, err := time.Parse(time.RFC3339Nano, h.Get(HeaderDeadFirstAttempt))
	require.NoError(t, err)
	lastAt, err := time.Parse(time.RFC3339Nano, h.Get(HeaderDeadLastAttempt))
	require.NoError(t, err)
	assert.False(t, lastAt.Before(first), "the last attempt is not before the first")

	// Parked means acknowledged: nothing of the poisoned tenant is left unsettled.
	require.Eventually(t, func() bool {
		c, err := e.js.Consumer(ctx, e.topo.PartitionStream(p), e.topo.IngestConsumer)
		return err == nil && c.CachedInfo().NumAckPending == 0 && c.CachedInfo().NumPending == 0
	}, 10*time.Second, 20*time.Millisecond, "the parked event is still pending on its partition")
}

func TestWorker_DifferentTenantsOfOnePartitionRunAtOnceAndEachKeepsItsOrder(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	const lanes, per = 4, 5
	tenants := tenantsOn(t, e, lanes)
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{Concurrency: lanes})
	require.NoError(t, err)
	var mu sync.Mutex
	inFlight := map[TenantID]int{}
	peak, overlap := 0, 0
	got := map[TenantID][]string{}
	all := make(chan struct{})
	closeAll := sync.OnceFunc(func() { close(all) })
	total := 0
	barrier := make(chan struct{})
	arrived := 0
	stop, _, err := cons.Consume(func(m *Message) error {
		tenant := m.Topic().Tenant
		mu.Lock()
		inFlight[tenant]++
		if inFlight[tenant] > 1 {
			overlap++
		}
		running := 0
		for _, n := range inFlight {
			running += n
		}
		peak = max(peak, running)
		first := string(m.Data) == "0"
		if first {
			arrived++
			if arrived == lanes {
				close(barrier) // every tenant's first event is in a handler at once
			}
		}
		mu.Unlock()
		if first {
			select {
			case <-barrier:
			case <-ctx.Done():
			}
		}
		mu.Lock()
		inFlight[tenant]--
		got[tenant] = append(got[tenant], string(m.Data))
		total++
		if total == lanes*per {
			closeAll()
		}
		mu.Unlock()
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	for i := range per {
		for _, id := range tenants {
			require.NoError(t, e.Publish(ctx, Topic{Tenant: id, Table: "t"}, []byte(strconv.Itoa(i))))
		}
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("not every event was handled: %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, lanes, peak, "all four tenants of one partition were in a handler at once")
	assert.Zero(t, overlap, "a tenant had two handler calls at once")
	for _, id := range tenants {
		assert.Equal(t, []string{"0", "1", "2", "3", "4"}, got[id], "tenant %s's order", id)
	}
}

func TestWorker_StopHandsBackAFailedEventAndWhatWaitedBehindItAtOnceInOrder(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenant := tenantsOn(t, e, 1)[0]
	// A long ack wait: anything that comes back quickly was handed back, not expired.
	cfg := ConsumerConfig{AckWait: 5 * time.Minute, Concurrency: 1, RetryDelay: 4 * time.Minute, MaxRetryDelay: 4 * time.Minute}
	cons, err := e.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	const n = 6
	stop, failed, err := cons.Consume(func(m *Message) error {
		if string(m.Data) == "0" {
			return fmt.Errorf("poison") // nak'ed with a 4 minute delay, its tenant held
		}
		t.Errorf("event %s reached the handler while its tenant was held", m.Data)
		return nil
	}, 0)
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte(strconv.Itoa(i))))
	}
	require.Eventually(t, func() bool {
		c, err := e.js.Consumer(ctx, e.topo.PartitionStream(partitionOf(t, e, tenant)), e.topo.IngestConsumer)
		return err == nil && c.CachedInfo().NumAckPending == n
	}, 10*time.Second, 20*time.Millisecond, "the worker never held all six")
	stop()
	select {
	case err := <-failed:
		t.Fatalf("a stop reported a failure: %v", err)
	default:
	}

	// The next worker gets everything at once (nothing waits for the ack wait or the
	// retry delay), in order: the failed event first.
	next, err := e.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	got := make(chan call, n)
	stop2, _, err := next.Consume(func(m *Message) error {
		got <- call{data: string(m.Data), attempt: m.Attempt}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop2()
	var order []string
	for range n {
		select {
		case c := <-got:
			order = append(order, c.data)
			assert.Equal(t, 2, c.attempt, "event %s is a redelivery", c.data)
		case <-time.After(30 * time.Second):
			t.Fatalf("after a stop the next worker got only %v", order)
		}
	}
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, order, "the tenant's order across the stop")
}

func TestWorker_StopReturnsOnlyOnceTheCallsInFlightReturned(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenant := tenantsOn(t, e, 1)[0]
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{StopTimeout: time.Minute})
	require.NoError(t, err)
	entered := make(chan struct{})
	release := make(chan struct{})
	var returned sync.WaitGroup
	returned.Add(1)
	stop, _, err := cons.Consume(func(m *Message) error {
		close(entered)
		<-release
		defer returned.Done()
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte("slow")))
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a handler call was still running")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-stopped
	returned.Wait()
	c, err := e.js.Consumer(ctx, e.topo.PartitionStream(partitionOf(t, e, tenant)), e.topo.IngestConsumer)
	require.NoError(t, err)
	assert.Zero(t, c.CachedInfo().NumAckPending, "the call's ack went through before stop returned")
}

func TestWorker_AStaticClaimTakesOnlyItsPartitions(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	byPartition := map[int]TenantID{}
	for i := 0; len(byPartition) < e.topo.Partitions; i++ {
		id := TenantID(fmt.Sprintf("tenant-%d", i))
		_, p, err := e.core.subs.ingestTopic(Topic{Tenant: id, Table: "t"})
		require.NoError(t, err)
		if _, ok := byPartition[p]; !ok {
			require.NoError(t, e.SetMaxBytes(ctx, id, 1<<20))
			byPartition[p] = id
		}
	}
	got := make(chan TenantID, 16)
	claim := func(parts ...int) {
		cons, err := e.CreateConsumer(ctx, ConsumerConfig{Partitions: parts})
		require.NoError(t, err)
		stop, _, err := cons.Consume(func(m *Message) error {
			got <- m.Topic().Tenant
			return m.Ack()
		}, 0)
		require.NoError(t, err)
		t.Cleanup(stop)
	}
	claim(0, 2)
	for p := range e.topo.Partitions {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: byPartition[p], Table: "t"}, []byte("x")))
	}
	want := map[TenantID]bool{byPartition[0]: true, byPartition[2]: true}
	seen := map[TenantID]bool{}
	for len(seen) < len(want) {
		select {
		case id := <-got:
			require.True(t, want[id], "tenant %s of an unclaimed partition was delivered", id)
			seen[id] = true
		case <-ctx.Done():
			t.Fatalf("claimed partitions delivered only %v", seen)
		}
	}
	select {
	case id := <-got:
		t.Fatalf("tenant %s of an unclaimed partition was delivered", id)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestWorker_AConfigThatCannotWorkIsRefusedWithErrInvalidConfig(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	for name, cfg := range map[string]ConsumerConfig{
		"negative ack wait":      {AckWait: -time.Second},
		"negative concurrency":   {Concurrency: -1},
		"negative retry delay":   {RetryDelay: -time.Second},
		"negative max delay":     {MaxRetryDelay: -time.Second},
		"negative stop timeout":  {StopTimeout: -time.Second},
		"negative max ack":       {MaxAckPending: -1},
		"empty claim":            {Partitions: []int{}},
		"claim beyond the last":  {Partitions: []int{e.topo.Partitions}},
		"negative claim":         {Partitions: []int{-1}},
		"claim naming one twice": {Partitions: []int{1, 1}},
		// A heartbeat every third of it: 1ns made the group's ticker panic.
		"member timeout of 1ns":          {MemberTimeout: 1},
		"member timeout below its floor": {MemberTimeout: minMemberTimeout - 1},
	} {
		_, err := e.CreateConsumer(ctx, cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
	_, err := e.CreateConsumer(ctx, ConsumerConfig{MemberTimeout: minMemberTimeout})
	assert.NoError(t, err, "the floor itself")
}

// TestWorker_AConcurrencyFarAboveTheTenantsStartsOnlyTheGoroutinesTheyNeed: the pool
// grows as tenants have work at once, so a Concurrency of 2^30 neither hangs Consume
// nor holds a goroutine per slot.
func TestWorker_AConcurrencyFarAboveTheTenantsStartsOnlyTheGoroutinesTheyNeed(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenants := tenantsOn(t, e, 3)
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{Concurrency: 1 << 30})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	got := make(chan string, 30)
	stop, _, err := cons.Consume(func(m *Message) error {
		got <- string(m.Data)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	for i := range 10 {
		for _, id := range tenants {
			require.NoError(t, e.Publish(ctx, Topic{Tenant: id, Table: "t"}, []byte(strconv.Itoa(i))))
		}
	}
	for range 30 {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatal("not every event was handled")
		}
	}
	assert.Less(t, runtime.NumGoroutine()-before, 1000, "goroutines started for a Concurrency of 2^30")
}

func partitionOf(t *testing.T, e *EmbeddedNATS, tenant TenantID) int {
	t.Helper()
	_, p, err := e.core.subs.ingestTopic(Topic{Tenant: tenant, Table: "t"})
	require.NoError(t, err)
	return p
}

func TestWorker_CloseHandsBackWhatAHandlerReturnedUnsettledAndStopLeavesItToTheHost(t *testing.T) {
	f := newExternalFixture(t)
	owner := f.broker(t)
	ctx := testCtx(t)
	tp := Topic{Tenant: "acme", Table: "t"}
	cfg := ConsumerConfig{AckWait: time.Minute} // the shipped durable's
	cons, err := owner.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	held := make(chan *Message, 2)
	stop, _, err := cons.Consume(func(m *Message) error { held <- m; return nil }, 0)
	require.NoError(t, err)
	require.NoError(t, owner.Publish(ctx, tp, []byte("kept")))
	require.NoError(t, owner.Publish(ctx, tp, []byte("batched")))
	kept, batched := <-held, <-held
	stop()
	require.NoError(t, kept.Ack(), "after stop the host still settles what it was handed")

	require.NoError(t, owner.Close())
	assert.ErrorIs(t, batched.Ack(), ErrClosed, "after Close the event went back")
	next := f.broker(t)
	cons, err = next.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	got := make(chan *Message, 2)
	stop, _, err = cons.Consume(func(m *Message) error { got <- m; return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	select {
	case m := <-got:
		assert.Equal(t, "batched", string(m.Data), "only the unsettled event comes back")
		assert.Equal(t, 2, m.Attempt)
	case <-time.After(30 * time.Second):
		t.Fatal("the event a closed worker held waited for the ack wait")
	}
}

func TestWorker_ASlowHandlerKeepsThePullFromRunningFarAhead(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenant := tenantsOn(t, e, 1)[0]
	const n = 2000
	for i := range n {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte(strconv.Itoa(i))))
	}
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{Concurrency: 1})
	require.NoError(t, err)
	var handled atomic.Int64
	stop, _, err := cons.Consume(func(m *Message) error {
		time.Sleep(2 * time.Millisecond)
		handled.Add(1)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool { return handled.Load() >= 100 }, 30*time.Second, 10*time.Millisecond)
	c, err := e.js.Consumer(ctx, e.topo.PartitionStream(partitionOf(t, e, tenant)), e.topo.IngestConsumer)
	require.NoError(t, err)
	// Two batches waiting, one in the client and one on its way, and the running call.
	share := e.topo.Prefetch / e.topo.Partitions
	bound := 4*share + 1
	assert.LessOrEqual(t, c.CachedInfo().NumAckPending, bound, "the worker held %d unsettled events", c.CachedInfo().NumAckPending)
}

func TestWorker_AHeldTenantsBacklogBeyondTheWaitLimitDoesNotStopItsPartitionsOtherTenants(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenants := tenantsOn(t, e, 2)
	held, other := tenants[0], tenants[1]
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{RetryDelay: time.Minute})
	require.NoError(t, err)
	got := make(chan string, 16)
	stop, _, err := cons.Consume(func(m *Message) error {
		if m.Topic().Tenant == held {
			return fmt.Errorf("poison") // the first fails and holds the rest
		}
		got <- string(m.Data)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	// Far more than the partition may have waiting (two batches of 125).
	for i := range 1000 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: held, Table: "t"}, []byte(strconv.Itoa(i))))
	}
	for i := range 3 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: other, Table: "t"}, []byte("other-"+strconv.Itoa(i))))
	}
	for i := range 3 {
		select {
		case d := <-got:
			assert.Equal(t, "other-"+strconv.Itoa(i), d)
		case <-time.After(30 * time.Second):
			t.Fatalf("the other tenant of the held tenant's partition got %d of 3", i)
		}
	}
}

// TestWorker_AHandlersNakWithALongDelayHoldsItsTenantForThatDelay: the handler naks a
// tenant's first event with a delay longer than the worker would otherwise wait for a
// retried event (its own retry delay, an ack wait and a publish timeout). The event
// comes back no sooner than that delay, and the tenant's later events still wait for
// it.
func TestWorker_AHandlersNakWithALongDelayHoldsItsTenantForThatDelay(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Topology.PublishTimeout = 500 * time.Millisecond })
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	for i := range 3 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte(strconv.Itoa(i))))
	}
	// The worker alone would wait 100 ms + 1 s + 500 ms for the nak'ed event.
	w, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: time.Second, RetryDelay: 100 * time.Millisecond})
	require.NoError(t, err)
	var calls arrivals
	stop, _, err := w.Consume(func(m *Message) error {
		calls.add(string(m.Data))
		if string(m.Data) == "0" && m.Attempt == 1 {
			return m.NakWithDelay(3 * time.Second)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	assert.Equal(t, []string{"0", "0", "1", "2"}, calls.await(t, 4), "the nak'ed event comes back before its tenant's later ones")
}

// TestWorker_AHandlerThatAcksFromAGoroutineOfItsOwnAsItReturnsHoldsNothing: each ack
// is made by a goroutine the handler starts as it returns, so it may land before or
// after the worker reads how its call settled; every event is handled once, in order,
// and none is held or comes back.
func TestWorker_AHandlerThatAcksFromAGoroutineOfItsOwnAsItReturnsHoldsNothing(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	const events = 50
	var want []string
	for i := range events {
		want = append(want, strconv.Itoa(i))
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte(want[i])))
	}
	w, err := e.CreateConsumer(ctx, ConsumerConfig{})
	require.NoError(t, err)
	var calls arrivals
	var acks sync.WaitGroup
	stop, _, err := w.Consume(func(m *Message) error {
		calls.add(string(m.Data))
		acks.Go(func() { assert.NoError(t, m.Ack()) })
		return nil
	}, 0)
	require.NoError(t, err)
	defer stop()
	assert.Equal(t, want, calls.await(t, events))
	acks.Wait()
	assert.Eventually(t, func() bool {
		_, used := e.budgets.snapshot()
		return used["acme"] == 0
	}, 10*time.Second, 20*time.Millisecond, "every event acked")
}

// TestWorker_AnErrorWithBlanksAtItsEndsIsParkedWithThemTrimmed: NATS headers do not keep
// a value's leading or trailing blanks, so a park whose error header had them was
// refused, and its event was retried for ever, holding its tenant.
func TestWorker_AnErrorWithBlanksAtItsEndsIsParkedWithThemTrimmed(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	tenant := tenantsOn(t, e, 1)[0]
	cutAtABlank := strings.Repeat("x", maxDeadErrorLen-1) + " tail beyond the cut"
	errs := map[string]string{
		"trailing newline": "row rejected by db\n",
		"leading space":    " row rejected",
		"trailing NULs":    "row rejected\x00\x00",
		"cut at a blank":   cutAtABlank,
	}
	cons, err := e.CreateConsumer(ctx, ConsumerConfig{MaxDeliveries: 1})
	require.NoError(t, err)
	stop, _, err := cons.Consume(func(m *Message) error {
		if text, ok := errs[string(m.Data)]; ok {
			return errors.New(text)
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	for name := range errs {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "rows"}, []byte(name)))
	}
	require.Eventually(t, func() bool {
		c, err := e.DeadLetterCounts(ctx, tenant, "")
		return err == nil && c.Total == uint64(len(errs))
	}, 30*time.Second, 20*time.Millisecond, "not every failed event was parked")
	parked, _, err := e.DeadLetters(ctx, tenant, DeadLetterQuery{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, p := range parked {
		got[string(p.Data)] = p.Headers.Get(HeaderDeadError)
	}
	assert.Equal(t, map[string]string{
		"trailing newline": "row rejected by db",
		"leading space":    "row rejected",
		"trailing NULs":    "row rejected",
		"cut at a blank":   strings.Repeat("x", maxDeadErrorLen-1),
	}, got)
}
