package mq

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// These tests pin a nats-server behaviour with nats-server and nats.go alone, no mq
// code, so that an upgrade that changes it is noticed.
//
// On a standalone server, recovery adds a stream's consumers one by one in the order
// of their directories (os.ReadDir: sorted by name). A sourcing consumer (the
// history's JS_SRC_<hash> on a partition) is reset to its ack floor as it is added
// (consumer.go, addConsumerWithAssignmentAndMode: `if config.Sourcing && standalone
// { o.resetStartingSeq(0, ...) }`), and on an interest stream the reset removes every
// message at or below that floor that no consumer added so far is interested in
// (resetStartingSeqLocked -> checkStateForInterestStream -> stream.ackMsg ->
// noInterest). A durable whose directory sorts after "JS_SRC_" is not added yet, so
// every event the history copied and the durable never acknowledged is removed. A
// durable sorting before it is already there and keeps them. Read in v2.15.2, measured
// on v2.14.10 to v2.15.3; a clustered server recovers through the meta layer instead.
//
// The mq topology therefore names its durable to sort before every "JS_" consumer
// (NATSTopology.IngestConsumer, checked by Validate).

// upstreamRecovery publishes n events to an interest stream with a pull durable named
// durable that never acknowledges, waits until a second stream that sources it has
// copied them and its source consumer has acknowledged them, idles, restarts the
// standalone server on the same store and reports how many the interest stream kept.
func upstreamRecovery(t *testing.T, durable string, n int) (kept uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts, srv, nc, js := upstreamInterestStream(ctx, t)
	_, err := js.CreateOrUpdateConsumer(ctx, "P", jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "H", Sources: []*jetstream.StreamSource{{Name: "P"}}, Storage: jetstream.FileStorage,
	})
	require.NoError(t, err)
	for i := range n {
		_, err := js.Publish(ctx, fmt.Sprintf("p.%d", i), []byte("event"))
		require.NoError(t, err)
	}
	// Until the history holds every event and its source consumer acknowledged them.
	require.Eventually(t, func() bool {
		h, err := js.Stream(ctx, "H")
		if err != nil || h.CachedInfo().State.Msgs != uint64(n) {
			return false
		}
		acked := false
		for ci := range mustStream(t, js, "P").ListConsumers(ctx).Info() { // read to the end: the lister blocks otherwise
			acked = acked || strings.HasPrefix(ci.Name, "JS_SRC_") && ci.AckFloor.Stream == uint64(n)
		}
		return acked
	}, 30*time.Second, 20*time.Millisecond, "the history never copied and acknowledged every event")
	time.Sleep(2 * time.Second) // idle, as a host does before a restart
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	srv = runServer(t, opts.Clone())
	_, js = connectUpstream(t, srv)
	return mustStream(t, js, "P").CachedInfo().State.Msgs
}

// upstreamInterestStream starts a standalone server (upstreamOptions) and creates the
// interest-retention stream P on p.>.
func upstreamInterestStream(ctx context.Context, t *testing.T) (*server.Options, *server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts := upstreamOptions(t)
	srv := runServer(t, opts.Clone())
	nc, js := connectUpstream(t, srv)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "P", Subjects: []string{"p.>"}, Retention: jetstream.InterestPolicy, Storage: jetstream.FileStorage,
	})
	require.NoError(t, err)
	return opts, srv, nc, js
}

// upstreamOptions are a standalone server's on loopback, with a file store in a temp
// dir that a restart with the same options finds again.
func upstreamOptions(t *testing.T) *server.Options {
	return &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: filepath.Join(t.TempDir(), "js"),
		NoSigs: true, NoLog: true,
	}
}

func connectUpstream(t *testing.T, srv *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

func mustStream(t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	require.NoError(t, err)
	return s
}

func TestUpstream_RestartDropsWhatTheSourceAckedWhenTheDurableSortsAfterIt(t *testing.T) {
	const n = 50
	kept := upstreamRecovery(t, "wh-ingest", n)
	require.Zero(t, kept, "nats-server kept %d of %d events on restart: the recovery defect this "+
		"topology works around (durable names sorting before \"JS_\") may be fixed upstream; "+
		"re-measure and revisit NATSTopology.IngestConsumer's rule", kept, n)
}

func TestUpstream_RestartKeepsEverythingWhenTheDurableSortsBeforeTheSource(t *testing.T) {
	const n = 50
	// The literal, not the topology's constant: this test states the server's behaviour
	// for the name the topology ships, and must not follow a rename silently.
	require.Equal(t, uint64(n), upstreamRecovery(t, "INGEST", n))
}
