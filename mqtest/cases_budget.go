package mqtest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func budgetCases() []testCase {
	return []testCase{
		{
			name:      "MaxBytesReportsTheBudget",
			proves:    "MaxBytes reports each budget right after it is set.",
			publishes: "nothing",
			run:       maxBytesReportsTheBudget,
		},
		{
			name:      "MaxBytesOfANeverBudgetedTenantIsZero",
			proves:    "A tenant never given a budget reports 0.",
			publishes: "nothing",
			run:       maxBytesNeverBudgeted,
		},
		{
			name: "SetMaxBytesRefusesBadInputAndKeepsTheBudget",
			proves: "An invalid tenant is ErrInvalidTenant, a negative budget ErrInvalidConfig, and " +
				"after either MaxBytes keeps the last budget set in full.",
			publishes: "1 event on acme/t",
			run:       setMaxBytesRefusesBadInput,
		},
		{
			name: "BudgetIsEnforcedExactlyWhenPerTenantBudgetIsDeclared",
			proves: "With PerTenantBudget, a tenant given 4 KiB is refused with ErrQueueFull once " +
				"it is used up, and another tenant still publishes; without it, a tenant " +
				"given 1 KiB publishes 64 KiB.",
			flags: []string{"PerTenantBudget"},
			publishes: "up to 64 events of 1 KiB each on acme/budget and globex/budget under a 4 KiB " +
				"budget",
			run: budgetEnforcedPerCaps,
		},
		{
			name: "ANeverBudgetedTenantIsQueueFullExactlyWhereBudgetsApply",
			proves: "Where budgets apply, a tenant never given one is refused with ErrQueueFull " +
				"and nothing is stored; where they do not, it publishes.",
			flags:     []string{"PerTenantBudget"},
			publishes: "events for the never-budgeted tenant initech; 1 fence on acme/fence",
			run:       unbudgetedTenantPerCaps,
		},
		{
			name: "QueueFull",
			proves: "Once Fill ran, the tenant's next publish is ErrQueueFull; with " +
				"PerTenantBudget another tenant still publishes.",
			hooks:     []string{"Fill"},
			flags:     []string{"PerTenantBudget"},
			publishes: "Fill on acme; events on acme/t and globex/t",
			skip:      needFill,
			run:       queueFull,
		},
		{
			name: "AFullQueueRefusesOnlyItsTenant",
			proves: "A filled tenant's refused events are not stored, and (with PerTenantBudget) " +
				"another tenant publishes and is delivered in order meanwhile.",
			hooks:     []string{"Fill"},
			flags:     []string{"PerTenantBudget"},
			publishes: "Fill on acme; refused events on acme/refused, 20 events on globex/t",
			skip:      needFill,
			run:       fullQueueIsolation,
		},
		{
			name: "AFullQueueTakesEventsAgainOnceConsumed",
			proves: "ErrQueueFull is backpressure: once the consumers caught up (every event " +
				"acked), the tenant publishes again.",
			hooks:     []string{"Fill"},
			publishes: "Fill on acme; events on acme/t once consumed",
			skip:      needFill,
			run:       fullQueueRecovers,
		},
		{
			name: "Stats",
			proves: "Stats answers; with Caps.StatsConnections it counts the broker's own " +
				"connection, without it Connections is 0.",
			flags:     []string{"StatsConnections"},
			publishes: "nothing",
			run:       stats,
		},
		{
			name: "StatsCountTraffic",
			proves: "Publishing and delivering moves the message and byte counters: 10 KiB " +
				"published count in InMsgs and InBytes, their hub deliveries in OutMsgs and " +
				"OutBytes.",
			publishes: "events on acme/stats",
			run:       statsCountTraffic,
		},
	}
}

func maxBytesReportsTheBudget(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, n := range []int64{32 << 20, 48 << 20, 16 << 20} {
		require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, n))
		assert.Equal(t, n, e.b.MaxBytes(Acme))
	}
	assert.Equal(t, int64(64<<20), e.b.MaxBytes(Globex), "globex keeps its own budget")
}

