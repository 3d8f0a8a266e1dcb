//go:build integration

package mq

import (
	"fmt"
	"strconv"
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
	var mu sync.Mutex
	var order []int
	stop, _, err := w.Consume(func(m *Message) error {
		_, idx, _ := strings.Cut(string(m.Data), ":")
		i, _ := strconv.Atoi(idx)
		mu.Lock()
		order = append(order, i)
		mu.Unlock()
		return m.Ack()
	}, 1)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= events
	}, time.Minute, 10*time.Millisecond, "not every event came back")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "the tenant's events in sequence order")
}
