//go:build integration

package mq

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_ATakenPartitionRunsItsPendingEventsInSequenceOrderThoughTheServerRedeliversThemOutOfOrder:
// the server's redelivery queue is in the order events were handed back or expired,
// not in sequence order. A previous owner hands back a tenant's later events before
// its earlier ones; the next worker, pulling one event at a time, must still run them
// in sequence order.
func TestEmbeddedNATS_ATakenPartitionRunsItsPendingEventsInSequenceOrderThoughTheServerRedeliversThemOutOfOrder(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.ListenAddr = "127.0.0.1:0" })
	ctx := testCtx(t)
	_, err := e.CreateConsumer(ctx, ConsumerConfig{AckWait: 30 * time.Second})
	require.NoError(t, err)
	const tenant, events = TenantID("acme"), 6
	require.NoError(t, e.SetMaxBytes(ctx, tenant, 64<<20))
	for i := range events {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, fmt.Appendf(nil, "%s:%d", tenant, i)))
	}
	topo := NATSTopology{}.WithDefaults()
	_, p, err := topo.subjects().ingestTopic(Topic{Tenant: tenant, Table: "t"})
	require.NoError(t, err)

	// The previous owner: a plain pull in the ingest group, which hands back the
	// second half first, each nak confirmed, then lets go of the pin.
	nc, err := nats.Connect(e.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cons, err := js.Consumer(ctx, topo.PartitionStream(p), topo.IngestConsumer)
	require.NoError(t, err)
	batch, err := cons.Fetch(events, jetstream.FetchPriorityGroup(topo.IngestGroup), jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	var held []jetstream.Msg
	for m := range batch.Messages() {
		held = append(held, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, held, events)
	for _, m := range append(held[events/2:], held[:events/2]...) {
		_, err := nc.Request(m.Reply(), []byte("-NAK"), 10*time.Second)
		require.NoError(t, err)
	}
	stream, err := js.Stream(ctx, topo.PartitionStream(p))
	require.NoError(t, err)
	require.NoError(t, stream.UnpinConsumer(ctx, topo.IngestConsumer, topo.IngestGroup))

	// The next owner pulls one event at a time: the redeliveries reach it one by one,
	// in the server's order.
	w, err := e.CreateConsumer(ctx, ConsumerConfig{Partitions: []int{p}})
	require.NoError(t, err)
	var calls arrivals
	stop, _, err := w.Consume(func(m *Message) error {
		calls.add(string(m.Data))
		return m.Ack()
	}, 1)
	require.NoError(t, err)
	defer stop()
	assert.Equal(t, []string{"acme:0", "acme:1", "acme:2", "acme:3", "acme:4", "acme:5"}, calls.await(t, events),
		"the tenant's events in sequence order")
}

// arrivals records the data of a handler's calls in the order they began.
type arrivals struct {
	mu  sync.Mutex
	got []string
}

func (a *arrivals) add(data string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, data)
}

// await waits until n calls began and returns them all.
func (a *arrivals) await(t *testing.T, n int) []string {
	t.Helper()
	return a.awaitThat(t, func(got []string) bool { return len(got) >= n })
}

// awaitEach waits until a call began with each of want and returns them all.
func (a *arrivals) awaitEach(t *testing.T, want ...string) []string {
	t.Helper()
	return a.awaitThat(t, func(got []string) bool {
		for _, w := range want {
			if !slices.Contains(got, w) {
				return false
			}
		}
		return true
	})
}

func (a *arrivals) awaitThat(t *testing.T, done func(got []string) bool) []string {
	t.Helper()
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return done(a.got)
	}, time.Minute, 10*time.Millisecond, "not every call came")
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// TestEmbeddedNATS_AfterARestartAnEventWaitingForItsRetryStillRunsBeforeItsTenantsLaterOnes:
// a tenant's event failed and waits for its retry, its later events queued behind it,
// when the worker stops and the broker restarts. The reopened server sends them back
// only as their ack waits and the retry's delay run out: the later events (due an ack
// wait after their delivery) before the failed one (due its delay after the failure).
// The next worker must still run the failed one first, however quiet its pull is
// until then, while another tenant's events go on.
func TestEmbeddedNATS_AfterARestartAnEventWaitingForItsRetryStillRunsBeforeItsTenantsLaterOnes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	const events = 6
	for _, tenant := range []TenantID{"acme", "globex"} {
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 64<<20))
	}
	publish := func(e *EmbeddedNATS, tenant TenantID, i int) {
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, fmt.Appendf(nil, "%s:%d", tenant, i)))
	}
	for i := range events {
		publish(e, "acme", i)
	}
	// Retry delay and ack wait equal, as the default policy reaches them after a few
	// attempts; the failing call is slow, so the retry falls due after the ack wait of
	// the events delivered with it.
	cfg := ConsumerConfig{AckWait: 3 * time.Second, RetryDelay: 3 * time.Second, MaxRetryDelay: 3 * time.Second}
	w, err := e.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	failed := make(chan struct{})
	var once sync.Once
	stop, _, err := w.Consume(func(m *Message) error {
		if string(m.Data) == "acme:1" {
			time.Sleep(500 * time.Millisecond)
			once.Do(func() { close(failed) })
			return fmt.Errorf("mq test: fails once")
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	select {
	case <-failed:
	case <-ctx.Done():
		t.Fatal("acme:1 never delivered")
	}
	time.Sleep(200 * time.Millisecond) // acme's later events queue behind the retry
	stop()
	time.Sleep(time.Second) // idle before the restart
	require.NoError(t, e.Close())

	e = openEmbedded(t, dir)
	publish(e, "globex", 0)
	publish(e, "acme", events)
	w, err = e.CreateConsumer(ctx, cfg)
	require.NoError(t, err)
	var calls arrivals
	stop, _, err = w.Consume(func(m *Message) error {
		calls.add(string(m.Data))
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	// A call repeated is at least once: only its first counts for the order.
	got := calls.awaitEach(t, "acme:1", "acme:2", "acme:3", "acme:4", "acme:5", "acme:6", "globex:0")
	var acme []string
	for _, data := range got {
		if strings.HasPrefix(data, "acme:") && !slices.Contains(acme, data) {
			acme = append(acme, data)
		}
	}
	assert.Equal(t, []string{"acme:1", "acme:2", "acme:3", "acme:4", "acme:5", "acme:6"}, acme,
		"acme's events in sequence order, the retried one first")
}
