package mqtest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func restartCases() []testCase {
	return []testCase{
		{
			name: "AnIdleRestartDeliversEveryUnacknowledgedEventInOrder",
			proves: "Events nobody consumed yet survive two restarts of a broker that was left " +
				"idle before each, and then arrive in order per tenant. (The NATS brokers " +
				"once lost them all: a restarting server removed what its history had " +
				"copied.)",
			hooks:     []string{"Restart"},
			publishes: "10 events each on acme/r and globex/r/s",
			skip:      needRestart,
			run:       idleRestartDeliversEverything,
		},
		{
			name: "ARestartRedeliversWhatWasNakedOrHeldAndNotWhatWasAcknowledged",
			proves: "Before an idle restart the worker acknowledges some events, naks others over " +
				"and over and holds the rest unsettled; afterwards every event it did not " +
				"acknowledge comes again, each once, and none it acknowledged (the held ones " +
				"within the case where AckWait redelivers; elsewhere they may, when the " +
				"broker hands them back at Close).",
			hooks:     []string{"Restart"},
			flags:     []string{"AckWaitRedelivers"},
			publishes: "12 events over acme, globex and 10 more tenants, on settle",
			skip:      needRestart,
			run:       restartRedeliversUnsettled,
		},
		{
			name: "ARestartKeepsDeadLettersAndBudgetsWhereTheBrokerStoresThem",
			proves: "Parked events are still counted after two restarts; a budget set before them " +
				"is still reported where the broker stores budgets (Caps.StoresBudgets), and " +
				"is reported as never set where it does not.",
			hooks:     []string{"Restart"},
			flags:     []string{"StoresBudgets"},
			publishes: "parks on acme/orders, acme/orders/eu and globex/users",
			skip:      needRestart,
			run:       restartKeepsDeadLettersAndBudgets,
		},
		{
			name: "ARestartKeepsEnforcingTheBudgetOfWhatIsStillQueued",
			proves: "Only with PerTenantBudget and StoresBudgets: the bytes still queued " +
				"count against the budget after a restart exactly as before it: a tenant that " +
				"was full is still full after the restart, until its events are consumed, and " +
				"then takes events again.",
			hooks:     []string{"Restart"},
			flags:     []string{"PerTenantBudget", "StoresBudgets"},
			publishes: "events on acme/b up to its budget",
			skip:      needRestart,
			run:       restartKeepsEnforcing,
		},
	}
}

func needRestart(h Harness) string {
	if h.Restart == nil {
		return "Harness.Restart is nil, so the claim Caps.StoresBudgets makes goes unchecked"
	}
	return ""
}

// restart closes the case's broker and carries on with the one Harness.Restart opens
// on the same store. Cases restart twice where a loss may show only at the store's
// second restart.
func (e *env) restart() {
	e.t.Helper()
	b := e.h.Restart(e.t, e.b)
	require.NotNil(e.t, b, "Harness.Restart returned nil")
	e.b = b
}

// settle waits until a full replay of tp from the beginning has n events, so the
// broker's history has them, then lets the broker idle.
func (e *env) settle(tp mq.Topic, n int) {
	e.t.Helper()
	e.replayReaches(tp, n)
	time.Sleep(idle)
}

func idleRestartDeliversEverything(t *testing.T, h Harness) {
	e := setupRestarting(t, h, 2)
	const n = 10
	for i := range n {
		e.publish(topic(Acme, "r", ""), fmt.Sprint(i))
		e.publish(topic(Globex, "r", "s"), fmt.Sprint(i))
	}
	e.settle(topic(Acme, "r", ""), n)
	e.restart()
	e.settle(topic(Globex, "r", "s"), n)
	e.restart()
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	got := byTenant(next(t, c.deliveries, 2*n))
	assert.Equal(t, seq("", n), got[Acme], "acme's events after two restarts")
	assert.Equal(t, seq("", n), got[Globex], "globex's events after two restarts")
	none(t, c.deliveries)
}

