package mq

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
