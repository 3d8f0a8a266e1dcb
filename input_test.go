package mq

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tchars are the bytes of an HTTP token besides letters and digits (RFC 7230).
const tchars = "!#$%&'*+-.^_`|~"

// rawRoundTrips publishes one message with header name: value straight through nats.go,
// bypassing the broker's checks, on subject of e's partition p, and reports whether the
// stream gives the header back exactly.
func rawRoundTrips(ctx context.Context, t *testing.T, e *EmbeddedNATS, subject, name, value string) bool {
	t.Helper()
	ack, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header{name: {value}}, Data: []byte("raw")})
	if err != nil {
		return false
	}
	s, err := e.js.Stream(ctx, ack.Stream)
	require.NoError(t, err)
	m, err := s.GetMsg(ctx, ack.Sequence)
	require.NoError(t, err)
	return slices.Equal(m.Header[name], []string{value})
}

// brokerStores publishes one event with header name: value through e on topic and
// returns the header as the partition stored it, or Publish's error.
func brokerStores(ctx context.Context, t *testing.T, e *EmbeddedNATS, topic Topic, name, value string) ([]string, error) {
	t.Helper()
	if err := e.Publish(ctx, topic, []byte("broker"), WithHeader(name, value)); err != nil {
		return nil, err
	}
	subject, p, err := e.subs.ingestTopic(topic)
	require.NoError(t, err)
	s, err := e.js.Stream(ctx, e.topo.PartitionStream(p))
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(ctx, subject)
	require.NoError(t, err)
	return m.Header[name], nil
}

// TestHeaders_PublishAcceptsExactlyTheNamesNATSCarriesAndRefusesTheRest tries every byte
// inside a header name, first straight through nats.go and the server, then through
// Publish: Publish stores the name exactly when it round-trips, and refuses it with
// ErrInvalidHeader (naming it) otherwise. The names that round-trip are the HTTP tokens.
func TestHeaders_PublishAcceptsExactlyTheNamesNATSCarriesAndRefusesTheRest(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	var carried []byte
	for b := range 256 {
		name := "X" + string([]byte{byte(b)}) + "Y"
		topic := Topic{Tenant: "acme", Table: fmt.Sprintf("name-%d", b)}
		subject, _, err := e.subs.ingestTopic(topic)
		require.NoError(t, err)
		raw := rawRoundTrips(ctx, t, e, subject+".raw", name, "v")
		got, err := brokerStores(ctx, t, e, topic, name, "v")
		if raw {
			carried = append(carried, byte(b))
			require.NoError(t, err, "name %q round-trips through nats.go, yet Publish refused it", name)
			assert.Equal(t, []string{"v"}, got, "name %q", name)
			continue
		}
		require.ErrorIs(t, err, ErrInvalidHeader, "name %q does not round-trip through nats.go", name)
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", name), "the error names the header")
	}
	var want []byte
	for b := range 256 {
		if c := byte(b); 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(tchars, c) >= 0 {
			want = append(want, c)
		}
	}
	assert.Equal(t, string(want), string(carried), "the name bytes NATS carries are the HTTP token's")
	err := e.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, nil, WithHeader("", "v"))
	require.ErrorIs(t, err, ErrInvalidHeader, "an empty name")
}

// headerValues are values worth a round trip: blanks at either end, blanks and
// control characters inside, line breaks, bytes beyond ASCII.
var headerValues = []string{
	"", "plain", " ", "  ", " lead", "trail ", "\tlead", "trail\t", " both ",
	"a\tb", "a  b", "a:b", ": a", "a\r", "\rb", "a\rb", "a\nb", "a\r\nb", "a\n",
	"\x00", "a\x00b", "\x00a", "a\x01b", "a\x1fb", "\x1b[0m", "a\x7fb", "\x7f",
	"\va", "a\v", "\fa", "a\f", "é", "日本", "\xff\xfe", "a\x85b", "\u00a0a", "a\u00a0",
}

