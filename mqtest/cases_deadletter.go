package mqtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func deadLetterCases() []testCase {
	return []testCase{
		{
			name: "DeadLetterKeepsTheTopicAndDoesNotAck",
			proves: "Parking a delivered event does not settle it (it comes back after a Nak), " +
				"and the park counts under its table, scope rolled up.",
			publishes: "1 event on acme/t/s, parked",
			run:       deadLetterKeepsTheTopicAndDoesNotAck,
		},
		{
			name: "DeadLetterCounts",
			proves: "Every scope counts under its table; a table filter keeps that table and all " +
				"its scopes while Total stays the tenant's whole count; a table literally " +
				"named \"odd.name\" never shares a count with table \"odd\" scope \"name\"; tenants " +
				"are separate; a never-budgeted tenant is ErrNoDeadLetterQueue exactly when " +
				"Caps.UnbudgetedNotFound says so.",
			flags:     []string{"UnbudgetedNotFound"},
			publishes: "parks on acme's t1, t1/s, t2, odd.name, odd/name and globex/t1",
			run:       deadLetterCounts,
		},
		{
			name: "DeadLettersKeepDataHeadersAndTopic",
			proves: "A park stores the event's data, its headers and the option headers under the " +
				"event's own topic, whether the event was delivered or built.",
			hooks: []string{"DeadLetters"},
			publishes: "parks of a delivered event and of built messages on acme/built and " +
				"acme/<hard table>/<hard scope>",
			run: deadLettersKeepContents,
		},
		{
			name: "DeadLetterThenAckRemovesTheOriginalAndKeepsThePark",
			proves: "The production flow, park then ack, removes the original (it is not " +
				"delivered again, not even to a new Consume) while the park stays counted.",
			flags:     []string{"AckWaitRedelivers"},
			publishes: "1 event on acme/t/s, parked then acked",
			run:       deadLetterThenAck,
		},
		{
			name: "DeadLetterRefusesAMessageWithoutATopicOrWithAReservedHeader",
			proves: "A message without a topic cannot be parked under it, and a reserved option " +
				"header is ErrInvalidHeader; neither is counted.",
			hooks:     []string{"ReservedHeaderPrefix"},
			publishes: "refused parks; 1 park on acme/t",
			run:       deadLetterRefusesBadInput,
		},
		{
			name:      "DeadLetterCountsRefusesAnInvalidTenant",
			proves:    "An id outside the grammar is ErrInvalidTenant, not \"no dead-letter queue\".",
			publishes: "nothing",
			run:       deadLetterCountsRefusesAnInvalidTenant,
		},
		{
			name: "DeadLetterIdempotencyKeysAreScopedToTheTenant",
			proves: "An idempotency key on a park is scoped to the parked message's tenant, as on " +
				"Publish. Two tenants parking under one key both park (a collision would drop " +
				"the second park as a duplicate, and its caller would ack the original: the " +
				"event would be gone); a tenant repeating its own key parks once.",
			hooks:     []string{"DeadLetters"},
			publishes: "parks on acme/t and globex/t under the same idempotency key",
			run:       deadLetterKeysAreScopedToTheTenant,
		},
	}
}

// counts reads tenant's dead-letter counts, requiring success.
func (e *env) counts(tenant mq.TenantID, table string) mq.DeadLetterCounts {
	e.t.Helper()
	c, err := e.b.DeadLetterCounts(e.ctx, tenant, table)
	require.NoError(e.t, err, "dead-letter counts of %s, table %q", tenant, table)
	return c
}

// assertCounts compares counts, treating a nil and an empty Tables alike.
func assertCounts(t *testing.T, want map[string]uint64, total uint64, got mq.DeadLetterCounts, what string) {
	t.Helper()
	if len(want) == 0 {
		assert.Empty(t, got.Tables, "%s: tables", what)
	} else {
		assert.Equal(t, want, got.Tables, "%s: tables", what)
	}
	assert.Equal(t, total, got.Total, "%s: total", what)
}

