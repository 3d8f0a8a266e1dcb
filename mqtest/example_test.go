package mqtest_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// newBroker is Harness.New: a fresh EmbeddedNATS in its own directory, listening on
// loopback so that endDelivery can reach its server from outside, with the suite's
// two tenants budgeted as production would.
func newBroker(t *testing.T) mq.Broker {
	b, err := mq.NewEmbedded(t.Context(), mq.EmbeddedOptions{StoreDir: t.TempDir(), ListenAddr: "127.0.0.1:0", NoSync: true})
	if err != nil {
		t.Fatalf("open a broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() }) // Close is idempotent: a case may have closed it
	for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
		if err := b.SetMaxBytes(t.Context(), tenant, 64<<20); err != nil {
			t.Fatalf("budget %s: %v", tenant, err)
		}
	}
	return b
}

// endDelivery is Harness.EndDelivery: it deletes the ingest durable on every
// partition through a client of its own, as an operator could.
func endDelivery(t *testing.T, b mq.Broker) {
	nc, err := nats.Connect(b.(*mq.EmbeddedNATS).ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	topo := mq.NATSTopology{}.WithDefaults()
	for p := range topo.Partitions {
		if err := js.DeleteConsumer(t.Context(), topo.PartitionStream(p), topo.IngestConsumer); err != nil {
			t.Fatalf("delete the durable on partition %d: %v", p, err)
		}
	}
}

// parked is Harness.DeadLetters, through the broker's mq.DeadLetterManager.
func parked(t *testing.T, b mq.Broker, tenant mq.TenantID) []*mq.Message {
	var all []*mq.Message
	for cursor := ""; ; {
		page, next, err := b.(mq.DeadLetterManager).DeadLetters(t.Context(), tenant, mq.DeadLetterQuery{Cursor: cursor})
		if err != nil {
			t.Fatalf("parked events of %s: %v", tenant, err)
		}
		if all = append(all, page...); next == "" {
			return all
		}
		cursor = next
	}
}

// A broker's conformance test, here for EmbeddedNATS from its public API alone. In a
// _test.go file it is
//
//	func TestMyBroker_Conformance(t *testing.T) { mqtest.Run(t, harness) }
//
// run with go test -parallel 16 -run TestMyBroker_Conformance. Restart is left nil,
// so the restart cases are skipped.
func ExampleRun() {
	harness := mqtest.Harness{
		New:         newBroker,
		EndDelivery: endDelivery,
		Fill:        mqtest.FillByPublishing,
		DeadLetters: parked,
		// The NATS brokers keep the Nats- headers for themselves.
		ReservedHeaderPrefix: "Nats-",
		Caps: mqtest.Caps{
			StatsConnections:   true,
			PerTenantBudget:    true,
			PurgesAcked:        true,
			UnbudgetedNotFound: true,
			ConfiguresDurables: true,
			AckWaitRedelivers:  true,
			StoresBudgets:      true,
			RetryPolicy:        true,
			ConcurrentTenants:  true,
			HandsBackOnStop:    true,
			SharedConsumers:    true,
			AtomicBatch:        true,
		},
	}
	conformance := func(t *testing.T) { mqtest.Run(t, harness) }
	_ = conformance
}
