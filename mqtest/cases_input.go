package mqtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func inputCases() []testCase {
	return []testCase{
		{
			name: "RefusesATopicWithoutATenant",
			proves: "A topic without a valid tenant is invalid input, never backpressure: Publish " +
				"and ReplaySince refuse it with ErrInvalidTopic, not ErrQueueFull.",
			publishes: "refused publishes without a tenant; 1 fence on acme/fence",
			run:       refusesATopicWithoutATenant,
		},
		{
			name: "RefusesEveryInvalidTenant",
			proves: "Each tenant outside the grammar is refused by Publish and ReplaySince with " +
				"an error wrapping both ErrInvalidTopic and ErrInvalidTenant, and the longest " +
				"valid tenant is not.",
			publishes: "refused publishes for each invalid tenant; 1 fence on acme/fence",
			run:       refusesEveryInvalidTenant,
		},
		{
			name:      "RefusesAnEmptyTable",
			proves:    "A topic without a table is ErrInvalidTopic, not a tenant error.",
			publishes: "refused publishes on acme with no table; 1 fence on acme/fence",
			run:       refusesAnEmptyTable,
		},
		{
			name: "RefusesAKeyLongerThanTheLimitAndAcceptsOneAtIt",
			proves: "A topic whose encoded key exceeds 2048 bytes is ErrInvalidTopic (also when " +
				"only escaping makes it long); one exactly at the limit is stored and " +
				"delivered on every path.",
			publishes: "refused and accepted publishes on acme around the 2048-byte key limit; 1 " +
				"fence",
			run: refusesALongKey,
		},
		{
			name: "RefusesAPayloadLargerThanTheBrokerAcceptsAndStoresNothing",
			proves: "A payload over the broker's limit is ErrPayloadTooLarge, refused before " +
				"anything is stored; one of 256 KiB, which every broker accepts (see " +
				"mq.ErrPayloadTooLarge), is not.",
			hooks:     []string{"TooLarge"},
			publishes: "1 refused payload of Harness.TooLarge bytes on acme/big, then 1 small event",
			run:       refusesATooLargePayload,
		},
		{
			name: "RefusesAReservedHeaderAndStoresNothing",
			proves: "A header option starting with Harness.ReservedHeaderPrefix (in any case) is " +
				"ErrInvalidHeader and nothing is stored; headers under another broker's reserved " +
				"prefix (Nats-, Mem-, X-Reserved-) reach the hub exactly; the idempotency key is " +
				"every broker's own and is accepted.",
			hooks:     []string{"ReservedHeaderPrefix"},
			publishes: "refused publishes with reserved headers on acme/hdr; lookalikes; 1 fence",
			run:       refusesAReservedHeader,
		},
		{
			name: "RefusesAHeaderItCannotDeliverAsGivenAndKeepsEveryOther",
			proves: "Publish and DeadLetter refuse each uncarriable header with ErrInvalidHeader " +
				"and store nothing; every token name and every other value (blanks inside, " +
				"control characters, bytes beyond ASCII) reaches the hub and the worker " +
				"exactly as published.",
			publishes: "refused publishes and parks with uncarriable headers on acme/hdr; accepted " +
				"ones and 1 fence",
			run: refusesAnUncarriableHeader,
		},
		{
			name:      "PublishWithADoneContextReturnsTheContextsError",
			proves:    "Publish under a cancelled or expired context returns that context's error.",
			publishes: "publishes under a done context on acme/ctx, then 1 event",
			run:       publishWithADoneContext,
		},
		{
			name: "CreateConsumerRefusesAnUnknownDurableUnlessDurablesOnDemand",
			proves: "Without Caps.DurablesOnDemand a durable name the broker cannot map is " +
				"ErrConsumerNotFound; with it, each such name is a consumer group of its own " +
				"that gets every stored event. The worker's name is never refused.",
			flags:     []string{"DurablesOnDemand"},
			publishes: "events on acme for the on-demand groups",
			run:       createConsumerRefusesAnUnknownDurable,
		},
	}
}