// TestHeaders_PublishKeepsEveryValueNATSCarriesAndRefusesTheRest tries each value first
// straight through nats.go and the server, then through Publish: a value that comes
// back exactly is stored as given, and one that would come back changed (blanks
// trimmed at either end, a line break replaced) is refused with ErrInvalidHeader.
func TestHeaders_PublishKeepsEveryValueNATSCarriesAndRefusesTheRest(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	var refused []string
	for i, v := range headerValues {
		topic := Topic{Tenant: "acme", Table: fmt.Sprintf("value-%d", i)}
		subject, _, err := e.subs.ingestTopic(topic)
		require.NoError(t, err)
		raw := rawRoundTrips(ctx, t, e, subject+".raw", "X-V", v)
		got, err := brokerStores(ctx, t, e, topic, "X-V", v)
		if raw {
			require.NoError(t, err, "value %q round-trips through nats.go, yet Publish refused it", v)
			assert.Equal(t, []string{v}, got, "value %q", v)
			continue
		}
		require.ErrorIs(t, err, ErrInvalidHeader, "value %q does not round-trip through nats.go", v)
		assert.Contains(t, err.Error(), `"X-V"`, "the error names the header")
		refused = append(refused, v)
	}
	for _, v := range refused {
		trimmed := strings.Trim(v, " \t") != v
		assert.True(t, trimmed || strings.ContainsAny(v, "\r\n"), "%q is refused for neither blanks at an end nor a line break", v)
	}
}

// TestHeaders_AcceptedHeadersArriveAsPublishedOnEveryPath: names and values Publish
// accepts, control characters and bytes beyond ASCII included, come back unchanged on
// the worker's path, the hub, replay and the dead-letter queue.
func TestHeaders_AcceptedHeadersArriveAsPublishedOnEveryPath(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 64<<20))
	want := Headers{
		"X-Upper": {"plain"}, "x-lower": {"a\tb", "a  b"}, "0" + tchars + "z": {"a:b"},
		"X-Ctl":   {"\x00", "a\x01b", "a\x1fb", "a\x7fb", "\va", "a\f"},
		"X-Bytes": {"é", "日本", "\xff\xfe", "\u00a0a"}, "X-Empty": {""},
	}
	var opts []PublishOpt
	for k, vs := range want {
		for _, v := range vs {
			opts = append(opts, WithHeader(k, v))
		}
	}
	hub := make(chan *Message, 1)
	require.NoError(t, e.Subscribe(ctx, "hub", func(m *Message) error { hub <- m; return nil }))
	topic := Topic{Tenant: "acme", Table: "headers"}
	require.NoError(t, e.Publish(ctx, topic, []byte("h"), opts...))

	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	consumed := make(chan *Message, 1)
	stop, _, err := c.Consume(func(m *Message) error {
		if err := e.DeadLetter(ctx, m); err != nil {
			return err
		}
		consumed <- m
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	for path, ch := range map[string]chan *Message{"consume": consumed, "hub": hub} {
		select {
		case m := <-ch:
			assert.Equal(t, want, m.Headers, "headers on the %s path", path)
		case <-ctx.Done():
			t.Fatalf("nothing on the %s path", path)
		}
	}
	var replayed []*Message
	require.Eventually(t, func() bool {
		replayed = nil
		require.NoError(t, e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool { replayed = append(replayed, m); return true }))
		return len(replayed) == 1
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, want, replayed[0].Headers, "headers on replay")
	parked, err := ParkedMessages(ctx, e, "acme")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, want, parked[0].Headers, "headers of the park")
}

// inputRig is a broker under the bad-input table: parked reads a tenant's parked
// events back; purges says whether its PurgeAcked removes anything at all.
type inputRig struct {
	b      Broker
	core   *natsCore
	parked func(ctx context.Context, tenant TenantID) ([]*Message, error)
	purges bool
}

// headerBlock is the header block nats.go writes for lines, counted by hand from the
// wire format: the status line, one "name: value" line per header, a blank line.
func headerBlock(lines ...string) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for _, l := range lines {
		n += len(l) + len("\r\n")
	}
	return n
}

