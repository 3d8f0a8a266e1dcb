package mq

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Test servers listen on ports below the kernel's ephemeral range (32768 and up on
// Linux), handed out once per process: a port picked by listening on :0 is from that
// range, and while its server is stopped for a restart an outgoing connection may be
// given it as its local port (measured: a cluster node that never became ready in CI).
var nextLoopbackPort atomic.Int32

const (
	loopbackPortLow  = 20000
	loopbackPortHigh = 32000
)

// loopbackPort returns a port on 127.0.0.1 that no other server of this process was
// given and that was free a moment ago.
func loopbackPort(t testing.TB) int {
	t.Helper()
	// Spread by a stride: processes started together have neighbouring pids, and from
	// neighbouring ports each would probe the ports the other was about to take
	// (measured: two test processes at once, a cluster node not ready in one of them).
	const stride = 997
	nextLoopbackPort.CompareAndSwap(0, int32(loopbackPortLow+os.Getpid()*stride%(loopbackPortHigh-loopbackPortLow)))
	for range loopbackPortHigh - loopbackPortLow {
		p := int(nextLoopbackPort.Add(1))
		p = loopbackPortLow + (p-loopbackPortLow)%(loopbackPortHigh-loopbackPortLow)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // another process has it
		}
		_ = l.Close()
		return p
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return 0
}

// natsFixture is an in-process nats-server with file storage in a temp dir, or a
// cluster of them (see newClusterFixture), and an operator's JetStream handle with
// full access, standing in for the NACK controller.
type natsFixture struct {
	srv   *server.Server  // the single server; nil for a cluster
	opts  *server.Options // the single server's
	urls  []string        // a cluster's client URLs, every node's; nil for a single server
	nc    *nats.Conn
	admin jetstream.JetStream
}

// clientURLs are what clients dial: the single server's URL, or every node's.
func (f *natsFixture) clientURLs() []string {
	if f.urls != nil {
		return f.urls
	}
	return []string{f.srv.ClientURL()}
}

func newNATSFixture(t *testing.T) *natsFixture {
	t.Helper()
	opts := &server.Options{
		Host:               "127.0.0.1",
		Port:               server.RANDOM_PORT,
		JetStream:          true,
		StoreDir:           filepath.Join(t.TempDir(), "js"),
		JetStreamMaxStore:  maxStore,
		JetStreamMaxMemory: maxStore,
		NoSigs:             true,
		NoLog:              true,
	}
	f := &natsFixture{opts: opts}
	f.start(t)
	return f
}

// runServer starts a server from opts and shuts it down at cleanup. A random client
// port becomes one of loopbackPort's, so that a restart on the same port finds it free.
func runServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts.Port == server.RANDOM_PORT {
		opts.Port = loopbackPort(t)
	}
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	srv.Start()
	// Generous: a clustered node under the race detector, beside a dozen others, can
	// take seconds (measured: over 10 s once in CI).
	require.True(t, srv.ReadyForConnections(time.Minute), "nats server not ready")
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

func (f *natsFixture) start(t *testing.T) {
	t.Helper()
	srv := runServer(t, f.opts)
	f.srv = srv
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	f.nc = nc
	f.admin, err = jetstream.New(nc)
	require.NoError(t, err)
}

// shape is a topology about to be applied: every stream's and consumer's
// configuration, in creation order, for a test to break before they exist.
type shape struct {
	topo      NATSTopology
	streams   []jetstream.StreamConfig
	consumers map[string][]jetstream.ConsumerConfig // by stream name
}

// shapeOf is topo as the builders make it, at one replica.
func shapeOf(topo NATSTopology) *shape {
	topo = topo.WithDefaults()
	topo.Replicas = 1
	s := &shape{topo: topo, consumers: map[string][]jetstream.ConsumerConfig{}}
	for p := range topo.Partitions {
		cfg := topo.partitionConfig(p)
		s.streams = append(s.streams, cfg)
		s.consumers[cfg.Name] = []jetstream.ConsumerConfig{topo.ingestConsumerConfig(p)}
	}
	s.streams = append(s.streams, topo.historyConfig(), topo.deadLetterConfig())
	return s
}

// stream returns the named stream's configuration for editing.
func (s *shape) stream(t testing.TB, name string) *jetstream.StreamConfig {
	i := slices.IndexFunc(s.streams, func(c jetstream.StreamConfig) bool { return c.Name == name })
	require.GreaterOrEqual(t, i, 0, "no stream %s", name)
	return &s.streams[i]
}

// consumer returns the ingest durable's configuration on stream for editing.
func (s *shape) consumer(t *testing.T, stream string) *jetstream.ConsumerConfig {
	require.Len(t, s.consumers[stream], 1)
	return &s.consumers[stream][0]
}

// drop removes a stream and its consumers.
func (s *shape) drop(name string) {
	s.streams = slices.DeleteFunc(s.streams, func(c jetstream.StreamConfig) bool { return c.Name == name })
	delete(s.consumers, name)
}

// atReplicas sets every stream's replicas, as the operator's manifests do. The shape's
// topology keeps its own (what the broker expects), so a difference stays a finding.
func (s *shape) atReplicas(n int) {
	for i := range s.streams {
		s.streams[i].Replicas = n
	}
}

// apply creates the shape on the fixture's server and waits until the history has
// attached every source it can.
func (f *natsFixture) apply(t testing.TB, s *shape) {
	t.Helper()
	// Generous: a replicated stream is created through the cluster's meta leader.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, cfg := range s.streams {
		_, err := f.admin.CreateStream(ctx, cfg)
		require.NoError(t, err, "create stream %s", cfg.Name)
		for _, cc := range s.consumers[cfg.Name] {
			_, err := f.admin.CreateConsumer(ctx, cfg.Name, cc)
			require.NoError(t, err, "create consumer %s/%s", cfg.Name, cc.Durable)
		}
	}
	f.awaitSources(t, s.topo.HistoryStream)
}

// awaitSources waits until every existing source of the history is attached, so a
// correct shape has no transient finding.
func (f *natsFixture) awaitSources(t testing.TB, history string) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := f.admin.Stream(t.Context(), history)
		if err != nil {
			return true // no history: nothing to attach
		}
		info := st.CachedInfo()
		attached := 0
		for _, src := range info.Sources {
			if src.Active >= 0 {
				attached++
			}
		}
		existing := 0
		for _, src := range info.Config.Sources {
			if _, err := f.admin.Stream(t.Context(), src.Name); err == nil && src.External == nil {
				existing++
			}
		}
		return attached >= existing
	}, 30*time.Second, 10*time.Millisecond)
}
