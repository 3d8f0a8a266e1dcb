package mq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replayAll gathers a whole replay of topic since since, requiring a nil end.
func replayAll(t *testing.T, b Broker, topic Topic, since time.Time) []string {
	t.Helper()
	got := []string{}
	require.NoError(t, b.ReplaySince(testCtx(t), topic, since, func(m *Message) bool {
		got = append(got, string(m.Data))
		return true
	}), "replay %+v since %v", topic, since)
	return got
}

// checkSettlingAfterCloseIsErrClosed holds a message the worker delivered, closes b and
// settles the message every way: each wraps ErrClosed.
func checkSettlingAfterCloseIsErrClosed(t *testing.T, b Broker) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, b.Publish(ctx, Topic{Tenant: "acme", Table: "held"}, []byte("held")))
	c, err := b.CreateConsumer(ctx, ConsumerConfig{Durable: WorkerDurable})
	require.NoError(t, err)
	held := make(chan *Message, 1)
	stop, _, err := c.Consume(func(m *Message) error {
		select {
		case held <- m:
		default:
		}
		return nil // held for a batch, settled later
	}, 1)
	require.NoError(t, err)
	defer stop()
	var m *Message
	select {
	case m = <-held:
	case <-ctx.Done():
		t.Fatal("nothing delivered")
	}
	require.NoError(t, b.Close())
	for _, s := range []struct {
		name   string
		settle func() error
	}{
		{"Ack", m.Ack},
		{"DoubleAck", func() error { return m.DoubleAck(ctx) }},
		{"Nak", m.Nak},
		{"NakWithDelay", func() error { return m.NakWithDelay(time.Second) }},
		{"InProgress", m.InProgress},
	} {
		err := s.settle()
		assert.ErrorIs(t, err, ErrClosed, "%s after Close: %v", s.name, err)
	}
}

func TestEmbeddedNATS_SettlingAHeldMessageAfterCloseIsErrClosed(t *testing.T) {
	checkSettlingAfterCloseIsErrClosed(t, openEmbedded(t, ""))
}

// publishReplayable publishes the events "0" to "n-1" on topic and waits until a replay
// yields them all; it returns them in order.
func publishReplayable(t *testing.T, b Broker, topic Topic, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprint(i)
		require.NoError(t, b.Publish(ctx, topic, []byte(want[i])))
	}
	require.Eventually(t, func() bool { return len(replayAll(t, b, topic, time.Time{})) == n },
		10*time.Second, 20*time.Millisecond, "the history never held all %d events", n)
	return want
}

// replayConsumers lists the ephemeral consumers on the history filtered to subject:
// the replays' own.
func replayConsumers(t *testing.T, js jetstream.JetStream, history, subject string) []*jetstream.ConsumerInfo {
	t.Helper()
	ctx := testCtx(t)
	s, err := js.Stream(ctx, history)
	require.NoError(t, err)
	var out []*jetstream.ConsumerInfo
	infos := s.ListConsumers(ctx)
	for ci := range infos.Info() {
		if ci.Config.FilterSubject == subject {
			out = append(out, ci)
		}
	}
	require.NoError(t, infos.Err())
	return out
}

// replayDisturbed publishes replayBatch+44 events on a fresh topic of table, replays
// them, and calls disturb with the topic's subject once the whole first batch was
// sent. It returns what was published, what the replay sent, and its error.
func replayDisturbed(t *testing.T, table string, disturb func(e *EmbeddedNATS, subject string)) (want, got []string, err error) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: table}
	want = publishReplayable(t, e, topic, replayBatch+44)
	subject, _, err := e.subs.ingestTopic(topic)
	require.NoError(t, err)
	err = e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		got = append(got, string(m.Data))
		if len(got) == replayBatch {
			disturb(e, subject)
		}
		return true
	})
	return want, got, err
}

func TestReplay_AConsumerLostUnderTheReplayIsCreatedAgainFromTheNextEvent(t *testing.T) {
	want, got, err := replayDisturbed(t, "lost-consumer", func(e *EmbeddedNATS, subject string) {
		// Delete the replay's consumer, as a failed node takes its R1 consumer with it:
		// the next pull finds no responders.
		cons := replayConsumers(t, e.js, e.topo.HistoryStream, subject)
		require.Len(t, cons, 1)
		require.NoError(t, e.js.DeleteConsumer(testCtx(t), e.topo.HistoryStream, cons[0].Name))
	})
	require.NoError(t, err)
	assert.Equal(t, want, got, "every event, once each, in order")
}

func TestReplay_EventsThatLeftTheHistoryDuringTheReplayEndItWithNil(t *testing.T) {
	want, got, err := replayDisturbed(t, "aged", func(e *EmbeddedNATS, subject string) {
		// What is left ages out of the history before the replay reaches it.
		hist, err := e.js.Stream(testCtx(t), e.topo.HistoryStream)
		require.NoError(t, err)
		require.NoError(t, hist.Purge(testCtx(t), jetstream.WithPurgeSubject(subject)))
	})
	require.NoError(t, err, "events gone from the history are not a failure")
	assert.Equal(t, want[:replayBatch], got)
}

func TestReplay_CloseDuringAPullIsErrClosed(t *testing.T) {
	e := openEmbedded(t, "")
	checkCloseDuringAPullIsErrClosed(t, e, e.core, e.js)
}

// checkCloseDuringAPullIsErrClosed replays replayBatch+44 events of a fresh topic on
// b; once the first batch was sent it empties what is left of them, so that the next
// pull waits on the server, and closes b while it does: the replay ends with
// ErrClosed, not ErrUnavailable. core is b's; admin purges and reads the history as
// the operator.
func checkCloseDuringAPullIsErrClosed(t *testing.T, b Broker, core *natsCore, admin jetstream.JetStream) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, b.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "closing"}
	publishReplayable(t, b, topic, replayBatch+44)
	subject, _, err := core.subs.ingestTopic(topic)
	require.NoError(t, err)
	hist, err := admin.Stream(ctx, core.topo.HistoryStream)
	require.NoError(t, err)
	closed := make(chan error, 1)
	sent := 0
	err = b.ReplaySince(ctx, topic, time.Time{}, func(*Message) bool {
		sent++
		if sent == replayBatch {
			require.NoError(t, hist.Purge(ctx, jetstream.WithPurgeSubject(subject)))
			go func() { closed <- closeWhilePulling(ctx, hist, subject, b.Close) }()
		}
		return true
	})
	require.ErrorIs(t, err, ErrClosed)
	assert.NotErrorIs(t, err, ErrUnavailable)
	require.NoError(t, <-closed)
}

// closeWhilePulling calls closeBroker once a pull of the replay consumer on hist
// filtered to subject is waiting on the server.
func closeWhilePulling(ctx context.Context, hist jetstream.Stream, subject string, closeBroker func() error) error {
	for ctx.Err() == nil {
		infos := hist.ListConsumers(ctx)
		for ci := range infos.Info() {
			if ci.Config.FilterSubject == subject && ci.NumWaiting > 0 {
				return closeBroker()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ctx.Err()
}