func deadLetterKeepsTheTopicAndDoesNotAck(t *testing.T, h Harness) {
	e := setup(t, h)
	var calls counter
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if calls.inc(string(m.Data)) > 1 {
			return e.ackEach(m)
		}
		if err := e.b.DeadLetter(e.ctx, m, mq.WithHeader("X-Error", "poison")); err != nil {
			e.errorf("dead letter: %v", err)
		}
		if err := m.Nak(); err != nil {
			e.errorf("nak: %v", err)
		}
		return nil
	})
	e.publish(topic(Acme, "t", "s"), "poison")
	got := next(t, c.deliveries, 2)
	assert.Equal(t, []string{"poison", "poison"}, datas(got), "parking acked the original")
	none(t, c.deliveries)
	assertCounts(t, map[string]uint64{"t": 1}, 1, e.counts(Acme, ""), "acme")
	assertCounts(t, nil, 0, e.counts(Globex, ""), "globex")
}

// park dead-letters an event built directly, without a settler.
func (e *env) park(tp mq.Topic, data string, opts ...mq.PublishOpt) {
	e.t.Helper()
	m := mq.NewMessage(e.ctx, tp, []byte(data))
	require.NoError(e.t, e.b.DeadLetter(e.ctx, m, opts...), "park %q on %s", data, tp)
}

func deadLetterCounts(t *testing.T, h Harness) {
	e := setup(t, h)
	assertCounts(t, nil, 0, e.counts(Globex, ""), "globex before anything was parked")

	e.park(topic(Acme, "t1", ""), "a")
	e.park(topic(Acme, "t1", ""), "b")
	e.park(topic(Acme, "t2", ""), "c")
	e.park(topic(Acme, "t1", "s"), "d")
	e.park(topic(Acme, "odd.name", ""), "e")
	e.park(topic(Acme, "odd", "name"), "f")
	e.park(topic(Globex, "t1", ""), "g")

	assertCounts(t, map[string]uint64{"t1": 3, "t2": 1, "odd.name": 1, "odd": 1}, 6, e.counts(Acme, ""), "acme")
	assertCounts(t, map[string]uint64{"t1": 3}, 6, e.counts(Acme, "t1"), "acme, table t1")
	assertCounts(t, map[string]uint64{"odd": 1}, 6, e.counts(Acme, "odd"), "acme, table odd")
	assertCounts(t, map[string]uint64{"odd.name": 1}, 6, e.counts(Acme, "odd.name"), "acme, table odd.name")
	assertCounts(t, nil, 6, e.counts(Acme, "nothing-parked"), "acme, a table with nothing parked")
	assertCounts(t, map[string]uint64{"t1": 1}, 1, e.counts(Globex, ""), "globex")

	const unbudgeted mq.TenantID = "initech"
	got, err := e.b.DeadLetterCounts(e.ctx, unbudgeted, "")
	if h.Caps.UnbudgetedNotFound {
		assert.ErrorIs(t, err, mq.ErrNoDeadLetterQueue, "Caps.UnbudgetedNotFound: a never-budgeted tenant")
		return
	}
	require.NoError(t, err, "a never-budgeted tenant, Caps.UnbudgetedNotFound false")
	assertCounts(t, nil, 0, got, "a never-budgeted tenant")
}

func deadLettersKeepContents(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, hardTable, hardScope)
	parked := make(chan struct{}, 1)
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if err := e.b.DeadLetter(e.ctx, m, mq.WithHeader("X-Error", "bad row"), mq.WithHeader("X-Error", "again")); err != nil {
			e.errorf("dead letter: %v", err)
			return nil
		}
		select {
		case parked <- struct{}{}:
		default:
		}
		return e.ackEach(m)
	})
	e.publish(tp, "delivered poison", mq.WithHeader("X-Orig", "v1"), mq.WithHeader("X-Orig", "v2"))
	next(t, c.deliveries, 1)
	<-parked
	built := topic(Acme, "built", "")
	require.NoError(t, e.b.DeadLetter(e.ctx,
		mq.NewMessage(e.ctx, built, []byte("built poison"), mq.WithMessageHeaders(mq.Headers{"X-Built": {"yes"}})),
		mq.WithHeader("X-Error", "built")))

	assertCounts(t, map[string]uint64{hardTable: 1, "built": 1}, 2, e.counts(Acme, ""), "acme")
	if h.DeadLetters == nil {
		t.Log("Harness.DeadLetters is nil: parked contents not checked")
		return
	}
	msgs := h.DeadLetters(t, e.b, Acme)
	require.Len(t, msgs, 2, "acme's parked events")
	byData := map[string]*mq.Message{}
	for _, m := range msgs {
		byData[string(m.Data)] = m
	}
	d, ok := byData["delivered poison"]
	require.True(t, ok, "the delivered event's data was not parked: %v", byData)
	key, _ := tp.Key()
	assert.Equal(t, key, d.TopicKey(), "parked under its own topic")
	assert.Equal(t, tp, d.Topic())
	assert.Equal(t, []string{"v1", "v2"}, d.Headers["X-Orig"], "the event's own headers")
	assert.Equal(t, []string{"bad row", "again"}, d.Headers["X-Error"], "the option headers")

	b, ok := byData["built poison"]
	require.True(t, ok, "the built event's data was not parked: %v", byData)
	assert.Equal(t, built, b.Topic())
	assert.Equal(t, []string{"yes"}, b.Headers["X-Built"])
	assert.Equal(t, []string{"built"}, b.Headers["X-Error"])

	assert.Empty(t, h.DeadLetters(t, e.b, Globex), "globex's parked events")
}

