package mq

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a log sink safe for the broker's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// assertPanicLogged requires one error log of the panic naming the topic, with the
// stack of the handler that panicked.
func assertPanicLogged(t *testing.T, logs *syncBuffer, topicKey, value string) {
	t.Helper()
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, "panicked") {
			line = l
		}
	}
	require.NotEmpty(t, line, "no error log of the panic in %q", logs.String())
	assert.Contains(t, line, "topic="+topicKey)
	assert.Contains(t, line, value, "the panic's value")
	assert.Contains(t, line, "goroutine ", "the stack")
	assert.Contains(t, line, "handler_panic_test.go", "the stack reaches the handler")
}

// TestEmbeddedNATS_AWorkerHandlerThatPanicsIsNakedAndDeliveryGoesOn: a handler that
// panics on one event does not take the process down: the panic is logged with the
// topic and the stack, the event is nak'ed and comes back (the hour-long ack wait could
// not bring it back), and the events after it are delivered.
func TestEmbeddedNATS_AWorkerHandlerThatPanicsIsNakedAndDeliveryGoesOn(t *testing.T) {
	var logs syncBuffer
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "t"}
	for _, data := range []string{"poison", "next-1", "next-2"} {
		require.NoError(t, e.Publish(ctx, topic, []byte(data)))
	}
	c, err := e.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable, AckWait: time.Hour})
	require.NoError(t, err)
	var mu sync.Mutex
	calls := map[string]int{}
	got := make(chan string, 8)
	stop, failed, err := c.Consume(func(m *Message) error {
		mu.Lock()
		calls[string(m.Data)]++
		n := calls[string(m.Data)]
		mu.Unlock()
		if string(m.Data) == "poison" && n == 1 {
			panic("poison pill")
		}
		got <- string(m.Data)
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	var delivered []string
	for len(delivered) < 3 {
		select {
		case d := <-got:
			delivered = append(delivered, d)
		case err := <-failed:
			t.Fatalf("delivery ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("delivered %q, then nothing", delivered)
		}
	}
	assert.ElementsMatch(t, []string{"poison", "next-1", "next-2"}, delivered)
	mu.Lock()
	assert.Equal(t, map[string]int{"poison": 2, "next-1": 1, "next-2": 1}, calls, "the poison came back once, nothing else did")
	mu.Unlock()
	assertPanicLogged(t, &logs, "acme.t", "poison pill")
}

// TestEmbeddedNATS_AHubHandlerThatPanicsIsLoggedAndTheHubGoesOn: a hub handler that
// panics on one event does not take the process down: the panic is logged with the
// topic and the stack, and the hub delivers the events after it.
func TestEmbeddedNATS_AHubHandlerThatPanicsIsLoggedAndTheHubGoesOn(t *testing.T) {
	var logs syncBuffer
	e := openEmbedded(t, "", func(o *EmbeddedOptions) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	got := make(chan string, 8)
	require.NoError(t, e.Subscribe(ctx, "hub", func(m *Message) error {
		got <- string(m.Data)
		if string(m.Data) == "boom" {
			panic("hub handler blew up")
		}
		return nil
	}))
	topic := Topic{Tenant: "acme", Table: "t"}
	for _, data := range []string{"boom", "after-1", "after-2"} {
		require.NoError(t, e.Publish(ctx, topic, []byte(data)))
	}
	var delivered []string
	for len(delivered) < 3 {
		select {
		case d := <-got:
			delivered = append(delivered, d)
		case <-ctx.Done():
			t.Fatalf("the hub delivered %q, then nothing", delivered)
		}
	}
	assert.Equal(t, []string{"boom", "after-1", "after-2"}, delivered)
	assertPanicLogged(t, &logs, "acme.t", "hub handler blew up")
}
