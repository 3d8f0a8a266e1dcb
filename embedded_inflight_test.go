//go:build integration

package mq

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What EmbeddedNATS's boot does with the events its durable had delivered and not
// seen settled when the store was last open (embedded_inflight.go).

const (
	inflightChildEnv  = "MQ_INFLIGHT_CHILD_STORE"
	inflightListenEnv = "MQ_INFLIGHT_CHILD_LISTEN"
	inflightEach      = 6 // events per tenant
	inflightAcked     = 3 // acme's first events, acked; the rest the host holds unsettled
)

// inflightTenants are acme and a tenant on acme's partition, whose events, published
// after acme's, are all acked: acked out of order, above the durable's ack floor.
func inflightTenants(t *testing.T, e *EmbeddedNATS) (acme, other TenantID) {
	t.Helper()
	p := partitionOf(t, e, "acme")
	for i := range 1000 {
		if tenant := TenantID("t" + strconv.Itoa(i)); partitionOf(t, e, tenant) == p {
			return "acme", tenant
		}
	}
	t.Fatal("no tenant shares acme's partition")
	return "", ""
}

func inflightOptions(listen bool) func(*EmbeddedOptions) {
	return func(o *EmbeddedOptions) {
		if listen {
			o.ListenAddr = "127.0.0.1:0"
		}
	}
}

// TestEmbeddedNATS_InFlightChild is the child process of the crash tests below: it
// publishes both tenants' events, acks all but acme's last three, which the handler
// returns unsettled under an hour's ack wait, and waits to be killed.
func TestEmbeddedNATS_InFlightChild(t *testing.T) {
	dir := os.Getenv(inflightChildEnv)
	if dir == "" {
		t.Skip("the child process of the in-flight crash tests")
	}
	e := openEmbedded(t, dir, inflightOptions(os.Getenv(inflightListenEnv) != ""))
	ctx := testCtx(t)
	acme, other := inflightTenants(t, e)
	for _, tenant := range []TenantID{acme, other} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
		for i := range inflightEach {
			require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, fmt.Appendf(nil, "%s/%d", tenant, i)))
		}
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: time.Hour})
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	handled := make(chan struct{})
	stop, _, err := c.Consume(func(m *Message) error {
		tenant, n, _ := strings.Cut(string(m.Data), "/")
		if i, _ := strconv.Atoi(n); tenant != string(acme) || i < inflightAcked {
			if err := m.DoubleAck(ctx); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 2*inflightEach {
			close(handled)
		}
		return nil
	}, 0)
	require.NoError(t, err)
	defer stop()
	<-handled
	// Idle, as a host does: the server writes a durable's acks to its store a moment
	// after it confirmed them, and a kill before that loses them (they come again).
	time.Sleep(idleBeforeRestart)
	childReport("ready", "")
	time.Sleep(time.Minute) // killed long before
	t.Fatal("the parent never killed this child")
}

// crashWithEventsInFlight runs the child over dir and kills it once it holds acme's
// last events unsettled.
func crashWithEventsInFlight(t *testing.T, dir string, listen bool) {
	t.Helper()
	env := []string{inflightChildEnv + "=" + dir}
	if listen {
		env = append(env, inflightListenEnv+"=1")
	}
	runChild(t, "TestEmbeddedNATS_InFlightChild", env, func(kind, _ string) bool { return kind == "ready" }, nil)
}

// inflightDelivery is one handler call after the restart.
type inflightDelivery struct {
	data    string
	attempt int
}

func consumeAfterRestart(t *testing.T, e *EmbeddedNATS) (<-chan inflightDelivery, func()) {
	t.Helper()
	ctx := testCtx(t)
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: time.Hour})
	require.NoError(t, err)
	got := make(chan inflightDelivery, 4*inflightEach)
	stop, _, err := c.Consume(func(m *Message) error {
		if err := m.DoubleAck(ctx); err != nil {
			return err
		}
		got <- inflightDelivery{string(m.Data), m.Attempt}
		return nil
	}, 0)
	require.NoError(t, err)
	t.Cleanup(stop)
	return got, stop
}