// fenceAfterRefusals publishes a fence on Acme and requires the hub, which sees every
// tenant, to deliver only the fence: nothing refused before it was stored.
func (e *env) fenceAfterRefusals(hub <-chan delivery) {
	e.t.Helper()
	e.publish(topic(Acme, "fence", ""), "fence")
	got := next(e.t, hub, 1)
	assert.Equal(e.t, "fence", got[0].data, "a refused event was stored and delivered")
	none(e.t, hub)
}

// noSend is a replay callback that must never run.
func (e *env) noSend(m *mq.Message) bool {
	e.errorf("replay sent %q for a refused topic", m.Data)
	return false
}

func refusesATopicWithoutATenant(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("no-tenant")
	for _, tenant := range []mq.TenantID{"", "a.b", "*"} {
		tp := topic(tenant, "t", "")
		err := e.b.Publish(e.ctx, tp, []byte("x"))
		require.Error(t, err, "publish with tenant %q", tenant)
		assert.NotErrorIs(t, err, mq.ErrQueueFull, "tenant %q: invalid input is not backpressure", tenant)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "publish with tenant %q", tenant)
		err = e.b.ReplaySince(e.ctx, tp, time.Time{}, e.noSend)
		require.Error(t, err, "replay with tenant %q", tenant)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "replay with tenant %q", tenant)
	}
	e.fenceAfterRefusals(hub)
}

// invalidTenants lies outside the TenantID grammar.
var invalidTenants = []mq.TenantID{
	"", "A", "Acme", "a.b", "*", ">", "a b", "-a", "_a", "a/b", "é",
	mq.TenantID(strings.Repeat("a", 65)),
}

func refusesEveryInvalidTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("invalid-tenants")
	for _, tenant := range invalidTenants {
		tp := topic(tenant, "t", "s")
		err := e.b.Publish(e.ctx, tp, []byte("x"))
		require.Error(t, err, "publish with tenant %q", tenant)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "publish with tenant %q", tenant)
		assert.ErrorIs(t, err, mq.ErrInvalidTenant, "publish with tenant %q", tenant)
		assert.NotErrorIs(t, err, mq.ErrQueueFull, "publish with tenant %q", tenant)
		err = e.b.ReplaySince(e.ctx, tp, time.Time{}, e.noSend)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "replay with tenant %q", tenant)
		assert.ErrorIs(t, err, mq.ErrInvalidTenant, "replay with tenant %q", tenant)
	}
	e.fenceAfterRefusals(hub)

	longest := mq.TenantID("0" + strings.Repeat("z_-", 21))
	require.Len(t, string(longest), 64)
	require.NoError(t, longest.Validate())
	assert.NoError(t, e.b.ReplaySince(e.ctx, topic(longest, "t", ""), time.Time{}, e.noSend),
		"replay of a valid 64-byte tenant that stored nothing")
}

func refusesAnEmptyTable(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("empty-table")
	for _, tp := range []mq.Topic{topic(Acme, "", ""), topic(Acme, "", "scope")} {
		err := e.b.Publish(e.ctx, tp, []byte("x"))
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "publish %+v", tp)
		assert.NotErrorIs(t, err, mq.ErrInvalidTenant, "publish %+v: the tenant is valid", tp)
		assert.NotErrorIs(t, err, mq.ErrQueueFull, "publish %+v", tp)
		err = e.b.ReplaySince(e.ctx, tp, time.Time{}, e.noSend)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "replay %+v", tp)
	}
	e.fenceAfterRefusals(hub)
}

// maxKey is the longest encoded topic key (mq.Topic.Validate).
const maxKey = 2048

