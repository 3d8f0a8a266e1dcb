package mq

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// refusedWait bounds a request the server refuses: a refused publish is never
// answered, so the request just times out.
const refusedWait = 500 * time.Millisecond

func TestShippedValues_TheApplicationUsersPermissionsAreTheLibrarys(t *testing.T) {
	v := loadValues(t)
	users := v.Config.Merge["accounts"].(map[string]any)["WAVEHOUSE"].(map[string]any)["users"].([]any)
	var got *permissionsBlock
	for _, u := range users {
		m := u.(map[string]any)
		assert.Regexp(t, helmVariable, m["password"], "user %v: passwords come from the Secret, never inline", m["user"])
		if m["user"] == appUser {
			raw, err := yaml.Marshal(m["permissions"])
			require.NoError(t, err)
			got = &permissionsBlock{}
			require.NoError(t, yaml.Unmarshal(raw, got))
		} else {
			assert.Nil(t, m["permissions"], "the operator user is unrestricted")
		}
	}
	require.NotNil(t, got, "no %s user in %s", appUser, shippedValues)
	want, err := PermissionsFor(NATSTopology{})
	require.NoError(t, err)
	assert.Equal(t, want.PublishAllow, got.Publish.Allow)
	assert.Equal(t, want.PublishDeny, got.Publish.Deny)
	assert.Equal(t, want.SubscribeAllow, got.Subscribe.Allow)
}

func TestWriteNATSPermissions_PrintsTheBlockForAHelmUserEntry(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteNATSPermissions(&buf, NATSTopology{Prefix: "acme-wh"}))
	out := buf.String()
	assert.Contains(t, out, "# Permissions of the restricted mq application user (prefix acme-wh, history ACME-WH_HISTORY")
	var block struct {
		Permissions permissionsBlock `yaml:"permissions"`
	}
	require.NoError(t, yaml.Unmarshal(buf.Bytes(), &block))
	assert.Contains(t, block.Permissions.Publish.Allow, "acme-wh.ingest.>")
	assert.Contains(t, block.Permissions.Publish.Allow, "acme-wh.workers.INGEST")
	assert.Contains(t, block.Permissions.Publish.Allow, "$JS.API.CONSUMER.UNPIN.*.INGEST")
	assert.Equal(t, []string{"_INBOX_acme-wh.>", "acme-wh.workers.INGEST"}, block.Permissions.Subscribe.Allow)
	require.Error(t, WriteNATSPermissions(&buf, NATSTopology{Prefix: "A B"}))
}

// TestPermissionsFor_ATopologyThatCannotWorkIsInvalidConfigNotAPanic: PermissionsFor
// used to skip validation, so Partitions -1 panicked making the per-partition grants
// and 1<<40 ran out of memory; it now refuses what Validate refuses.
func TestPermissionsFor_ATopologyThatCannotWorkIsInvalidConfigNotAPanic(t *testing.T) {
	for name, topo := range map[string]NATSTopology{
		"negative partitions":            {Partitions: -1},
		"more partitions than the bound": {Partitions: 1 << 40},
		"a prefix of two tokens":         {Prefix: "a.b"},
	} {
		p, err := PermissionsFor(topo)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
		assert.Equal(t, NATSPermissions{}, p, "%s: nothing is granted", name)
	}
}

// appCore is the brokers' shared data path connected as the restricted user.
func appCore(t *testing.T, f *natsFixture) *natsCore {
	nc := f.connect(t, appUser)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	inst, err := newInstruments(nil, false)
	require.NoError(t, err)
	return newNATSCore(shippedTopology.WithDefaults(), nc, js, quietLog, newTracer(nil), inst)
}

