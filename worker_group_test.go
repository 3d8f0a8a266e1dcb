//go:build integration

package mq

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Several workers sharing the partitions (issue 8): one owner per partition, an even
// spread, handovers when a worker stops, dies or joins, and each tenant's order kept
// across them. Every worker is its own broker on its own connection, as separate
// processes would be.

// groupMemberTimeout is the workers' MemberTimeout in these tests: short, so a killed
// worker's partitions move within the test.
const groupMemberTimeout = time.Second

// groupCall is one handler call.
type groupCall struct {
	worker     string
	tenant     TenantID
	index      int
	start, end time.Time
	acked      bool
}

// groupLedger records every call of every worker.
type groupLedger struct {
	mu    sync.Mutex
	calls []groupCall
	acked map[string]bool // tenant:index
}

func (l *groupLedger) handler(name string) Handler {
	return func(m *Message) error {
		c := groupCall{worker: name, tenant: m.Topic().Tenant, start: time.Now()}
		_, idx, _ := strings.Cut(string(m.Data), ":")
		c.index, _ = strconv.Atoi(idx)
		time.Sleep(3 * time.Millisecond) // a write: slower than the publisher, so each worker holds a backlog
		c.acked = m.Ack() == nil
		c.end = time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, c)
		if c.acked {
			l.acked[string(m.Data)] = true
		}
		return nil
	}
}

// owners maps each partition to the worker of its latest call since from.
func (l *groupLedger) owners(partitionOf func(TenantID) int, from time.Time) map[int]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]string{}
	for _, c := range l.calls {
		if c.start.After(from) {
			out[partitionOf(c.tenant)] = c.worker
		}
	}
	return out
}

// firstCallAfter is the first call on partition p by another worker than old, after t.
func (l *groupLedger) firstCallAfter(partitionOf func(TenantID) int, p int, old string, t time.Time) (groupCall, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best groupCall
	found := false
	for _, c := range l.calls {
		if partitionOf(c.tenant) == p && c.worker != old && c.start.After(t) && (!found || c.start.Before(best.start)) {
			best, found = c, true
		}
	}
	return best, found
}

// orderViolations lists each call that started while an earlier event of its tenant
// was still in a handler call anywhere, or that handled an earlier event after a
// later one had already started.
func (l *groupLedger) orderViolations() (out []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byTenant := map[TenantID][]groupCall{}
	for _, c := range l.calls {
		byTenant[c.tenant] = append(byTenant[c.tenant], c)
	}
	defer func() {
		if len(out) > 10 { // the first few say it; the rest repeat it
			out = append(out[:10], fmt.Sprintf("... and %d more", len(out)-10))
		}
	}()
	for tenant, calls := range byTenant {
		sort.Slice(calls, func(i, j int) bool { return calls[i].start.Before(calls[j].start) })
		for j, cj := range calls {
			// A call of an event an earlier call already acked is a duplicate.
			repeat := slices.ContainsFunc(calls[:j], func(c groupCall) bool { return c.index == cj.index && c.acked })
			for _, ci := range calls[:j] {
				if repeat && ci.index > cj.index {
					// At least once: a killed worker's ack may be lost after its
					// call returned, and the event comes again after later ones.
					// Not an event reaching a new owner while it was unsettled.
					continue
				}
				switch {
				case ci.index < cj.index && ci.end.After(cj.start):
					out = append(out, fmt.Sprintf("%s: %d started at %s while %d was still running at %s", tenant, cj.index, cj.worker, ci.index, ci.worker))
				case ci.index > cj.index:
					out = append(out, fmt.Sprintf("%s: %d (at %s) came after %d (at %s) had started", tenant, cj.index, cj.worker, ci.index, ci.worker))
				}
			}
		}
	}
	return out
}

// groupWorker is one worker process.
type groupWorker struct {
	name string
	b    Broker
	kill func() // closes its connection without a drain
	stop func()
}

