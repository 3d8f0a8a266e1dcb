package mq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Pins, with nats-server and nats.go alone, what a release's unpin works around
// (pinnedToADrainedPull): on a durable with a pinned-client group and no pin, the next
// event pins the first waiting pull request even when nobody listens to it any more;
// the server then drops that request, delivers nothing, and keeps the pin, so another
// puller gets nothing until the pin is removed or its TTL ends. Read in nats-server
// v2.15.3, consumer.nextWaiting: the check for a listener comes after the pin. An
// upgrade that fixes it fails this test, and the workaround can go.
func TestUpstream_APullDroppedBeforeItsFirstEventKeepsThePinAndStarvesTheNextPuller(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _, nc, js := upstreamInterestStream(ctx, t)
	const group = "ingest"
	// The server may look at its waiting pulls, and drop the one nobody listens to,
	// before the event comes (a loaded machine): each attempt takes a durable and a
	// subject of its own, until one shows the pin.
	var cons jetstream.Consumer
	var durable string
	for attempt := 0; cons == nil && attempt < 20; attempt++ {
		durable = fmt.Sprintf("INGEST%d", attempt)
		c, err := js.CreateOrUpdateConsumer(ctx, "P", jetstream.ConsumerConfig{
			Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
			FilterSubject:  fmt.Sprintf("p.%d", attempt),
			PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: time.Hour, PriorityGroups: []string{group},
		})
		require.NoError(t, err)
		// A pull of the group that waits at the server, and whose puller then goes,
		// as a drained nats.go pull does.
		inbox := nc.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		require.NoError(t, err)
		req := `{"batch":10,"expires":60000000000,"group":"` + group + `"}`
		require.NoError(t, nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.P."+durable, inbox, []byte(req)))
		require.NoError(t, nc.Flush())
		require.NoError(t, sub.Unsubscribe())
		_, err = js.Publish(ctx, fmt.Sprintf("p.%d", attempt), []byte("event"))
		require.NoError(t, err)
		info, err := c.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, uint64(0), info.Delivered.Consumer, "the server delivered the event to a pull nobody listens to")
		if groupPin(info, group) != "" {
			cons = c
		}
	}
	require.NotNil(t, cons, "in 20 attempts the server never pinned a pull nobody listens to: pinnedToADrainedPull may go")

	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second), jetstream.FetchPriorityGroup(group))
	require.NoError(t, err)
	got := 0
	for range batch.Messages() {
		got++
	}
	assert.Zero(t, got, "another puller got the event while the dropped pull's pin stood")

	stream, err := js.Stream(ctx, "P")
	require.NoError(t, err)
	require.NoError(t, stream.UnpinConsumer(ctx, durable, group))
	batch, err = cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second), jetstream.FetchPriorityGroup(group))
	require.NoError(t, err)
	got = 0
	for range batch.Messages() {
		got++
	}
	assert.Equal(t, 1, got, "after the unpin, the next puller got the event")
}