func deadLetterThenAck(t *testing.T, h Harness) {
	e := setup(t, h)
	cfg := mq.ConsumerConfig{}
	watch := quiet
	if h.Caps.AckWaitRedelivers {
		cfg.AckWait = ackWait // an unacked original would come back
		watch = 3 * quiet
	}
	c := e.consume(cfg, func(m *mq.Message) error {
		if err := e.b.DeadLetter(e.ctx, m, mq.WithHeader("X-Error", "poison")); err != nil {
			e.errorf("dead letter: %v", err)
			return nil
		}
		return e.ackEach(m)
	})
	e.publish(topic(Acme, "t", "s"), "poison")
	assert.Equal(t, "poison", next(t, c.deliveries, 1)[0].data)
	noneFor(t, c.deliveries, watch)
	c.stop()
	again := e.consume(cfg, e.ackEach)
	e.publish(topic(Acme, "t", ""), "fence")
	assert.Equal(t, "fence", next(t, again.deliveries, 1)[0].data, "the parked and acked original came back")
	none(t, again.deliveries)
	assertCounts(t, map[string]uint64{"t": 1}, 1, e.counts(Acme, ""), "acme")
}

func deadLetterRefusesBadInput(t *testing.T, h Harness) {
	e := setup(t, h)
	noTopic := mq.NewMessage(e.ctx, mq.Topic{Table: "t"}, []byte("x"))
	require.Empty(t, noTopic.TopicKey())
	assert.Error(t, e.b.DeadLetter(e.ctx, noTopic), "park a message without a topic")
	ok := mq.NewMessage(e.ctx, topic(Acme, "t", ""), []byte("x"))
	if prefix := h.ReservedHeaderPrefix; prefix != "" {
		assert.ErrorIs(t, e.b.DeadLetter(e.ctx, ok, mq.WithHeader(prefix+"Rollup", "all")), mq.ErrInvalidHeader,
			"Harness.ReservedHeaderPrefix is %q, but DeadLetter did not refuse header %sRollup", prefix, prefix)
	}
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme after refused parks")
	require.NoError(t, e.b.DeadLetter(e.ctx, ok))
	assertCounts(t, map[string]uint64{"t": 1}, 1, e.counts(Acme, ""), "acme after one park")
}

func deadLetterCountsRefusesAnInvalidTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, tenant := range invalidTenants {
		_, err := e.b.DeadLetterCounts(e.ctx, tenant, "")
		assert.ErrorIs(t, err, mq.ErrInvalidTenant, "tenant %q", tenant)
		assert.NotErrorIs(t, err, mq.ErrNoDeadLetterQueue, "tenant %q", tenant)
	}
}

func deadLetterKeysAreScopedToTheTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	key := mq.WithIdempotencyKey("row-1")
	e.park(topic(Acme, "t", ""), "acme row", key)
	e.park(topic(Globex, "t", ""), "globex row", key)
	e.park(topic(Acme, "t", ""), "acme row again", key)
	assertCounts(t, map[string]uint64{"t": 1}, 1, e.counts(Acme, ""), "acme")
	assertCounts(t, map[string]uint64{"t": 1}, 1, e.counts(Globex, ""), "globex")
	if h.DeadLetters == nil {
		t.Log("Harness.DeadLetters is nil: parked contents not checked")
		return
	}
	for tenant, want := range map[mq.TenantID]string{Acme: "acme row", Globex: "globex row"} {
		msgs := h.DeadLetters(t, e.b, tenant)
		require.Len(t, msgs, 1, "%s's parked events", tenant)
		assert.Equal(t, want, string(msgs[0].Data), "%s's park", tenant)
	}
}
