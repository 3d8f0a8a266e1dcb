package mqtest_test

import (
	"sync"
	"testing"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// A harness with Restart, so the restart cases run: New keeps each broker's store
// directory, and Restart closes the broker and opens another on that same directory,
// so the reopened broker sees the events, parks and budgets the first one stored.
// Each broker, the reopened one included, registers its own cleanup on t: the suite
// closes neither, and a reopened broker left open would hold its server and its
// store's lock until the process ends.
func ExampleHarness_restart() {
	var dirs sync.Map // each broker New or Restart returned -> its store directory
	open := func(t *testing.T, dir string) *mq.EmbeddedNATS {
		b, err := mq.NewEmbedded(t.Context(), mq.EmbeddedOptions{StoreDir: dir, NoSync: true})
		if err != nil {
			t.Fatalf("open a broker on %s: %v", dir, err)
		}
		t.Cleanup(func() { _ = b.Close() }) // Close is idempotent: a case or Restart may have closed it
		dirs.Store(mq.Broker(b), dir)
		return b
	}
	harness := mqtest.Harness{
		New: func(t *testing.T) mq.Broker {
			b := open(t, t.TempDir()) // the directory lives as long as the case
			for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
				if err := b.SetMaxBytes(t.Context(), tenant, 64<<20); err != nil {
					t.Fatalf("budget %s: %v", tenant, err)
				}
			}
			return b
		},
		Restart: func(t *testing.T, b mq.Broker) mq.Broker {
			dir, ok := dirs.Load(b)
			if !ok {
				t.Fatalf("broker %p was not opened by this harness", b)
			}
			if err := b.Close(); err != nil { // as a host does at a deploy
				t.Fatalf("close before the restart: %v", err)
			}
			return open(t, dir.(string)) // the same store: budgets are kept there too
		},
		Fill: mqtest.FillByPublishing,
		// The other hooks and every flag as in the example of Run.
		ReservedHeaderPrefix: "Nats-",
		Caps:                 mqtest.Caps{StoresBudgets: true, PerTenantBudget: true /* ... */},
	}
	conformance := func(t *testing.T) { mqtest.Run(t, harness) }
	_ = conformance
}
