//go:build integration

package mq

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// externalFixture is a server configured from the shipped Helm values with the shipped
// manifests applied by the operator user.
type externalFixture struct {
	*natsFixture
	shape *shape
}

func newExternalFixture(t *testing.T) *externalFixture {
	t.Helper()
	f := newValuesFixture(t)
	return &externalFixture{natsFixture: f, shape: f.applyShipped(t, 1)}
}

// config is a broker configuration connecting as the restricted application user.
func (f *externalFixture) config(t testing.TB) NATSConfig {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(pw, []byte(password(appUser)+"\n"), 0o600))
	return NATSConfig{
		NATSTopology: NATSTopology{Partitions: shippedTopology.Partitions},
		URLs:         f.clientURLs(),
		User:         appUser,
		PasswordFile: pw,
		TopologyWait: 10 * time.Second,
		Logger:       quietLog,
	}
}

// broker boots an ExternalNATS as the application user, closed at cleanup.
func (f *externalFixture) broker(t testing.TB, mutate ...func(*NATSConfig)) *ExternalNATS {
	t.Helper()
	cfg := f.config(t)
	for _, m := range mutate {
		m(&cfg)
	}
	e, err := NewNATS(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// stop shuts the server down, keeping its port and store for restart.
func (f *natsFixture) stop(t *testing.T) {
	t.Helper()
	opts := f.opts.Clone()
	opts.Port = f.srv.Addr().(*net.TCPAddr).Port
	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	f.opts = opts
}

// restart starts a server again on the same port and store.
func (f *natsFixture) restart(t *testing.T) {
	t.Helper()
	f.srv = runServer(t, f.opts.Clone())
}

// streamMsgs counts what a stream holds, read as the operator.
func (f *natsFixture) streamMsgs(t *testing.T, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := f.admin.Stream(ctx, name)
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

// updateStream changes a stream's configuration as the operator.
func (f *natsFixture) updateStream(t *testing.T, name string, change func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := f.admin.Stream(ctx, name)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	change(&cfg)
	_, err = f.admin.UpdateStream(ctx, cfg)
	require.NoError(t, err)
}

// deleteIngestDurables deletes the ingest durable on every partition as the operator.
func (f *natsFixture) deleteIngestDurables(t *testing.T, topo NATSTopology) {
	t.Helper()
	topo = topo.WithDefaults()
	for p := range topo.Partitions {
		err := f.admin.DeleteConsumer(t.Context(), topo.PartitionStream(p), topo.IngestConsumer)
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			require.NoError(t, err)
		}
	}
}
