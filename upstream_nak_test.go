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

// Pins, with nats-server and nats.go alone, what EmbeddedNATS's boot relies on to put
// back the events in flight at the last stop (embedded_inflight.go): after a restart,
// a nak on an ack subject the client builds, naming an event's stream sequence and
// the durable's last delivered consumer sequence, puts a pending event on the
// redelivery queue at once with its delivery count kept, and does nothing to an
// event acknowledged out of order. Read in nats-server v2.15.3, consumer.processNak:
// the delivery sequence is checked only against the range the durable has
// outstanding.
func TestUpstream_ANakOnABuiltAckSubjectRedeliversAPendingEventAtOnceAfterARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts, srv, nc, js := upstreamInterestStream(ctx, t)
	cons, err := js.CreateOrUpdateConsumer(ctx, "P", jetstream.ConsumerConfig{
		Durable: "INGEST", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: time.Hour, MaxDeliver: -1,
	})
	require.NoError(t, err)
	for i := range 4 {
		_, err := js.Publish(ctx, fmt.Sprintf("p.%d", i), []byte("event"))
		require.NoError(t, err)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	n := 0
	for m := range batch.Messages() {
		n++
		if meta, err := m.Metadata(); err == nil && meta.Sequence.Stream == 3 {
			require.NoError(t, m.DoubleAck(ctx)) // out of order: the floor stays at 0
		}
	}
	require.Equal(t, 4, n)
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	srv = runServer(t, opts.Clone())
	nc, js = connectUpstream(t, srv)
	cons, err = js.Consumer(ctx, "P", "INGEST")
	require.NoError(t, err)
	info := cons.CachedInfo()
	require.Equal(t, 3, info.NumAckPending)
	for seq := uint64(1); seq <= 4; seq++ {
		subject := fmt.Sprintf("$JS.ACK.P.INGEST.1.%d.%d.0.0", seq, info.Delivered.Consumer)
		require.NoError(t, nc.Publish(subject, []byte("-NAK")))
	}
	require.NoError(t, nc.Flush())

	// Far below the hour's ack wait.
	batch, err = cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var got []uint64
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		require.NoError(t, err)
		got = append(got, meta.Sequence.Stream)
		assert.Equal(t, uint64(2), meta.NumDelivered, "event %d's delivery count", meta.Sequence.Stream)
	}
	require.Equal(t, []uint64{1, 2, 4}, got,
		"after a restart nats-server no longer redelivers at once, in order, the pending events nak'ed on built ack subjects, "+
			"or redelivers an acknowledged one: the boot's put-back (EmbeddedNATS.redeliverInFlight) needs another way")
}