func refusesALongKey(t *testing.T, h Harness) {
	e := setup(t, h)
	hub := e.subscribe("long-keys")
	prefix := len(Acme) + 1
	for _, tp := range []mq.Topic{
		topic(Acme, strings.Repeat(".", 3000), ""),
		topic(Acme, strings.Repeat(".", 700), ""), // 700 bytes raw, 2100 escaped
		topic(Acme, strings.Repeat("a", maxKey-prefix+1), ""),
		topic(Acme, "t", strings.Repeat("s", maxKey-prefix-1)), // "t." and 2042 bytes
	} {
		err := e.b.Publish(e.ctx, tp, []byte("x"))
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "publish a %d-byte table, %d-byte scope", len(tp.Table), len(tp.Scope))
		assert.NotErrorIs(t, err, mq.ErrQueueFull)
		err = e.b.ReplaySince(e.ctx, tp, time.Time{}, e.noSend)
		assert.ErrorIs(t, err, mq.ErrInvalidTopic, "replay a %d-byte table", len(tp.Table))
	}
	e.fenceAfterRefusals(hub)

	atLimit := topic(Acme, strings.Repeat("a", maxKey-prefix-len(".%25")), "%")
	key, err := atLimit.Key()
	require.NoError(t, err)
	require.Len(t, key, maxKey)
	e.publish(atLimit, "at the limit")
	d := next(t, hub, 1)[0]
	assert.Equal(t, "at the limit", d.data)
	assert.Equal(t, atLimit, d.topic)
	e.replayReaches(atLimit, 1)
	assert.Equal(t, []string{"at the limit"}, e.replay(atLimit, time.Time{}))
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	assert.Equal(t, []string{"fence", "at the limit"}, datas(next(t, c.deliveries, 2)))
}

func refusesATooLargePayload(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "big", "")
	hub := e.subscribe("big")
	err := e.b.Publish(e.ctx, tp, bytes.Repeat([]byte("x"), h.tooLarge()))
	require.Error(t, err, "publish %d bytes", h.tooLarge())
	assert.ErrorIs(t, err, mq.ErrPayloadTooLarge)
	assert.NotErrorIs(t, err, mq.ErrQueueFull, "too large is not backpressure")

	mid := bytes.Repeat([]byte("m"), 256<<10)
	require.NoError(t, e.b.Publish(e.ctx, tp, mid), "publish 256 KiB")
	e.publish(tp, "fence")
	got := next(t, hub, 2)
	assert.Equal(t, string(mid), got[0].data, "the first delivery is the 256 KiB event")
	assert.Equal(t, "fence", got[1].data)
	history := e.replayThrough(tp, time.Time{}, "fence")
	assert.Len(t, history, 2, "the history holds the 256 KiB event and the fence only")
}

// reservedSuffixes make the reserved-looking header names the suite tries: the NATS
// brokers' own Nats-Rollup, Nats-Expected-Stream and Nats-TTL, under each prefix.
var reservedSuffixes = []string{"Rollup", "Expected-Stream", "TTL"}

// reservedLookalikes are prefixes of header names some broker reserves; under any
// other Harness.ReservedHeaderPrefix they are ordinary names.
var reservedLookalikes = []string{"Nats-", "Mem-", "X-Reserved-"}

func refusesAReservedHeader(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "hdr", "")
	hub := e.subscribe("reserved")
	prefix := h.ReservedHeaderPrefix
	if prefix != "" {
		for _, key := range []string{prefix + reservedSuffixes[0], prefix + reservedSuffixes[1], strings.ToLower(prefix + reservedSuffixes[2])} {
			err := e.b.Publish(e.ctx, tp, []byte("x"), mq.WithHeader(key, "all"))
			require.Error(t, err, "Harness.ReservedHeaderPrefix is %q, but Publish accepted header %s", prefix, key)
			assert.ErrorIs(t, err, mq.ErrInvalidHeader, "publish with header %s", key)
			assert.NotErrorIs(t, err, mq.ErrQueueFull)
		}
		e.fenceAfterRefusals(hub)
	}
	want := mq.Headers{}
	var opts []mq.PublishOpt
	for _, other := range reservedLookalikes {
		if prefix != "" && strings.HasPrefix(strings.ToLower(other), strings.ToLower(prefix)) {
			continue
		}
		for _, suffix := range reservedSuffixes {
			want.Add(other+suffix, "all")
			opts = append(opts, mq.WithHeader(other+suffix, "all"))
		}
	}
	require.NoError(t, e.b.Publish(e.ctx, tp, []byte("lookalikes"), opts...),
		"Harness.ReservedHeaderPrefix is %q, but Publish refused headers outside it: %v", prefix, want)
	got := next(t, hub, 1)[0]
	assert.Equal(t, "lookalikes", got.data)
	assert.Equal(t, want, got.msg.Headers, "headers outside Harness.ReservedHeaderPrefix %q, on the hub", prefix)
	e.publish(tp, "keyed", mq.WithIdempotencyKey("k"))
	assert.Equal(t, "keyed", next(t, hub, 1)[0].data)
}