// payloadRoom is the largest payload c's server takes in an event to stream with
// message id msgID and the header lines more: the client adds the expected stream.
func payloadRoom(c *natsCore, stream, msgID string, more ...string) int {
	return int(c.nc.MaxPayload()) - headerBlock(append([]string{"Nats-Msg-Id: " + msgID, "Nats-Expected-Stream: " + stream}, more...)...)
}

// lastInAtomicBatch are the header lines an atomic batch adds to its last event, the
// seq-th: the batch's id (a nuid), the event's sequence in it, and the commit.
func lastInAtomicBatch(seq int) []string {
	return []string{"Nats-Batch-Id: " + nuid.Next(), "Nats-Batch-Sequence: " + strconv.Itoa(seq), "Nats-Batch-Commit: 1"}
}

// Times at the edges of what an int64 of nanoseconds since 1970 holds, which is what
// JetStream compares stored times in.
var (
	firstNanoTime = time.Unix(0, math.MinInt64).UTC()
	lastNanoTime  = time.Unix(0, math.MaxInt64).UTC()
)

// inputRow is one input of the bad-input table.
type inputRow struct {
	name string
	call func() error
	// want is the sentinel the error wraps; nil: the input is accepted.
	want error
	// says is what the error must also name, if anything.
	says string
	// check is what an accepted input must have done, if anything.
	check func(t *testing.T)
}

