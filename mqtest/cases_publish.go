package mqtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"

	"github.com/wavehouse/mq"
)

func publishCases() []testCase {
	return []testCase{
		{
			name: "RoundTrip",
			proves: "Events published before the durable exists are delivered to it, each with " +
				"its topic decoded back exactly, its key, and CreateConsumer's context.",
			publishes: "3 events on acme/events, acme/<hard table>/<hard scope> and globex/events/x, " +
				"before the durable exists",
			run: roundTrip,
		},
		{
			name: "TopicDecodesHardNamesOnEveryPath",
			proves: "Tables and scopes with dots, wildcards, spaces, percent signs, unicode and " +
				"invalid UTF-8 come back exactly from Subscribe, Consume and ReplaySince.",
			publishes: "7 events, one per hard topic (unicode, invalid UTF-8, dots, wildcards, %, " +
				"blanks) of acme and globex",
			run: topicDecodesHardNames,
		},
		{
			name: "ConcurrentPublishersLoseNothingAndKeepEachPublishersOrder",
			proves: "32 goroutines publishing at once, half for each tenant, lose nothing, store " +
				"nothing twice, and every publisher's events reach the hub, the worker and " +
				"the history in the order it published them.",
			publishes: "640 events from 32 goroutines, 20 each, on acme/conc and globex/conc",
			run:       concurrentPublishers,
		},
		{
			name: "IdempotencyKeyStoresOneEvent",
			proves: "A second publish with the same idempotency key succeeds and stores nothing; " +
				"another key stores again.",
			publishes: "4 events on acme/idem, two with the same idempotency key",
			run:       idempotencyKeyStoresOnce,
		},
		{
			name: "IdempotencyKeysAreScopedToTheTenant",
			proves: "Two tenants publishing under one idempotency key, by Publish and in a " +
				"batch, both store their event (a collision would drop the second as a " +
				"duplicate and report success: the event would be gone); a tenant repeating " +
				"its own key stores once.",
			publishes: "events on acme/idem and globex/idem under the same keys",
			run:       idempotencyKeysAreScopedToTheTenant,
		},
		{
			name:      "HeadersRoundTripToConsume",
			proves:    "Option headers reach the worker exactly as published.",
			hooks:     []string{"ReservedHeaderPrefix"},
			publishes: "1 event with option headers on acme/hdr, 1 without on globex/hdr",
			run:       headersRoundTripToConsume,
		},
		{
			name:      "HeadersRoundTripToSubscribeAndReplay",
			proves:    "Option headers reach the hub and the replay exactly.",
			hooks:     []string{"ReservedHeaderPrefix"},
			publishes: "1 event with option headers on acme/hdr/s",
			run:       headersRoundTripToHubAndReplay,
		},
		{
			name: "DeliveredHeadersAreExactlyThePublishedOnesWithoutTheIdempotencyKey",
			proves: "On Consume, Subscribe and ReplaySince an event's Headers are exactly the " +
				"option headers it was published with, nothing added but the propagator's " +
				"trace-context fields: no idempotency key (Nats-Msg-Id), no broker " +
				"bookkeeping (a batch's ids included), whether published with Publish, a " +
				"pipelined batch or, with Caps.AtomicBatch, an atomic one.",
			flags:     []string{"AtomicBatch"},
			publishes: "keyed and unkeyed events on acme/exact by Publish and PublishBatch",
			run:       deliveredHeadersAreExact,
		},
		{
			name:      "EmptyPayloadRoundTrips",
			proves:    "An event with no data is stored and delivered with no data.",
			publishes: "3 events on acme/empty: nil data, empty data, a fence",
			run:       emptyPayloadRoundTrips,
		},
		{
			name: "DeliveriesCarryTheStoredTimestamp",
			proves: "Every path sets Message.Timestamp to when the event was stored: not zero, " +
				"and (allowing any clock skew under an hour) around now.",
			publishes: "1 event on acme/ts",
			run:       deliveriesCarryTimestamp,
		},
		{
			name: "NewBrokersAreIsolated",
			proves: "Two brokers from Harness.New share nothing: events published on one are not " +
				"replayed, delivered or counted on the other.",
			publishes: "on one of two brokers: 1 event on acme/iso and 1 park",
			run:       newBrokersAreIsolated,
		},
	}
}

// hardTable and hardScope are names full of what subjects cannot hold.
const (
	hardTable = "a.b*c> d%e.%2E"
	hardScope = "s.c*o>p e%"
)

type markerKey struct{}

