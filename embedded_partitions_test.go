//go:build integration

package mq

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEmbeddedNATS_AStoreIsReopenedWithAnotherPartitionCountOnlyOnceItsPartitionsAreEmpty:
// with events on the partitions, fewer partitions would strand those beyond the new
// count and more would split tenants across two partitions, so both are refused and
// nothing is lost; once a worker drained them the change is made, and the partitions
// beyond the new count go.
func TestEmbeddedNATS_AStoreIsReopenedWithAnotherPartitionCountOnlyOnceItsPartitionsAreEmpty(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	withPartitions := func(n int) func(*EmbeddedOptions) {
		return func(o *EmbeddedOptions) { o.Topology.Partitions = n }
	}
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	var want []string
	for i := range 8 { // tenants on every one of the four partitions
		tenant := TenantID(fmt.Sprintf("tenant-%d", i))
		require.NoError(t, e.SetMaxBytes(ctx, tenant, 1<<20))
		require.NoError(t, e.Publish(ctx, Topic{Tenant: tenant, Table: "t"}, []byte(tenant)))
		want = append(want, string(tenant))
	}
	// Copied to the history before the restart, so once drained after it the partitions
	// empty without waiting for the sources to re-attach.
	require.Eventually(t, func() bool {
		s, err := e.Status(ctx, StatusOptions{})
		return err == nil && s.History.Messages == uint64(len(want))
	}, 30*time.Second, 20*time.Millisecond, "the history never copied the events")
	require.NoError(t, e.Close())

	for _, n := range []int{2, 8} {
		_, err := NewEmbedded(t.Context(), EmbeddedOptions{StoreDir: dir, NoSync: true, Logger: quietLog, Topology: NATSTopology{Partitions: n}})
		require.ErrorIs(t, err, ErrInvalidConfig, "%d partitions over a store of 4 holding events", n)
		assert.Contains(t, err.Error(), "WH_INGEST_3 holds ", "the error names what the store holds")
	}

	e = openEmbedded(t, dir)
	got := drain(t, e, len(want))
	slices.Sort(got)
	assert.Equal(t, want, got, "the refused reopenings lost nothing")
	require.Eventually(t, func() bool {
		s, err := e.Status(ctx, StatusOptions{})
		if err != nil {
			return false
		}
		for _, p := range s.Partitions {
			if p.Messages > 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 50*time.Millisecond, "the drained partitions never emptied")
	require.NoError(t, e.Close())

	e = openEmbedded(t, dir, withPartitions(2))
	for p := 2; p < 4; p++ {
		_, err := e.js.Stream(ctx, e.topo.PartitionStream(p))
		assert.ErrorIs(t, err, jetstream.ErrStreamNotFound, "partition %d beyond the new count", p)
	}
	h, err := e.js.Stream(ctx, e.topo.HistoryStream)
	require.NoError(t, err)
	assert.Len(t, h.CachedInfo().Config.Sources, 2, "the history sources the two partitions left")
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "tenant-3", Table: "t"}, []byte("after")))
	assert.Equal(t, []string{"after"}, drain(t, e, 1))
}

// TestEmbeddedNATS_EmptyPartitionsAnEarlierCountLeftBehindGoWhileTheOthersKeepTheirEvents:
// an earlier version, taking fewer partitions, left the ones beyond behind; once empty
// they are removed with their record of acknowledged events, and the partitions the
// count keeps go on holding their events.
func TestEmbeddedNATS_EmptyPartitionsAnEarlierCountLeftBehindGoWhileTheOthersKeepTheirEvents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("kept")))
	// What an earlier version left: an empty partition 5 of 6, and its record.
	six := e.topo
	six.Partitions = 6
	_, err := e.js.CreateStream(ctx, six.partitionConfig(5))
	require.NoError(t, err)
	_, err = e.js.CreateOrUpdateConsumer(ctx, six.PartitionStream(5), six.ingestConsumerConfig(5))
	require.NoError(t, err)
	_, err = e.kv.Put(ctx, ackedKey(5), []byte("3-4"))
	require.NoError(t, err)
	require.NoError(t, e.Close())

	e = openEmbedded(t, dir)
	_, err = e.js.Stream(ctx, e.topo.PartitionStream(5))
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound, "the empty partition left behind")
	_, err = e.kv.Get(ctx, ackedKey(5))
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "its record of acknowledged events")
	assert.Equal(t, []string{"kept"}, drain(t, e, 1))
}