// testBadInputIsRefusedAndLosesNothing stores events, acknowledges some and parks
// others first, then feeds every method every kind of bad input a caller can pass:
// bad headers, payloads at the exact size boundary, invalid topics, nil contexts, a
// nil send, a negative budget, and times outside the int64-nanosecond range. Each bad
// input is an error wrapping its sentinel, never a panic; the largest payload the
// server takes is accepted on both paths; a since or cutoff out of range gives the
// monotone result (a since before the range replays everything, after it nothing; a
// cutoff before it purges nothing, after it everything acknowledged); and afterwards
// everything stored before, and only the accepted events, are all there, and the
// budget is as it was set.
func testBadInputIsRefusedAndLosesNothing(t *testing.T, r inputRig) {
	ctx := testCtx(t)
	const tenant TenantID = "acme"
	const budget = 64 << 20
	require.NoError(t, r.b.SetMaxBytes(ctx, tenant, budget))
	topic := Topic{Tenant: tenant, Table: "t"}
	ranged := Topic{Tenant: tenant, Table: "range"}
	// Acknowledged first, so the first unacknowledged event ("left") comes after
	// them and a purge may remove exactly these.
	acked := []string{"a", "b", "c"}
	for _, d := range acked {
		require.NoError(t, r.b.Publish(ctx, ranged, []byte(d)))
	}
	require.Equal(t, acked, drainBroker(t, r.b, len(acked)))
	require.NoError(t, r.b.Publish(ctx, ranged, []byte("left")))
	inRange := append(slices.Clone(acked), "left")
	for i := range 3 {
		require.NoError(t, r.b.Publish(ctx, topic, fmt.Appendf(nil, "before-%d", i)))
		require.NoError(t, r.b.DeadLetter(ctx, NewMessage(ctx, topic, fmt.Appendf(nil, "parked-%d", i))))
	}
	require.Eventually(t, func() bool { return len(replayAll(t, r.b, ranged, time.Time{})) == len(inRange) },
		10*time.Second, 20*time.Millisecond, "the history never got every event")
	_, p, err := r.core.subs.ingestTopic(topic)
	require.NoError(t, err)

	limit := int(r.core.nc.MaxPayload())
	// An idempotency key fixes the message id's length. Publish keeps room for the
	// event's park (park_room.go).
	publishRoom := payloadRoom(r.core, r.core.partitions[p], "acme.edge-x") -
		r.core.parkGrowth(Headers{HeaderIdempotencyKey: {"acme.edge-x"}}, string(tenant), r.core.partitions[p])
	parkRoom := payloadRoom(r.core, r.core.deadLetters, "acme.edge-x")
	// This is the room of the last event of an atomic batch of fewer than 10, within
	// Publish's.
	atomicRoom := min(publishRoom, payloadRoom(r.core, r.core.partitions[p], "acme.edge-x", lastInAtomicBatch(1)...))
	largestPublish := bytes.Repeat([]byte("P"), publishRoom)
	largestAtomic := bytes.Repeat([]byte("A"), atomicRoom)
	largestPark := bytes.Repeat([]byte("D"), parkRoom)

	var rows []inputRow
	ops := []struct {
		name string
		room int
		call func(data []byte, opts ...PublishOpt) error
	}{
		{"Publish", publishRoom, func(data []byte, opts ...PublishOpt) error { return r.b.Publish(ctx, topic, data, opts...) }},
		{"DeadLetter", parkRoom, func(data []byte, opts ...PublishOpt) error {
			return r.b.DeadLetter(ctx, NewMessage(ctx, topic, data), opts...)
		}},
	}
	x := []byte("x")
	for _, o := range ops {
		bad := func(what string, data []byte, want error, opts ...PublishOpt) {
			rows = append(rows, inputRow{name: o.name + " with " + what, call: func() error { return o.call(data, opts...) }, want: want})
		}
		for _, name := range []string{"X/Y", "x(y)", "x@y", "x=y", "x,y", "x:y", "x y", "x\ty", "x;y", `x"y`, "x?y", "x[y]", "x{y}", `x\y`,
			"é", "x\x00y", "x\x7fy", "x\ry", "x\ny", "", "Nats-Rollup", "nats-ttl", "NATS-Expected-Stream"} {
			bad(fmt.Sprintf("header name %q", name), x, ErrInvalidHeader, WithHeader(name, "v"))
		}
		for _, value := range []string{" lead", "trail ", "\tlead", "trail\t", " ", "a\rb", "a\nb", "a\r\n"} {
			bad(fmt.Sprintf("header value %q", value), x, ErrInvalidHeader, WithHeader("X-V", value))
		}
		bad("two idempotency keys", x, ErrInvalidHeader, WithHeader(HeaderIdempotencyKey, "k1"), WithHeader(HeaderIdempotencyKey, "k2"))
		bad("the smallest payload refused", make([]byte, o.room+1), ErrPayloadTooLarge, WithIdempotencyKey("edge-y"))
		bad("a payload far over the limit", make([]byte, 2*limit), ErrPayloadTooLarge)
	}
	for _, tenant := range []TenantID{"", "ac.me"} {
		rows = append(rows, inputRow{name: fmt.Sprintf("PublishBatch of no events for tenant %q", tenant), want: ErrInvalidTopic,
			call: func() error { return r.b.PublishBatch(ctx, Batch{Tenant: tenant}) }})
	}
	rows = append(rows, inputRow{name: "DeadLetter of a message built with a bad header name", want: ErrInvalidHeader,
		call: func() error {
			return r.b.DeadLetter(ctx, NewMessage(ctx, topic, x, WithMessageHeaders(Headers{"X/Y": {"v"}})))
		}})

	for _, bt := range []struct {
		name  string
		topic Topic
	}{
		{"an empty tenant", Topic{Table: "t"}},
		{"a tenant with a dot", Topic{Tenant: "ac.me", Table: "t"}},
		{"an empty table", Topic{Tenant: tenant}},
	} {
		for _, c := range []struct {
			op   string
			call func() error
		}{
			{"Publish", func() error { return r.b.Publish(ctx, bt.topic, x) }},
			{"PublishBatch", func() error {
				return r.b.PublishBatch(ctx, Batch{Tenant: bt.topic.Tenant, Events: []BatchEvent{{Table: bt.topic.Table, Data: x}}})
			}},
			{"ReplaySince", func() error {
				return r.b.ReplaySince(ctx, bt.topic, time.Time{}, func(*Message) bool { return true })
			}},
			{"DeadLetter", func() error { return r.b.DeadLetter(ctx, NewMessage(ctx, bt.topic, x)) }},
		} {
			rows = append(rows, inputRow{name: c.op + " on " + bt.name, call: c.call, want: ErrInvalidTopic})
		}
	}

	var nilCtx context.Context
	for _, c := range []struct {
		op   string
		call func() error
	}{
		{"Publish", func() error { return r.b.Publish(nilCtx, topic, x) }},
		{"PublishBatch", func() error {
			return r.b.PublishBatch(nilCtx, Batch{Tenant: tenant, Events: []BatchEvent{{Table: "t", Data: x}}})
		}},
		{"Subscribe", func() error { return r.b.Subscribe(nilCtx, "hub", func(*Message) error { return nil }) }},
		{"CreateConsumer", func() error {
			_, err := r.b.CreateConsumer(nilCtx, ConsumerConfig{Durable: WorkerDurable})
			return err
		}},
		{"DeadLetter", func() error { return r.b.DeadLetter(nilCtx, NewMessage(ctx, topic, x)) }},
		{"DeadLetterCounts", func() error {
			_, err := r.b.DeadLetterCounts(nilCtx, tenant, "")
			return err
		}},
		{"PurgeAcked", func() error {
			_, err := r.b.PurgeAcked(nilCtx, WorkerDurable, map[TenantID]time.Time{tenant: time.Now()})
			return err
		}},
		{"ReplaySince", func() error {
			return r.b.ReplaySince(nilCtx, ranged, time.Time{}, func(*Message) bool { return true })
		}},
		{"SetMaxBytes", func() error { return r.b.SetMaxBytes(nilCtx, tenant, 1) }},
		{"OldestSequence", func() error {
			_, err := r.b.(HistoryHorizon).OldestSequence(nilCtx)
			return err
		}},
	} {
		rows = append(rows, inputRow{name: c.op + " with a nil context", call: c.call, want: ErrInvalidConfig, says: "nil context"})
	}
	rows = append(rows,
		inputRow{name: "Publish with the broker's event ID header", want: ErrInvalidHeader, says: "Mq-Event-Id",
			call: func() error { return r.b.Publish(ctx, topic, x, WithHeader(HeaderEventID, "someone-elses")) }},
		inputRow{name: "PublishBatch with the broker's event ID header", want: ErrInvalidHeader, says: "Mq-Event-Id",
			call: func() error {
				return r.b.PublishBatch(ctx, Batch{Tenant: tenant, Events: []BatchEvent{{Table: "t", Data: x,
					Options: []PublishOpt{WithHeader(HeaderEventID, "someone-elses")}}}})
			}},
		// A park stores the event ID from the message's own ID alone: one a host gave
		// it would let a redrive deliver another event under that ID.
		inputRow{name: "DeadLetter with the broker's event ID header as an option", want: ErrInvalidHeader, says: "Mq-Event-Id",
			call: func() error {
				return r.b.DeadLetter(ctx, NewMessage(ctx, topic, x), WithHeader(HeaderEventID, "someone-elses"))
			}},
		inputRow{name: "DeadLetter of a message carrying the broker's event ID header", want: ErrInvalidHeader, says: "Mq-Event-Id",
			call: func() error {
				return r.b.DeadLetter(ctx, NewMessage(ctx, topic, x,
					WithMessageHeaders(Headers{HeaderEventID: {"someone-elses"}})))
			}},
		inputRow{name: "Publish with a nil option", want: ErrInvalidConfig, says: "option 1 is nil",
			call: func() error { return r.b.Publish(ctx, topic, x, WithHeader("X-A", "a"), nil) }},
		inputRow{name: "PublishBatch with a nil option", want: ErrInvalidConfig, says: "option 0 is nil",
			call: func() error {
				return r.b.PublishBatch(ctx, Batch{Tenant: tenant, Events: []BatchEvent{{Table: "t", Data: x, Options: []PublishOpt{nil}}}})
			}},
		inputRow{name: "DeadLetter with a nil option", want: ErrInvalidConfig, says: "option 0 is nil",
			call: func() error { return r.b.DeadLetter(ctx, NewMessage(ctx, topic, x), nil) }},
		inputRow{name: "ReplaySince with a nil send and events to send", want: ErrInvalidConfig, says: "nil send",
			call: func() error { return r.b.ReplaySince(ctx, ranged, time.Time{}, nil) }},
		inputRow{name: "SetMaxBytes with a negative budget", want: ErrInvalidConfig, says: "negative budget",
			call: func() error { return r.b.SetMaxBytes(ctx, tenant, -1) }},
		inputRow{name: "Publish of the largest payload the server takes", call: func() error {
			return r.b.Publish(ctx, topic, largestPublish, WithIdempotencyKey("edge-x"))
		}},
		inputRow{name: "PublishBatch atomic of the largest payload the server takes in one", call: func() error {
			return r.b.PublishBatch(ctx, Batch{Tenant: tenant, Atomic: true,
				Events: []BatchEvent{{Table: topic.Table, Data: largestAtomic, Options: []PublishOpt{WithIdempotencyKey("edge-a")}}}})
		}},
		inputRow{name: "PublishBatch atomic whose last event is one byte over it", want: ErrPayloadTooLarge, call: func() error {
			return r.b.PublishBatch(ctx, Batch{Tenant: tenant, Atomic: true, Events: []BatchEvent{
				{Table: topic.Table, Data: []byte("never-stored")},
				{Table: topic.Table, Data: make([]byte, atomicRoom+1), Options: []PublishOpt{WithIdempotencyKey("edge-b")}},
			}})
		}},
		inputRow{name: "DeadLetter of the largest payload the server takes", call: func() error {
			return r.b.DeadLetter(ctx, NewMessage(ctx, topic, largestPark), WithIdempotencyKey("edge-x"))
		}},
	)

	for _, s := range []struct {
		name  string
		since time.Time
		want  []string
	}{
		{"in year 1600 is from the beginning", time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), inRange},
		{"just before the range is from the beginning", firstNanoTime.Add(-time.Nanosecond), inRange},
		{"at the range's start is from the beginning", firstNanoTime, inRange},
		{"in year 1 is from the beginning", time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), inRange},
		{"before year 0 is from the beginning", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), inRange},
		{"at the range's end is nothing", lastNanoTime, []string{}},
		{"just after the range is nothing", lastNanoTime.Add(time.Nanosecond), []string{}},
		{"on 2262-04-12 is nothing", time.Date(2262, 4, 12, 0, 0, 0, 0, time.UTC), []string{}},
		{"in year 9999 is nothing", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), []string{}},
		{"after year 9999 is nothing", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), []string{}},
	} {
		got := []string{}
		rows = append(rows, inputRow{name: "ReplaySince a since " + s.name,
			call: func() error {
				return r.b.ReplaySince(ctx, ranged, s.since, func(m *Message) bool { got = append(got, string(m.Data)); return true })
			},
			check: func(t *testing.T) { assert.Equal(t, s.want, got, "what was replayed") }})
	}

	for _, c := range []struct {
		name   string
		cutoff time.Time
		purged bool
		left   []string
	}{
		{"in year 1600 purges nothing", time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), false, inRange},
		{"just before the range purges nothing", firstNanoTime.Add(-time.Nanosecond), false, inRange},
		{"before year 0 purges nothing", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), false, inRange},
		// Last: these purge what the others must keep.
		{"in year 9999 purges everything acknowledged", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), true, []string{"left"}},
		{"after year 9999 finds nothing acknowledged left", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), false, []string{"left"}},
	} {
		var purged bool
		rows = append(rows, inputRow{name: "PurgeAcked a cutoff " + c.name,
			call: func() (err error) {
				purged, err = r.b.PurgeAcked(ctx, WorkerDurable, map[TenantID]time.Time{tenant: c.cutoff})
				return err
			},
			check: func(t *testing.T) {
				left := c.left
				if !r.purges {
					left = inRange
				}
				assert.Equal(t, c.purged && r.purges, purged, "reported a removal")
				assert.Equal(t, left, replayAll(t, r.b, ranged, time.Time{}), "what the history keeps")
			}})
	}

	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = row.call() })
			if row.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, row.want)
				assert.ErrorContains(t, err, row.says)
			}
			if row.check != nil {
				row.check(t)
			}
		})
	}

	assert.Equal(t, int64(budget), r.b.MaxBytes(tenant), "the budget is as it was set")
	wantStored := []string{"before-0", "before-1", "before-2", short(largestPublish), short(largestAtomic)}
	assert.Equal(t, append([]string{"left"}, wantStored...), drainBroker(t, r.b, len(wantStored)+1),
		"what the worker gets: everything stored before and not acknowledged, and the largest event")
	var replayed []string
	require.Eventually(t, func() bool {
		replayed = nil
		err := r.b.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool { replayed = append(replayed, short(m.Data)); return true })
		return err == nil && len(replayed) >= len(wantStored)
	}, 10*time.Second, 20*time.Millisecond, "the history never got every event")
	assert.Equal(t, wantStored, replayed, "what the history holds")
	parked, err := r.parked(ctx, tenant)
	require.NoError(t, err)
	var got []string
	for _, m := range parked {
		got = append(got, short(m.Data))
	}
	assert.Equal(t, []string{"parked-0", "parked-1", "parked-2", short(largestPark)}, got, "what the dead-letter queue holds")
}