// groupScenario runs the workers' life over 4 partitions: A and B share them, C joins,
// A stops, B is killed (C is left alone), D joins; every event is then delivered and each tenant's
// order kept. newWorker opens a worker broker on its own connection.
func groupScenario(t *testing.T, ackWait time.Duration, pub Broker, budget func(TenantID), newWorker func(t *testing.T, name string) (Broker, func())) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	topo := NATSTopology{}.WithDefaults()
	partitionOf := func(id TenantID) int {
		_, p, err := topo.subjects().ingestTopic(Topic{Tenant: id, Table: "t"})
		require.NoError(t, err)
		return p
	}
	// Two tenants per partition.
	var tenants []TenantID
	per := map[int]int{}
	for i := 0; len(tenants) < 2*topo.Partitions; i++ {
		id := TenantID(fmt.Sprintf("tenant-%d", i))
		if p := partitionOf(id); per[p] < 2 {
			per[p]++
			budget(id)
			tenants = append(tenants, id)
		}
	}
	ledger := &groupLedger{acked: map[string]bool{}}
	cfg := ConsumerConfig{MemberTimeout: groupMemberTimeout, Concurrency: 4, AckWait: ackWait}
	start := func(name string) *groupWorker {
		b, kill := newWorker(t, name)
		cons, err := b.CreateConsumer(ctx, cfg)
		require.NoError(t, err)
		stop, _, err := cons.Consume(ledger.handler(name), 0)
		require.NoError(t, err)
		return &groupWorker{name: name, b: b, kill: kill, stop: stop}
	}

	// The publisher: round robin over the tenants, until told to stop.
	var published sync.Map // tenant:index
	pubStop := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for n := 0; ; n++ {
			select {
			case <-pubStop:
				return
			default:
			}
			id := tenants[n%len(tenants)]
			data := fmt.Sprintf("%s:%d", id, n/len(tenants))
			if err := pub.Publish(ctx, Topic{Tenant: id, Table: "t"}, []byte(data)); err != nil {
				t.Errorf("publish %s: %v", data, err)
				return
			}
			published.Store(data, true)
			time.Sleep(time.Millisecond)
		}
	}()

	spread := func(want []int, since time.Time, what string) {
		t.Helper()
		var got []int
		var owners map[int]string
		require.Eventually(t, func() bool {
			counts := map[string]int{}
			owners = ledger.owners(partitionOf, time.Now().Add(-groupMemberTimeout))
			if len(owners) < topo.Partitions {
				return false
			}
			for _, w := range owners {
				counts[w]++
			}
			got = got[:0]
			for _, n := range counts {
				got = append(got, n)
			}
			slices.Sort(got)
			return slices.Equal(got, want)
		}, 60*time.Second, 50*time.Millisecond, "%s: partitions per worker %v (owners %v), want %v", what, got, owners, want)
		t.Logf("%s: partitions per worker %v after %s", what, want, time.Since(since).Round(time.Millisecond))
	}
	handover := func(old string, parts []int, at time.Time, what string) {
		t.Helper()
		for _, p := range parts {
			var c groupCall
			require.Eventually(t, func() bool {
				var ok bool
				c, ok = ledger.firstCallAfter(partitionOf, p, old, at)
				return ok
			}, 2*time.Minute, 20*time.Millisecond, "%s: partition %d never moved from %s", what, p, old)
			t.Logf("measured handover (%s): partition %d from %s to %s in %s", what, p, old, c.worker, c.start.Sub(at).Round(time.Millisecond))
		}
	}
	ownedBy := func(name string) []int {
		var out []int
		for p, w := range ledger.owners(partitionOf, time.Now().Add(-groupMemberTimeout)) {
			if w == name {
				out = append(out, p)
			}
		}
		return out
	}

	t0 := time.Now()
	a, b := start("A"), start("B")
	spread([]int{2, 2}, t0, "A and B")
	tc := time.Now()
	c := start("C")
	spread([]int{1, 1, 2}, tc, "C joined")

	aParts := ownedBy("A")
	ta := time.Now()
	a.stop()
	handover("A", aParts, ta, "A stopped")
	bParts := ownedBy("B")
	tb := time.Now()
	b.kill()
	handover("B", bParts, tb, "B killed")
	spread([]int{4}, tb, "C alone")
	td := time.Now()
	d := start("D")
	spread([]int{2, 2}, td, "D joined")

	close(pubStop)
	<-pubDone
	require.Eventually(t, func() bool {
		missing := 0
		published.Range(func(k, _ any) bool {
			ledger.mu.Lock()
			defer ledger.mu.Unlock()
			if !ledger.acked[k.(string)] {
				missing++
			}
			return true
		})
		return missing == 0
	}, 2*time.Minute, 50*time.Millisecond, "not every published event was acknowledged")
	c.stop()
	d.stop()
	n := 0
	published.Range(func(any, any) bool { n++; return true })
	ledger.mu.Lock()
	calls := len(ledger.calls)
	ledger.mu.Unlock()
	t.Logf("%d events, %d handler calls (%d redeliveries)", n, calls, calls-n)
	assert.Empty(t, ledger.orderViolations(), "each tenant's order across the handovers")
}