// uncarriable are headers no broker can deliver exactly as given (see mq.Headers): a
// name that is not an HTTP token, a value with a line break or a blank at either end.
var uncarriable = []struct{ name, value string }{
	{"X/Y", "v"}, {"x(y)", "v"}, {"x@y", "v"}, {"x=y", "v"}, {"x,y", "v"}, {"x:y", "v"}, {"x y", "v"},
	{"é", "v"}, {"x\x00y", "v"}, {"x\x7fy", "v"}, {"", "v"},
	{"X-V", " lead"}, {"X-V", "trail "}, {"X-V", "\tlead"}, {"X-V", "trail\t"}, {"X-V", "a\r\nb"},
}

func refusesAnUncarriableHeader(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "hdr", "")
	hub := e.subscribe("uncarriable")
	parked := mq.NewMessage(e.ctx, tp, []byte("x"))
	for _, hd := range uncarriable {
		err := e.b.Publish(e.ctx, tp, []byte("x"), mq.WithHeader(hd.name, hd.value))
		assert.ErrorIs(t, err, mq.ErrInvalidHeader, "publish with header %q: %q", hd.name, hd.value)
		err = e.b.DeadLetter(e.ctx, parked, mq.WithHeader(hd.name, hd.value))
		assert.ErrorIs(t, err, mq.ErrInvalidHeader, "park with header %q: %q", hd.name, hd.value)
	}
	e.fenceAfterRefusals(hub)
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme after refused parks")

	want := mq.Headers{
		"0!#$%&'*+-.^_`|~z": {"a:b"}, "x-lower": {"a\tb", "a  b"}, "X-Empty": {""},
		"X-Ctl": {"\x00", "a\x01b", "a\x7fb", "\va", "a\f"}, "X-Bytes": {"é", "\xff\xfe"},
	}
	var opts []mq.PublishOpt
	for k, vs := range want {
		for _, v := range vs {
			opts = append(opts, mq.WithHeader(k, v))
		}
	}
	e.publish(tp, "carried", opts...)
	got := next(t, hub, 1)[0]
	assert.Equal(t, "carried", got.data)
	assert.Equal(t, want, got.msg.Headers, "headers on the hub")
	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	worker := next(t, c.deliveries, 2)
	assert.Equal(t, []string{"fence", "carried"}, datas(worker))
	assert.Equal(t, want, worker[1].msg.Headers, "headers on the worker's path")
}

func publishWithADoneContext(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "ctx", "")
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	err := e.b.Publish(cancelled, tp, []byte("cancelled"))
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, mq.ErrQueueFull)

	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	err = e.b.Publish(expired, tp, []byte("expired"))
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	e.publish(tp, "live")
}

func createConsumerRefusesAnUnknownDurable(t *testing.T, h Harness) {
	e := setup(t, h)
	names := []string{"no-such-consumer", "buffer-consumer-2", "BUFFER-CONSUMER"}
	if !h.Caps.DurablesOnDemand {
		for _, name := range names {
			_, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: name})
			assert.ErrorIs(t, err, mq.ErrConsumerNotFound,
				"Caps.DurablesOnDemand is false, but CreateConsumer did not refuse durable %q as not found", name)
		}
	} else {
		e.publish(topic(Acme, "t", ""), "stored")
		for _, name := range names {
			_, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: name})
			require.NoError(t, err, "Caps.DurablesOnDemand is true, but CreateConsumer refused durable %q", name)
			c := e.consume(mq.ConsumerConfig{Durable: name}, e.ackEach)
			assert.Equal(t, []string{"stored"}, datas(next(t, c.deliveries, 1)), "durable %q made on demand", name)
			c.stop()
		}
	}
	c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	require.NoError(t, err)
	assert.NotNil(t, c)
}
