package mqtest_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// TestMemBroker_Conformance runs the whole suite against the in-memory broker, with
// the flags it honestly has. It is not parallel: mqtest.Run sets global state. Under
// memWrongEnv it runs with one declaration made wrong (see
// TestMemBroker_ConformanceFailsEveryWrongDeclaration).
func TestMemBroker_Conformance(t *testing.T) {
	h := memHarness()
	if wrong := os.Getenv(memWrongEnv); wrong != "" {
		flip, ok := memWrongDeclarations[wrong]
		require.True(t, ok, "%s=%q names no declaration", memWrongEnv, wrong)
		flip.declare(&h)
	}
	mqtest.Run(t, h)
}

// TestMemBroker_ConformanceWithoutAtomicBatches runs the whole suite against the
// in-memory broker made one without atomic batches, declared so: an honest broker on
// the other side of Caps.AtomicBatch passes too, so the flag is checked both ways by
// honest brokers as well as by wrong declarations. Not parallel, as above.
func TestMemBroker_ConformanceWithoutAtomicBatches(t *testing.T) {
	if os.Getenv(memWrongEnv) != "" {
		t.Skip("inside a child process")
	}
	h := memHarness()
	open := h.New
	h.New = func(t *testing.T) mq.Broker {
		b := open(t)
		memOf(t, b).noAtomic = true // before any call: the case has not the broker yet
		return b
	}
	h.Caps.AtomicBatch = false
	mqtest.Run(t, h)
}

func memHarness() mqtest.Harness {
	return mqtest.Harness{
		New: func(t *testing.T) mq.Broker {
			b := openMemBroker(newMemStore())
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
				require.NoError(t, b.SetMaxBytes(ctx, tenant, 64<<20), "budget %s", tenant)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		},
		EndDelivery: func(t *testing.T, b mq.Broker) { memOf(t, b).deleteDurable(mqtest.Durable) },
		Fill:        mqtest.FillByPublishing,
		DeadLetters: func(t *testing.T, b mq.Broker, tenant mq.TenantID) []*mq.Message { return memOf(t, b).parkedOf(tenant) },
		// Restart closes the broker and opens another on its store.
		Restart: func(t *testing.T, b mq.Broker) mq.Broker {
			m := memOf(t, b)
			require.NoError(t, m.Close())
			again := openMemBroker(m.memStore)
			t.Cleanup(func() { _ = again.Close() })
			return again
		},
		ReservedHeaderPrefix: memReservedPrefix,
		// Every other flag is false: one handler call at a time, failures redelivered
		// at once and never parked, a fixed ack wait, no connections.
		Caps: mqtest.Caps{
			PerTenantBudget:  true,
			PurgesAcked:      true,
			StoresBudgets:    true,
			DurablesOnDemand: true,
			AtomicBatch:      true, // one lock stores a batch whole
		},
	}
}

func memOf(t *testing.T, b mq.Broker) *memBroker {
	t.Helper()
	m, ok := b.(*memBroker)
	require.True(t, ok, "broker is a %T, not the in-memory one", b)
	return m
}

// memWrongEnv names the declaration TestMemBroker_Conformance makes wrong.
const memWrongEnv = "MQTEST_MEM_WRONG"

// memWrongDeclaration is one declaration made wrong, a case that must then fail, and
// what its failure must name.
type memWrongDeclaration struct {
	declare func(h *mqtest.Harness)
	failing string
	names   string
}