func roundTrip(t *testing.T, h Harness) {
	e := setup(t, h)
	topics := []mq.Topic{
		topic(Acme, "events", ""),
		topic(Acme, hardTable, hardScope),
		topic(Globex, "events", "x"),
	}
	for i, tp := range topics {
		e.publish(tp, fmt.Sprint(i))
	}
	ctx := context.WithValue(e.ctx, markerKey{}, "marked")
	c := e.consumeCtx(ctx, mq.ConsumerConfig{MaxAckPending: 100}, 16, e.ackEach)
	got := next(t, c.deliveries, len(topics))
	seen := map[string]bool{}
	for _, d := range got {
		var i int
		_, err := fmt.Sscan(d.data, &i)
		require.NoError(t, err, "unexpected payload %q", d.data)
		require.Less(t, i, len(topics), "unexpected payload %q", d.data)
		assert.False(t, seen[d.data], "payload %q delivered twice", d.data)
		seen[d.data] = true
		assert.Equal(t, topics[i], d.topic, "topic of %q", d.data)
		key, _ := topics[i].Key()
		assert.Equal(t, key, d.msg.TopicKey(), "topic key of %q", d.data)
		assert.NotEmpty(t, d.msg.TopicKey())
		require.NotNil(t, d.msg.Ctx, "Message.Ctx")
		assert.Equal(t, "marked", d.msg.Ctx.Value(markerKey{}), "Message.Ctx of %q is not CreateConsumer's", d.data)
	}
	none(t, c.deliveries)
}

func topicDecodesHardNames(t *testing.T, h Harness) {
	e := setup(t, h)
	topics := []mq.Topic{
		topic(Acme, "ünïcødé/表", "🙂 scope"),
		topic(Acme, "\xff\xfe\x00bin", ""),
		topic(Acme, "%41", "%"),
		topic(Acme, "odd.name", ""),
		topic(Acme, "odd", "name"),
		topic(Globex, "*", ">"),
		topic(Globex, "a b\tc\r\n", "-_-"),
	}
	hub := e.subscribe("hard-names")
	for i, tp := range topics {
		e.publish(tp, fmt.Sprint(i))
	}
	check := func(path string, i int, got mq.Topic, key string) {
		t.Helper()
		assert.Equal(t, topics[i], got, "%s: topic of event %d", path, i)
		want, _ := topics[i].Key()
		assert.Equal(t, want, key, "%s: key of event %d", path, i)
	}
	for _, d := range next(t, hub, len(topics)) {
		var i int
		_, err := fmt.Sscan(d.data, &i)
		require.NoError(t, err)
		check("subscribe", i, d.topic, d.msg.TopicKey())
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	for _, d := range next(t, c.deliveries, len(topics)) {
		var i int
		_, err := fmt.Sscan(d.data, &i)
		require.NoError(t, err)
		check("consume", i, d.topic, d.msg.TopicKey())
	}
	for i, tp := range topics {
		e.replayReaches(tp, 1)
		var got []*mq.Message
		require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
			got = append(got, m)
			return true
		}))
		require.Len(t, got, 1, "replay of %s", tp)
		assert.Equal(t, fmt.Sprint(i), string(got[0].Data))
		check("replay", i, got[0].Topic(), got[0].TopicKey())
	}
}

func concurrentPublishers(t *testing.T, h Harness) {
	e := setup(t, h)
	const publishers, each = 32, 20
	hub := e.subscribe("concurrent")
	topicOf := func(p int) mq.Topic {
		if p%2 == 0 {
			return topic(Acme, "conc", "")
		}
		return topic(Globex, "conc", "")
	}
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				data := fmt.Sprintf("p%02d-%02d", p, i)
				if err := e.b.Publish(e.ctx, topicOf(p), []byte(data)); err != nil {
					e.errorf("publish %s: %v", data, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "a publish failed")

	inOrder := func(path string, got []string) {
		t.Helper()
		perPublisher := map[int][]int{}
		for _, d := range got {
			var p, i int
			_, err := fmt.Sscanf(d, "p%d-%d", &p, &i)
			require.NoError(t, err, "%s: unexpected payload %q", path, d)
			perPublisher[p] = append(perPublisher[p], i)
		}
		require.Len(t, perPublisher, publishers, "%s: publishers seen", path)
		for p := range publishers {
			assert.Equal(t, seqInts(each), perPublisher[p], "%s: publisher %d's events", path, p)
		}
	}
	inOrder("subscribe", datas(next(t, hub, publishers*each)))
	none(t, hub)

	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	inOrder("consume", datas(next(t, c.deliveries, publishers*each)))
	none(t, c.deliveries)

	var history []string
	for _, tp := range []mq.Topic{topicOf(0), topicOf(1)} {
		e.replayReaches(tp, publishers/2*each)
		history = append(history, e.replay(tp, time.Time{})...)
	}
	inOrder("replay", history)
}

func seqInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func idempotencyKeyStoresOnce(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "idem", "")
	e.publish(tp, "one", mq.WithIdempotencyKey("key-1"))
	e.publish(tp, "one again", mq.WithIdempotencyKey("key-1"))
	e.publish(tp, "two", mq.WithIdempotencyKey("key-2"))
	e.publish(tp, "fence")
	assert.Equal(t, []string{"one", "two", "fence"}, e.replayThrough(tp, time.Time{}, "fence"))
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, []string{"one", "two", "fence"}, datas(next(t, c.deliveries, 3)))
	none(t, c.deliveries)
}

func idempotencyKeysAreScopedToTheTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	for _, tenant := range []mq.TenantID{Acme, Globex} {
		tp := topic(tenant, "idem", "")
		e.publish(tp, string(tenant)+" one", mq.WithIdempotencyKey("shared"))
		e.publishBatch(mq.Batch{Tenant: tenant, Events: []mq.BatchEvent{{
			Table: "idem", Data: []byte(string(tenant) + " batched"), Options: []mq.PublishOpt{mq.WithIdempotencyKey("batched")},
		}}})
	}
	e.publish(topic(Acme, "idem", ""), "acme one again", mq.WithIdempotencyKey("shared"))
	for _, tenant := range []mq.TenantID{Acme, Globex} {
		tp := topic(tenant, "idem", "")
		e.publish(tp, "fence")
		assert.Equal(t, []string{string(tenant) + " one", string(tenant) + " batched", "fence"}, e.replayThrough(tp, time.Time{}, "fence"),
			"%s's events under keys another tenant used too", tenant)
	}
}

// publishedHeaders are option headers: exact-case keys, one repeated.
func publishedHeaders() []mq.PublishOpt {
	return []mq.PublishOpt{
		mq.WithHeader("X-Case", "Upper"),
		mq.WithHeader("x-case", "lower"),
		mq.WithHeader("X-Multi", "1"),
		mq.WithHeader("X-Multi", "2"),
		mq.WithHeader("X-Value", "välue: with spaces"),
	}
}

func assertPublishedHeaders(t *testing.T, h Harness, path string, got mq.Headers) {
	t.Helper()
	assert.Equal(t, []string{"Upper"}, got["X-Case"], "%s: X-Case", path)
	assert.Equal(t, []string{"lower"}, got["x-case"], "%s: x-case (keys are exact)", path)
	assert.Equal(t, []string{"1", "2"}, got["X-Multi"], "%s: X-Multi (repeated keys append)", path)
	assert.Equal(t, []string{"välue: with spaces"}, got["X-Value"], "%s: X-Value", path)
	assert.Empty(t, h.reservedHeaderIn(got), "%s: the broker's own bookkeeping header leaked (Harness.ReservedHeaderPrefix %q): %v",
		path, h.ReservedHeaderPrefix, got)
}

func headersRoundTripToConsume(t *testing.T, h Harness) {
	e := setup(t, h)
	e.publish(topic(Acme, "hdr", ""), "with headers", publishedHeaders()...)
	e.publish(topic(Globex, "hdr", ""), "without headers")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	for _, d := range next(t, c.deliveries, 2) {
		switch d.data {
		case "with headers":
			assertPublishedHeaders(t, h, "consume", d.msg.Headers)
		default:
			for _, k := range []string{"X-Case", "x-case", "X-Multi"} {
				assert.NotContains(t, d.msg.Headers, k, "headers leaked across events")
			}
			assert.Empty(t, h.reservedHeaderIn(d.msg.Headers), "bookkeeping header leaked (Harness.ReservedHeaderPrefix %q): %v",
				h.ReservedHeaderPrefix, d.msg.Headers)
		}
	}
}

func headersRoundTripToHubAndReplay(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("headers")
	tp := topic(Acme, "hdr", "s")
	e.publish(tp, "with headers", publishedHeaders()...)
	d := next(t, hub, 1)[0]
	assert.Equal(t, "with headers", d.data)
	assertPublishedHeaders(t, h, "subscribe", d.msg.Headers)

	e.replayReaches(tp, 1)
	var got []*mq.Message
	require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		got = append(got, m)
		return true
	}))
	require.Len(t, got, 1)
	assertPublishedHeaders(t, h, "replay", got[0].Headers)
}