// short is data as a test reports it: itself when short, else its length and its
// distinct bytes, so a megabyte payload compares exactly and prints in a line.
func short(data []byte) string {
	if len(data) <= 64 {
		return string(data)
	}
	var distinct []byte
	for _, b := range data {
		if !slices.Contains(distinct, b) {
			distinct = append(distinct, b)
		}
	}
	return fmt.Sprintf("%d bytes of %q", len(data), distinct)
}

// drainBroker consumes n events from b's ingest durable, acking each, and returns
// their payloads in order; then it watches briefly for one more.
func drainBroker(t *testing.T, b Broker, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	c, err := b.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string
	stop, _, err := c.Consume(func(m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, short(m.Data))
		return m.DoubleAck(ctx)
	}, 16)
	require.NoError(t, err)
	defer stop()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= n }, 10*time.Second, 10*time.Millisecond,
		"consumed fewer than %d events", n)
	time.Sleep(300 * time.Millisecond) // anything refused but stored would arrive now
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(got)
}

// TestEmbeddedNATS_BadInputIsRefusedWithItsSentinelAndLosesNothing runs the bad-input
// table on the default topology and on one whose stream names are long, where an
// estimate of the headers the client adds falls short.
func TestEmbeddedNATS_BadInputIsRefusedWithItsSentinelAndLosesNothing(t *testing.T) {
	for _, prefix := range []string{"", "a-rather-long-prefix-for-every-stream-name"} {
		t.Run("prefix "+prefix, func(t *testing.T) {
			e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Topology.Prefix = prefix })
			testBadInputIsRefusedAndLosesNothing(t, inputRig{b: e, core: e.core, purges: true,
				parked: func(ctx context.Context, tenant TenantID) ([]*Message, error) { return ParkedMessages(ctx, e, tenant) }})
		})
	}
}

// TestWireSize_MatchesTheClientsOwnAccounting: the size prepare checks against the
// server's max payload is what nats.go counts for the same message once JetStream's
// publish added its expected stream.
func TestWireSize_MatchesTheClientsOwnAccounting(t *testing.T) {
	for _, h := range []Headers{
		{HeaderIdempotencyKey: {"acme.k"}},
		{HeaderIdempotencyKey: {"x"}, "X-A": {"1", "22", ""}, "traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{HeaderIdempotencyKey: {"x"}, "X-Ctl": {"a\x00b", "é"}},
	} {
		for _, data := range [][]byte{nil, []byte("data"), make([]byte, 4096)} {
			const stream = "SOME_STREAM_NAME"
			msg := &nats.Msg{Subject: "s", Header: nats.Header(cloneHeaders(h)), Data: data}
			msg.Header.Set(jetstream.ExpectedStreamHeader, stream)
			assert.Equal(t, msg.Size()-len(msg.Subject), wireSize(h, stream, data), "headers %v, %d bytes", h, len(data))
		}
	}
}