func TestEmbeddedNATS_EventsInFlightAtACrashComeAtOnceAfterTheRestartInOrderAndNoAckedOneComesAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	crashWithEventsInFlight(t, dir, false)

	e := openEmbedded(t, dir)
	got, stop := consumeAfterRestart(t, e)
	var calls []inflightDelivery
	for len(calls) < inflightEach-inflightAcked {
		select {
		case d := <-got:
			calls = append(calls, d)
		case <-time.After(30 * time.Second): // far below the hour's ack wait, and the durable's minute
			t.Fatalf("after the restart only %v came of the events the crashed worker held", calls)
		}
	}
	// Once the durable has nothing to deliver and nothing unsettled, every delivery
	// this worker will ever get has reached the handler.
	require.Eventually(t, func() bool { return durablesSettled(testCtx(t), e) }, 20*time.Second, 50*time.Millisecond)
	stop()
	for len(got) > 0 {
		calls = append(calls, <-got)
	}
	want := []inflightDelivery{{"acme/3", 2}, {"acme/4", 2}, {"acme/5", 2}}
	assert.Equal(t, want, calls,
		"the events in flight, once each, in order, as their second delivery; none of the acked ones")
}

func TestEmbeddedNATS_WithAListenerEventsInFlightAtACrashWaitForTheirAckWait(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	crashWithEventsInFlight(t, dir, true)

	// A worker in another process may still hold them: the boot leaves them be.
	e := openEmbedded(t, dir, inflightOptions(true))
	got, _ := consumeAfterRestart(t, e)
	select {
	case d := <-got:
		t.Fatalf("%s came at once after the restart, though a worker elsewhere could still hold it", d.data)
	case <-time.After(2 * time.Second):
	}
	ctx := testCtx(t)
	cons, err := e.js.Consumer(ctx, e.topo.PartitionStream(partitionOf(t, e, "acme")), e.topo.IngestConsumer)
	require.NoError(t, err)
	assert.Equal(t, inflightEach-inflightAcked, cons.CachedInfo().NumAckPending, "acme's held events are still pending")
}

// TestEmbeddedNATS_EventsHandedBackAtCloseComeAtOnceAfterAnOpenAndCloseWithoutConsume:
// a worker under a shorter ack wait than the broker's holds events and Close hands them
// back; the store is then opened and closed with no Consume, which puts the durable's
// ack wait back to the broker's. Before the boot put them back, the events then waited
// a whole ack wait after the next start (found by a probe: 29.4 s of a 30 s ack wait,
// against 0.2 s with the put-back).
func TestEmbeddedNATS_EventsHandedBackAtCloseComeAtOnceAfterAnOpenAndCloseWithoutConsume(t *testing.T) {
	t.Parallel()
	const ackWait = 20 * time.Second // the broker's is a minute
	dir := t.TempDir()
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for i := range 3 {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, fmt.Appendf(nil, "acme/%d", i)))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: ackWait})
	require.NoError(t, err)
	held := make(chan *Message, 3)
	_, _, err = c.Consume(func(m *Message) error { held <- m; return nil }, 0)
	require.NoError(t, err)
	for range 3 {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("the events were never delivered")
		}
	}
	require.NoError(t, e.Close()) // hands back what the host held

	e = openEmbedded(t, dir)
	require.NoError(t, e.Close())

	e = openEmbedded(t, dir)
	c, err = e.CreateConsumer(testCtx(t), ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	got := make(chan string, 3)
	stop, _, err := c.Consume(func(m *Message) error { got <- string(m.Data); return m.Ack() }, 0)
	require.NoError(t, err)
	defer stop()
	var calls []string
	for len(calls) < 3 {
		select {
		case data := <-got:
			calls = append(calls, data)
		case <-time.After(ackWait / 2): // without the boot's put-back they came after most of an ack wait
			t.Fatalf("after the restarts only %v came of the events handed back at Close", calls)
		}
	}
	assert.Equal(t, []string{"acme/0", "acme/1", "acme/2"}, calls)
}