func emptyPayloadRoundTrips(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "empty", "")
	hub := e.subscribe("empty")
	require.NoError(t, e.b.Publish(e.ctx, tp, nil))
	require.NoError(t, e.b.Publish(e.ctx, tp, []byte{}))
	e.publish(tp, "fence")
	assert.Equal(t, []string{"", "", "fence"}, datas(next(t, hub, 3)))
	assert.Equal(t, []string{"", "", "fence"}, e.replayThrough(tp, time.Time{}, "fence"))
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, []string{"", "", "fence"}, datas(next(t, c.deliveries, 3)))
}

func deliveriesCarryTimestamp(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "ts", "")
	hub := e.subscribe("ts")
	e.publish(tp, "stamped")
	sane := func(path string, ts time.Time) {
		t.Helper()
		require.False(t, ts.IsZero(), "%s: Timestamp is zero", path)
		assert.WithinDuration(t, time.Now(), ts, time.Hour, "%s: Timestamp", path)
	}
	sane("subscribe", next(t, hub, 1)[0].msg.Timestamp)
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	sane("consume", next(t, c.deliveries, 1)[0].msg.Timestamp)
	e.replayReaches(tp, 1)
	require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		sane("replay", m.Timestamp)
		return true
	}))
}

func newBrokersAreIsolated(t *testing.T, h Harness) {
	a := setup(t, h)
	b := setup(t, h)
	tp := topic(Acme, "iso", "")
	hubB := b.subscribe("iso")
	a.publish(tp, "on a")
	a.replayReaches(tp, 1)
	require.NoError(t, a.b.DeadLetter(a.ctx, mq.NewMessage(a.ctx, tp, []byte("parked on a"))))

	assert.Empty(t, b.replay(tp, time.Time{}), "broker b replays broker a's event")
	c := b.consume(mq.ConsumerConfig{}, b.ackEach)
	none(t, c.deliveries)
	none(t, hubB)
	counts, err := b.b.DeadLetterCounts(b.ctx, Acme, "")
	require.NoError(t, err)
	assert.Zero(t, counts.Total, "broker b counts broker a's dead letter")
}

// withoutTraceContext is h less the fields the global propagator writes, never nil.
func withoutTraceContext(h mq.Headers) mq.Headers {
	out := mq.Headers{}
	for k, v := range h {
		out[k] = v
	}
	for _, f := range otel.GetTextMapPropagator().Fields() {
		delete(out, f)
	}
	return out
}

func deliveredHeadersAreExact(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "exact", "")
	hub := e.subscribe("exact-headers")
	opts := func(key string) []mq.PublishOpt {
		return []mq.PublishOpt{mq.WithIdempotencyKey(key), mq.WithHeader("X-One", "1"), mq.WithHeader("X-Two", "a"), mq.WithHeader("X-Two", "b")}
	}
	withOpts := mq.Headers{"X-One": {"1"}, "X-Two": {"a", "b"}}
	want := map[string]mq.Headers{"keyed": withOpts, "only keyed": {}, "bare": {}}
	e.publish(tp, "keyed", opts("key-1")...)
	e.publish(tp, "only keyed", mq.WithIdempotencyKey("key-2"))
	e.publish(tp, "bare")
	for _, atomic := range []bool{false, true} {
		if atomic && !h.Caps.AtomicBatch {
			continue
		}
		keyedData, bareData := fmt.Sprintf("batch keyed, atomic %t", atomic), fmt.Sprintf("batch bare, atomic %t", atomic)
		require.NoError(t, e.b.PublishBatch(e.ctx, mq.Batch{Tenant: Acme, Atomic: atomic, Events: []mq.BatchEvent{
			{Table: tp.Table, Data: []byte(keyedData), Options: opts(fmt.Sprint("batch-key-", atomic))},
			{Table: tp.Table, Data: []byte(bareData)},
		}}), "publish a batch, atomic %t", atomic)
		want[keyedData], want[bareData] = withOpts, mq.Headers{}
	}
	check := func(path string, data string, got mq.Headers) {
		t.Helper()
		w, ok := want[data]
		require.True(t, ok, "%s: unexpected event %q", path, data)
		assert.Equal(t, w, withoutTraceContext(got), "%s: the headers of %q", path, data)
	}
	for _, d := range next(t, hub, len(want)) {
		check("subscribe", d.data, d.msg.Headers)
	}
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	for _, d := range next(t, c.deliveries, len(want)) {
		check("consume", d.data, d.msg.Headers)
	}
	e.replayReaches(tp, len(want))
	require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		check("replay", string(m.Data), m.Headers)
		return true
	}))
}