func maxBytesNeverBudgeted(t *testing.T, h Harness) {
	e := setup(t, h)
	assert.Zero(t, e.b.MaxBytes("initech"))
	e.budget("initech")
	assert.Equal(t, int64(64<<20), e.b.MaxBytes("initech"))
	assert.Zero(t, e.b.MaxBytes("hooli"), "budgeting one tenant budgets another")
}

func setMaxBytesRefusesBadInput(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, tenant := range invalidTenants {
		assert.ErrorIs(t, e.b.SetMaxBytes(e.ctx, tenant, 1<<20), mq.ErrInvalidTenant, "tenant %q", tenant)
	}
	require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 32<<20))
	assert.ErrorIs(t, e.b.SetMaxBytes(e.ctx, Acme, -1), mq.ErrInvalidConfig, "a negative budget")
	assert.Equal(t, int64(32<<20), e.b.MaxBytes(Acme), "a refused budget replaced the last one")
	e.publish(topic(Acme, "t", ""), "still open")
}

// publishBytes publishes size bytes on tp and returns the error.
func (e *env) publishBytes(tp mq.Topic, size int, i int) error {
	data := bytes.Repeat([]byte{'a' + byte(i%26)}, size)
	return e.b.Publish(e.ctx, tp, data)
}

func budgetEnforcedPerCaps(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "budget", "")
	if !h.Caps.PerTenantBudget {
		require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 1<<10))
		for i := range 64 {
			require.NoError(t, e.publishBytes(tp, 1<<10, i),
				"Caps.PerTenantBudget is false, yet event %d (1 KiB) over a 1 KiB budget was refused", i)
		}
		return
	}
	require.NoError(t, e.b.SetMaxBytes(e.ctx, Acme, 4<<10))
	refused := -1
	for i := range 64 {
		err := e.publishBytes(tp, 1<<10, i)
		if err == nil {
			continue
		}
		require.ErrorIs(t, err, mq.ErrQueueFull, "Caps.PerTenantBudget: event %d over a 4 KiB budget", i)
		refused = i
		break
	}
	require.GreaterOrEqual(t, refused, 1, "Caps.PerTenantBudget: a 4 KiB budget took %d KiB, or refused the first 1 KiB", 64)
	require.LessOrEqual(t, refused, 4, "Caps.PerTenantBudget: a 4 KiB budget took %d events of 1 KiB", refused)
	assert.ErrorIs(t, e.publishBytes(tp, 1<<10, 0), mq.ErrQueueFull, "Caps.PerTenantBudget: the full tenant again")
	for i := range 8 {
		assert.NoError(t, e.publishBytes(topic(Globex, "budget", ""), 1<<10, i), "Caps.PerTenantBudget: globex while acme is full")
	}
}

func unbudgetedTenantPerCaps(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic("initech", "t", "")
	hub := e.subscribe("unbudgeted")
	err := e.b.Publish(e.ctx, tp, []byte("unbudgeted"))
	if !h.Caps.PerTenantBudget {
		require.NoError(t, err, "Caps.PerTenantBudget is false, yet a never-budgeted tenant was refused")
		assert.Equal(t, "unbudgeted", next(t, hub, 1)[0].data)
		return
	}
	require.ErrorIs(t, err, mq.ErrQueueFull, "Caps.PerTenantBudget: a never-budgeted tenant")
	e.fenceAfterRefusals(hub)
	e.budget("initech")
	e.publish(tp, "budgeted")
	assert.Equal(t, "budgeted", next(t, hub, 1)[0].data)
}

func queueFull(t *testing.T, h Harness) {
	e := setup(t, h)
	h.Fill(t, e.b, Acme)
	err := e.b.Publish(e.ctx, topic(Acme, "t", ""), []byte("x"))
	assert.ErrorIs(t, err, mq.ErrQueueFull)
	if h.Caps.PerTenantBudget {
		assert.NoError(t, e.b.Publish(e.ctx, topic(Globex, "t", ""), []byte("x")), "Caps.PerTenantBudget: globex while acme is full")
	}
}