func restartRedeliversUnsettled(t *testing.T, h Harness) {
	e := setupRestarting(t, h, 1)
	const n = 12
	// One tenant per event: a nak holds its tenant's later events until it is
	// settled, and these naks never settle.
	tenants := e.manyTenants(n - 2)
	for i := range n {
		e.publish(topic(tenants[i], "settle", ""), fmt.Sprint(i))
	}
	// Where AckWait redelivers, a short one brings held events back after the restart
	// soon; elsewhere the operator's ack wait governs, and only naks are checked.
	cfg := mq.ConsumerConfig{}
	if h.Caps.AckWaitRedelivers {
		cfg.AckWait = ackWait
	}
	c := e.consume(cfg, func(m *mq.Message) error {
		var i int
		_, _ = fmt.Sscan(string(m.Data), &i)
		switch i % 3 {
		case 0:
			return e.ackEach(m)
		case 1:
			if err := m.NakWithDelay(100 * time.Millisecond); err != nil { // again at every redelivery
				e.errorf("nak with delay %q: %v", m.Data, err)
			}
		}
		return nil // i%3 == 2: held, never settled
	})
	next(t, c.deliveries, n)
	for _, id := range tenants {
		e.replayReaches(topic(id, "settle", ""), 1)
	}
	time.Sleep(idle)
	c.stop()
	e.restart()
	d := e.consume(cfg, e.ackEach)
	// The nak'ed events must come; the held ones must where AckWait redelivers, and may
	// anyway (a broker may hand back at Close what handlers returned unsettled).
	var want []string
	for i := range n {
		if i%3 == 1 || i%3 == 2 && h.Caps.AckWaitRedelivers {
			want = append(want, fmt.Sprint(i))
		}
	}
	got := datas(nextUntil(t, d.deliveries, fmt.Sprintf("the unacknowledged events %v (Caps.AckWaitRedelivers %v)", want, h.Caps.AckWaitRedelivers),
		func(got []delivery) bool {
			seen := datas(got)
			for _, w := range want {
				if !slices.Contains(seen, w) {
					return false
				}
			}
			return true
		}))
	for _, g := range got {
		var i int
		_, _ = fmt.Sscan(g, &i)
		assert.NotZero(t, i%3, "event %s was acknowledged before the restart and came again", g)
	}
	slices.Sort(got)
	assert.Equal(t, len(got), len(slices.Compact(slices.Clone(got))), "each unacknowledged event once: %v", got)
}

func restartKeepsDeadLettersAndBudgets(t *testing.T, h Harness) {
	e := setupRestarting(t, h, 2)
	require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 40<<20))
	e.park(topic(Acme, "orders", "eu"), "poison-1")
	e.park(topic(Acme, "orders", ""), "poison-2")
	e.park(topic(Globex, "users", ""), "poison-3")
	time.Sleep(idle)
	e.restart()
	e.restart()
	counts, err := e.b.DeadLetterCounts(e.ctx, Acme, "")
	require.NoError(t, err)
	assert.Equal(t, uint64(2), counts.Total, "acme's parked events after two restarts")
	assert.Equal(t, map[string]uint64{"orders": 2}, counts.Tables)
	counts, err = e.b.DeadLetterCounts(e.ctx, Globex, "users")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), counts.Total, "globex's parked events after two restarts")
	if h.Caps.StoresBudgets {
		assert.Equal(t, int64(40<<20), e.b.MaxBytes(Acme), "Caps.StoresBudgets is true, but the budget is gone after two restarts")
	} else {
		assert.Zero(t, e.b.MaxBytes(Acme), "Caps.StoresBudgets is false, yet a budget survived the restart")
	}
}

func restartKeepsEnforcing(t *testing.T, h Harness) {
	if !h.Caps.PerTenantBudget || !h.Caps.StoresBudgets {
		t.Skip("needs Caps.PerTenantBudget and Caps.StoresBudgets")
	}
	e := setupRestarting(t, h, 1)
	// Find the budget that holds exactly k events of this size, by filling a fresh one.
	tp := topic(Acme, "b", "")
	const event = "0123456789abcdef0123456789abcdef"
	require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 4096))
	k := 0
	for ; ; k++ {
		err := e.b.Publish(e.ctx, tp, []byte(event))
		if errors.Is(err, mq.ErrQueueFull) {
			break
		}
		require.NoError(t, err, "event %d of those filling acme's 4 KiB budget: want it stored, or refused "+
			"with an error wrapping mq.ErrQueueFull once the budget is used up", k)
		require.Less(t, k, 4096, "a 4 KiB budget never filled")
	}
	e.settle(tp, k)
	e.restart()
	assert.ErrorIs(t, e.b.Publish(e.ctx, tp, []byte(event)), mq.ErrQueueFull,
		"the tenant was full before the restart and is after it")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	next(t, c.deliveries, k)
	require.Eventually(t, func() bool { return e.b.Publish(e.ctx, tp, []byte(event)) == nil }, wait, poll,
		"once its queued events were consumed the tenant takes events again")
}