// TestNATSPermissions_AllowEverythingTheBrokerDoes runs publish, the worker's pull, ack
// and unpin, the workers' presence, a dead letter and its count, a replay and the hub
// as the restricted user.
func TestNATSPermissions_AllowEverythingTheBrokerDoes(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	f.applyShipped(t, 1)
	c := appCore(t, f)
	ctx := testCtx(t)

	hub := make(chan *Message, 4)
	require.NoError(t, c.subscribe(ctx, "permissions", func(m *Message) error { hub <- m; return nil }))

	topic := Topic{Tenant: "acme", Table: "t", Scope: "s"}
	ev, err := c.ingestEvent(ctx, topic, []byte("one"), nil)
	require.NoError(t, err)
	_, err = c.send(ctx, ev)
	require.NoError(t, err, "publish")

	got := make(chan *Message, 4)
	policy, err := newWorkerPolicy(ConsumerConfig{}, c.topo.Partitions)
	require.NoError(t, err)
	w := &worker{core: c, ctx: ctx, durable: c.topo.IngestConsumer, policy: policy}
	stop, failed, err := w.Consume(func(m *Message) error { got <- m; return nil }, 0)
	require.NoError(t, err, "pull from the durable in its priority group")
	defer stop() // idempotent
	var m *Message
	select {
	case m = <-got:
	case err := <-failed:
		t.Fatalf("delivery ended: %v", err)
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	require.NoError(t, c.deadLetter(ctx, m, []PublishOpt{WithHeader("X-Error", "poison")}, ""), "dead letter")
	require.NoError(t, m.DoubleAck(ctx), "ack")
	partition := c.topo.PartitionStream(Partition(topic.Tenant, c.topo.Partitions))
	require.Equal(t, []string{partition}, pinnedPartitions(t, f.admin, c.topo), "the worker holds the partition it pulled from")
	stop()
	assert.Empty(t, pinnedPartitions(t, f.admin, c.topo), "a stopped worker unpins its partitions")

	presence, err := c.nc.SubscribeSync(c.topo.workerSubject())
	require.NoError(t, err, "subscribe to the workers' presence")
	require.NoError(t, c.nc.Publish(c.topo.workerSubject(), []byte("here")), "publish presence")
	hello, err := presence.NextMsg(5 * time.Second)
	require.NoError(t, err, "the workers' presence round-trips")
	assert.Equal(t, "here", string(hello.Data))
	counts, err := c.deadLetterCounts(ctx, "acme", "")
	require.NoError(t, err, "dead-letter counts")
	assert.Equal(t, DeadLetterCounts{Tables: map[string]uint64{"t": 1}, Total: 1}, counts)
	parkedPage, _, err := c.listDeadLetters(ctx, "acme", DeadLetterQuery{})
	require.NoError(t, err, "read parked events (STREAM.MSG.GET on the dead-letter stream)")
	require.Len(t, parkedPage, 1)
	assert.Equal(t, "poison", parkedPage[0].Headers.Get("X-Error"))
	n, err := c.deleteDeadLetters(ctx, "acme", DeadLetterSelector{IDs: []string{parkedPage[0].ID}})
	require.NoError(t, err, "delete a parked event (STREAM.MSG.DELETE on the dead-letter stream)")
	assert.Equal(t, 1, n)

	select {
	case hm := <-hub:
		assert.Equal(t, "one", string(hm.Data))
	case <-ctx.Done():
		t.Fatal("the hub saw nothing")
	}
	var replayed []string
	require.NoError(t, c.replay(ctx, topic, time.Time{}, func(m *Message) bool {
		replayed = append(replayed, string(m.Data))
		return true
	}), "replay")
	assert.Equal(t, []string{"one"}, replayed)
	oldest, err := c.oldestSequence(ctx)
	require.NoError(t, err, "the history's oldest sequence (STREAM.INFO on the history)")
	assert.Equal(t, uint64(1), oldest)
}

// pinnedPartitions lists, as js sees them, the partitions whose durable has a client
// pinned in the ingest group.
func pinnedPartitions(t *testing.T, js jetstream.JetStream, topo NATSTopology) []string {
	t.Helper()
	var pinned []string
	for p := range topo.Partitions {
		cons, err := js.Consumer(testCtx(t), topo.PartitionStream(p), topo.IngestConsumer)
		require.NoError(t, err)
		for _, g := range cons.CachedInfo().PriorityGroups {
			if g.Group == topo.IngestGroup && g.PinnedClientID != "" {
				pinned = append(pinned, topo.PartitionStream(p))
			}
		}
	}
	return pinned
}

// TestNATSPermissions_RefuseEveryTopologyChange: the restricted user can create,
// change, purge or delete no stream, make or change no durable on a partition and
// delete no durable. Each refused request goes unanswered, and the operator sees nothing changed.
func TestNATSPermissions_RefuseEveryTopologyChange(t *testing.T) {
	t.Parallel()
	f := newValuesFixture(t)
	f.applyShipped(t, 1)
	c := appCore(t, f)
	bounded := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), refusedWait)
		t.Cleanup(cancel)
		return ctx
	}
	_, err := c.js.CreateStream(bounded(), jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}})
	assert.Error(t, err, "stream create")
	part := c.topo.partitionConfig(0)
	part.Replicas, part.MaxBytes = 1, 1024
	_, err = c.js.UpdateStream(bounded(), part)
	assert.Error(t, err, "stream update")
	hist, err := c.js.Stream(t.Context(), c.topo.HistoryStream)
	require.NoError(t, err, "stream info is allowed")
	assert.Error(t, hist.Purge(bounded()), "stream purge")
	assert.Error(t, c.js.DeleteStream(bounded(), c.topo.DeadLetterStream()), "stream delete")
	dlq, err := c.js.Stream(t.Context(), c.topo.DeadLetterStream())
	require.NoError(t, err, "stream info is allowed")
	assert.Error(t, dlq.Purge(bounded()), "dead-letter purge: deleting single parked events is allowed, purging is not")
	_, err = c.js.CreateConsumer(bounded(), c.topo.PartitionStream(0), jetstream.ConsumerConfig{Durable: "evil", AckPolicy: jetstream.AckExplicitPolicy})
	assert.Error(t, err, "a durable on a partition")
	unpinned := c.topo.ingestConsumerConfig(2)
	unpinned.PriorityPolicy, unpinned.PriorityGroups, unpinned.PinnedTTL = jetstream.PriorityPolicyNone, nil, 0
	_, err = c.js.UpdateConsumer(bounded(), c.topo.PartitionStream(2), unpinned)
	assert.Error(t, err, "take the ingest durable's pinning off")
	assert.Error(t, c.js.DeleteConsumer(bounded(), c.topo.PartitionStream(1), c.topo.IngestConsumer), "delete the ingest durable")

	ctx := testCtx(t)
	_, err = f.admin.Stream(ctx, "EVIL")
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	s, err := f.admin.Stream(ctx, c.topo.PartitionStream(0))
	require.NoError(t, err)
	assert.Equal(t, c.topo.PartitionMaxBytes, s.CachedInfo().Config.MaxBytes)
	_, err = f.admin.Stream(ctx, c.topo.DeadLetterStream())
	assert.NoError(t, err)
	_, err = f.admin.Consumer(ctx, c.topo.PartitionStream(0), "evil")
	assert.ErrorIs(t, err, jetstream.ErrConsumerNotFound)
	_, err = f.admin.Consumer(ctx, c.topo.PartitionStream(1), c.topo.IngestConsumer)
	assert.NoError(t, err)
	durable, err := f.admin.Consumer(ctx, c.topo.PartitionStream(2), c.topo.IngestConsumer)
	require.NoError(t, err)
	assert.Equal(t, jetstream.PriorityPolicyPinned, durable.CachedInfo().Config.PriorityPolicy)
	findings, err := VerifyNATSTopology(ctx, c.js, c.topo)
	require.NoError(t, err, "the restricted user can run the verifier")
	assert.False(t, hasRequired(findings), "%v", findings)
}