func fullQueueIsolation(t *testing.T, h Harness) {
	e := setup(t, h)
	h.Fill(t, e.b, Acme)
	for i := range 5 {
		assert.ErrorIs(t, e.b.Publish(e.ctx, topic(Acme, "refused", ""), []byte(fmt.Sprint("refused-", i))), mq.ErrQueueFull)
	}
	if h.Caps.PerTenantBudget {
		for i := range 20 {
			e.publish(topic(Globex, "t", ""), fmt.Sprint(i))
		}
	}
	assert.Empty(t, e.replay(topic(Acme, "refused", ""), time.Time{}), "a refused event was stored")
	if !h.Caps.PerTenantBudget {
		return
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	var globex []string
	deadline := time.After(wait)
	for len(globex) < 20 {
		select {
		case d := <-c.deliveries:
			require.NotEqual(t, "refused", d.topic.Table, "a refused event was delivered")
			if d.topic.Tenant == Globex {
				globex = append(globex, d.data)
			}
		case <-deadline:
			t.Fatalf("Caps.PerTenantBudget: globex got %d of 20 events within %s while acme was full", len(globex), wait)
		}
	}
	assert.Equal(t, seq("", 20), globex)
}

func fullQueueRecovers(t *testing.T, h Harness) {
	e := setup(t, h)
	h.Fill(t, e.b, Acme)
	tp := topic(Acme, "t", "")
	require.ErrorIs(t, e.b.Publish(e.ctx, tp, []byte("refused")), mq.ErrQueueFull)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	for until := time.Now().Add(wait); drainedWithin(c.deliveries, quiet) && time.Now().Before(until); {
	}
	var err error
	ok := eventually(func() bool {
		err = e.b.Publish(e.ctx, tp, []byte("accepted again"))
		return err == nil || !errors.Is(err, mq.ErrQueueFull)
	})
	require.True(t, ok, "still ErrQueueFull %s after every event was acked: %v", wait, err)
	require.NoError(t, err)
	var last string
	for last != "accepted again" {
		last = next(t, c.deliveries, 1)[0].data
	}
}

func stats(t *testing.T, h Harness) {
	e := setup(t, h)
	s, err := e.b.Stats()
	require.NoError(t, err)
	if h.Caps.StatsConnections {
		assert.GreaterOrEqual(t, s.Connections, int64(1), "Caps.StatsConnections is true, but Stats.Connections is %d", s.Connections)
	} else {
		assert.Zero(t, s.Connections, "Caps.StatsConnections is false, but Stats.Connections is %d", s.Connections)
	}
	for name, v := range map[string]int64{"InMsgs": s.InMsgs, "InBytes": s.InBytes, "OutMsgs": s.OutMsgs, "OutBytes": s.OutBytes} {
		assert.GreaterOrEqual(t, v, int64(0), name)
	}
}

func statsCountTraffic(t *testing.T, h Harness) {
	e := setup(t, h)
	before, err := e.b.Stats()
	require.NoError(t, err)
	hub := e.subscribe("stats")
	for i := range 10 {
		require.NoError(t, e.publishBytes(topic(Acme, "stats", ""), 1<<10, i))
	}
	next(t, hub, 10)
	var after mq.Stats
	ok := eventually(func() bool {
		after, err = e.b.Stats()
		return err == nil && after.InMsgs >= before.InMsgs+10 && after.InBytes >= before.InBytes+10<<10 &&
			after.OutMsgs >= before.OutMsgs+10 && after.OutBytes >= before.OutBytes+10<<10
	})
	require.NoError(t, err)
	assert.True(t, ok, "counters did not count 10 KiB in and out: before %+v, after %+v", before, after)
}
