//go:build integration

package mq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The server can send a worker's pull an event as the worker stops, which never
// reaches it. The worker's release hands such an event back, so the next worker has it
// at once rather than after the durable's ack wait (a minute in the shipped manifests).
// A proxy between the first worker and the server drops the delivery, as a
// subscription gone at the release would.
func TestWorker_AnEventSentToAStoppingWorkerThatNeverReachedItGoesToTheNextWorkerAtOnce(t *testing.T) {
	t.Parallel()
	f, p, first := proxiedBroker(t, 3*time.Second)
	next := f.broker(t) // publishes, and is the next worker, on a connection of its own
	ctx := testCtx(t)
	topic := Topic{Tenant: "acme", Table: "unarrived"}
	stream, _ := storedOn(t, f, first, topic)
	durable := func() (ackPending int, delivered, last uint64) {
		cons, err := f.admin.Consumer(ctx, stream, first.topo.IngestConsumer)
		require.NoError(t, err)
		s, err := f.admin.Stream(ctx, stream)
		require.NoError(t, err)
		info := cons.CachedInfo()
		return info.NumAckPending, info.Delivered.Stream, s.CachedInfo().State.LastSeq
	}

	got := make(chan *Message, 16)
	stop := startConsume(t, first, ConsumerConfig{}, func(m *Message) error { got <- m; return m.Ack() })
	require.NoError(t, next.Publish(ctx, topic, []byte("arrives")))
	select {
	case m := <-got:
		require.Equal(t, "arrives", string(m.Data))
	case <-time.After(10 * time.Second):
		t.Fatal("the first worker never got the first event")
	}
	require.Eventually(t, func() bool { pending, _, _ := durable(); return pending == 0 }, 10*time.Second, 5*time.Millisecond,
		"the first event's ack never reached the server")

	p.dropFromServer()
	require.NoError(t, next.Publish(ctx, topic, []byte("never-arrives")))
	require.Eventually(t, func() bool { return p.hasDropped("never-arrives") }, 10*time.Second, 5*time.Millisecond,
		"the server never sent the first worker the second event")
	pending, delivered, last := durable()
	require.Equal(t, 1, pending, "the server counts the dropped event as delivered and unsettled")
	require.Equal(t, last, delivered)
	p.resume()
	stop()
	select {
	case m := <-got:
		t.Fatalf("the first worker got %q, which the proxy dropped", m.Data)
	default:
	}

	gotNext := make(chan *Message, 16)
	startConsume(t, next, ConsumerConfig{}, func(m *Message) error { gotNext <- m; return m.Ack() })
	select {
	case m := <-gotNext:
		assert.Equal(t, "never-arrives", string(m.Data))
		assert.Equal(t, 2, m.Attempt, "the dropped delivery counts as the first")
	case <-time.After(15 * time.Second):
		t.Fatal("the event the first worker never got did not reach the next worker within 15s; the durable's ack wait is a minute")
	}
}

// A worker that took a partition while another worker's host still held one of its
// events cannot tell that event from one sent to it that never arrived: not once its
// backlog ended without it, nor while the backlog still waits for it. Its release must
// leave the event to the host that holds it, not hand it to a third worker.
func TestWorker_AStoppingWorkerNeverHandsOnAnEventAnotherWorkersHostStillHolds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// backlogOpen: the new event is stored before the second worker pulls, so
		// its first delivery still leaves the held one due, and it stops at once.
		backlogOpen bool
	}{
		{name: "after its backlog ended"},
		{name: "while its backlog waits", backlogOpen: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newExternalFixture(t)
			holder, second := f.broker(t), f.broker(t)
			ctx := testCtx(t)
			topic := Topic{Tenant: "acme", Table: "held-elsewhere"}
			stream, _ := storedOn(t, f, holder, topic)
			consume := func(b *ExternalNATS, handle Handler) (stop func()) {
				return startConsume(t, b, ConsumerConfig{}, handle)
			}
			await := func(ch <-chan *Message, data string) *Message {
				t.Helper()
				select {
				case m := <-ch:
					require.Equal(t, data, string(m.Data))
					return m
				case <-time.After(15 * time.Second):
					t.Fatalf("%q never came", data)
					return nil
				}
			}

			held := make(chan *Message, 1)
			stopHolder := consume(holder, func(m *Message) error { held <- m; return nil }) // the host settles it later
			require.NoError(t, second.Publish(ctx, topic, []byte("held")))
			m := await(held, "held")
			stopHolder()

			got := make(chan *Message, 16)
			if c.backlogOpen {
				require.NoError(t, second.Publish(ctx, topic, []byte("after")))
				stopSecond := consume(second, func(m *Message) error { got <- m; return m.Ack() })
				require.Eventually(t, func() bool {
					cons, err := f.admin.Consumer(ctx, stream, holder.topo.IngestConsumer)
					require.NoError(t, err)
					return cons.CachedInfo().Delivered.Stream == 2
				}, 10*time.Second, time.Millisecond, "the server never sent the second worker its event")
				stopSecond()
			} else {
				stopSecond := consume(second, func(m *Message) error { got <- m; return m.Ack() })
				require.NoError(t, second.Publish(ctx, topic, []byte("after")))
				await(got, "after")
				stopSecond()
			}

			third := make(chan *Message, 16)
			consume(second, func(m *Message) error { third <- m; return m.Ack() })
			deadline := time.After(3 * time.Second)
			for done := false; !done; {
				select {
				case got := <-third:
					assert.NotEqual(t, "held", string(got.Data),
						"a third worker got the event (attempt %d) while the first worker's host still held it", got.Attempt)
				case <-deadline:
					done = true
				}
			}
			require.NoError(t, m.Ack())
		})
	}
}