func TestEmbeddedNATS_WorkersShareThePartitionsAndKeepEachTenantsOrderAcrossHandovers(t *testing.T) {
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.ListenAddr = "127.0.0.1:0" })
	// The workers attach as ExternalNATS, which never changes the durable: the
	// embedded broker sets its short ack wait.
	_, err := e.CreateConsumer(testCtx(t), ConsumerConfig{AckWait: 5 * time.Second})
	require.NoError(t, err)
	// A short ack wait: a killed worker's partition with events in flight waits one.
	groupScenario(t, 5*time.Second, e, func(id TenantID) { require.NoError(t, e.SetMaxBytes(testCtx(t), id, 64<<20)) },
		func(t *testing.T, name string) (Broker, func()) {
			w, err := NewNATS(t.Context(), NATSConfig{NATSTopology: NATSTopology{AckWait: 5 * time.Second}, URLs: []string{e.ClientURL()}, TopologyWait: 10 * time.Second, Logger: quietLog})
			require.NoError(t, err, "worker %s", name)
			t.Cleanup(func() { _ = w.Close() })
			return w, func() { w.nc.Close() }
		})
}

// groupAckWait is the operator's ack wait on the durable in the ExternalNATS group
// tests: a killed worker's partition with events in flight waits one.
const groupAckWait = 5 * time.Second

func withGroupAckWait(t *testing.T) func(*shape) {
	return func(s *shape) {
		for p := range s.topo.Partitions {
			s.consumer(t, s.topo.PartitionStream(p)).AckWait = groupAckWait
		}
	}
}

func externalGroupScenario(t *testing.T, f *externalFixture) {
	config := func(c *NATSConfig) { c.AckWait = groupAckWait }
	pub := f.broker(t, config)
	groupScenario(t, groupAckWait, pub, func(TenantID) {}, func(t *testing.T, name string) (Broker, func()) {
		w := f.broker(t, config)
		return w, func() { w.nc.Close() }
	})
}

func TestExternalNATS_WorkersShareThePartitionsAndKeepEachTenantsOrderAcrossHandovers(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	externalGroupScenario(t, &externalFixture{natsFixture: f, shape: f.applyShipped(t, 1, withGroupAckWait(t))})
}

func TestExternalNATS_WorkersShareTheR3PartitionsOfAThreeNodeClusterAndKeepEachTenantsOrder(t *testing.T) {
	t.Parallel()
	c := newClusterFixture(t, 3)
	externalGroupScenario(t, &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(t, 3, withGroupAckWait(t))})
}

// TestEmbeddedNATS_AWorkerThatJoinsAfterItsPredecessorDiedKeepsEachTenantsOrder: a
// worker that never saw the dead one must still wait for what it held unsettled. The
// durable's ack wait (25s) is longer than its pinned TTL (15s), so waiting only for the
// pin would hand the new worker later events before the dead worker's came back.
func TestEmbeddedNATS_AWorkerThatJoinsAfterItsPredecessorDiedKeepsEachTenantsOrder(t *testing.T) {
	t.Parallel()
	const ackWait = 25 * time.Second
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.ListenAddr = "127.0.0.1:0" })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	_, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: ackWait})
	require.NoError(t, err)
	var tenants []TenantID
	for i := range 8 {
		id := TenantID(fmt.Sprintf("tenant-%d", i))
		require.NoError(t, e.SetMaxBytes(ctx, id, 64<<20))
		tenants = append(tenants, id)
	}
	ledger := &groupLedger{acked: map[string]bool{}}
	worker := func(name string) *ExternalNATS {
		w, err := NewNATS(t.Context(), NATSConfig{NATSTopology: NATSTopology{AckWait: ackWait}, URLs: []string{e.ClientURL()},
			TopologyWait: 10 * time.Second, Logger: quietLog})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		cons, err := w.CreateConsumer(ctx, ConsumerConfig{AckWait: ackWait, MemberTimeout: groupMemberTimeout})
		require.NoError(t, err)
		stop, _, err := cons.Consume(ledger.handler(name), 0)
		require.NoError(t, err)
		t.Cleanup(stop)
		return w
	}
	var published []string
	publish := func(n int) {
		for i := range n {
			id := tenants[i%len(tenants)]
			data := fmt.Sprintf("%s:%d", id, len(published)/len(tenants))
			require.NoError(t, e.Publish(ctx, Topic{Tenant: id, Table: "t"}, []byte(data)))
			published = append(published, data)
		}
	}
	first := worker("first")
	publish(400) // a backlog: the first worker dies holding some of it
	require.Eventually(t, func() bool {
		ledger.mu.Lock()
		defer ledger.mu.Unlock()
		return len(ledger.calls) >= 50
	}, time.Minute, 10*time.Millisecond)
	first.nc.Close() // killed: no hand-back, its pins stay until the pinned TTL
	worker("second")
	publish(400)
	require.Eventually(t, func() bool {
		ledger.mu.Lock()
		defer ledger.mu.Unlock()
		for _, d := range published {
			if !ledger.acked[d] {
				return false
			}
		}
		return true
	}, 2*time.Minute, 50*time.Millisecond, "not every event was acknowledged")
	assert.Empty(t, ledger.orderViolations(), "each tenant's order across a death the new worker never saw")
}