// memWrongDeclarations flips each flag and the reserved prefix both ways.
var memWrongDeclarations = map[string]memWrongDeclaration{
	"StoresBudgets": {func(h *mqtest.Harness) { h.Caps.StoresBudgets = false },
		"ARestartKeepsDeadLettersAndBudgetsWhereTheBrokerStoresThem", "Caps.StoresBudgets"},
	"PerTenantBudget": {func(h *mqtest.Harness) { h.Caps.PerTenantBudget = false },
		"BudgetIsEnforcedExactlyWhenPerTenantBudgetIsDeclared", "Caps.PerTenantBudget"},
	"PurgesAcked": {func(h *mqtest.Harness) { h.Caps.PurgesAcked = false },
		"PurgeAcked", "Caps.PurgesAcked"},
	"UnbudgetedNotFound": {func(h *mqtest.Harness) { h.Caps.UnbudgetedNotFound = true },
		"DeadLetterCounts", "Caps.UnbudgetedNotFound"},
	"ConfiguresDurables": {func(h *mqtest.Harness) { h.Caps.ConfiguresDurables = true },
		"CreateConsumerAppliesTheConfigExactlyWhenItConfiguresDurables", "Caps.ConfiguresDurables"},
	"AckWaitRedelivers": {func(h *mqtest.Harness) { h.Caps.AckWaitRedelivers = true },
		"AckWaitRedelivers", "Caps.AckWaitRedelivers"},
	"RetryPolicy": {func(h *mqtest.Harness) { h.Caps.RetryPolicy = true },
		"AnEventThatFailsOnItsMaxDeliveriesthDeliveryIsParkedWithWhyAndAckedAndItsTenantGoesOn", "Caps.RetryPolicy"},
	"ConcurrentTenants": {func(h *mqtest.Harness) { h.Caps.ConcurrentTenants = true },
		"DifferentTenantsRunAtOnceUpToConcurrencyAndATenantNeverTwice", "Caps.ConcurrentTenants"},
	"HandsBackOnStop": {func(h *mqtest.Harness) { h.Caps.HandsBackOnStop = true },
		"StopHandsBackWhatWaitedSoANewConsumeGetsItAtOnceInOrder", "Caps.HandsBackOnStop"},
	"SharedConsumers": {func(h *mqtest.Harness) { h.Caps.SharedConsumers = true },
		"TwoConsumesShareADurableEachTenantInOrderAndOneTakesOverWhenTheOtherStops", "Caps.SharedConsumers"},
	"DurablesOnDemand": {func(h *mqtest.Harness) { h.Caps.DurablesOnDemand = false },
		"CreateConsumerRefusesAnUnknownDurableUnlessDurablesOnDemand", "Caps.DurablesOnDemand"},
	"StatsConnections": {func(h *mqtest.Harness) { h.Caps.StatsConnections = true },
		"Stats", "Caps.StatsConnections"},
	"AtomicBatch": {func(h *mqtest.Harness) { h.Caps.AtomicBatch = false },
		"AnAtomicBatchStoresEverythingInOrderOrIsUnsupportedExactlyAsAtomicBatchIsDeclared", "Caps.AtomicBatch"},
	"ReservedHeaderPrefixNats": {func(h *mqtest.Harness) { h.ReservedHeaderPrefix = "Nats-" },
		"RefusesAReservedHeaderAndStoresNothing", "Harness.ReservedHeaderPrefix"},
	"ReservedHeaderPrefixNone": {func(h *mqtest.Harness) { h.ReservedHeaderPrefix = "" },
		"RefusesAReservedHeaderAndStoresNothing", "Harness.ReservedHeaderPrefix"},
}

// TestMemBroker_ConformanceFailsEveryWrongDeclaration proves each flag is checked both
// ways: declared the other way round for the in-memory broker, a case fails, and its
// failure names the flag. Each runs the one case in a child process of this test
// binary, with the suite's windows scaled down so a failing wait ends soon.
func TestMemBroker_ConformanceFailsEveryWrongDeclaration(t *testing.T) {
	if os.Getenv(memWrongEnv) != "" {
		t.Skip("inside a child process")
	}
	for name, wrong := range memWrongDeclarations {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0],
				"-test.run=^TestMemBroker_Conformance$/^"+wrong.failing+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), memWrongEnv+"="+name, "MQTEST_WAIT_SCALE=0.2")
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "the case %s passed with %s declared wrong:\n%s", wrong.failing, name, out)
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the child did not run:\n%s", out)
			assert.Contains(t, string(out), "--- FAIL: TestMemBroker_Conformance/"+wrong.failing, "the case that must fail")
			assert.Contains(t, string(out), wrong.names, "the failure names the declaration")
		})
	}
}
