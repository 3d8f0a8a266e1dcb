package mqtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func replayCases() []testCase {
	return []testCase{
		{
			name: "ReplaySince",
			proves: "A replay sends exactly the topic's events stored at or after since, in " +
				"order; other tables, scopes and tenants never leak in.",
			publishes: "events on acme/r and neighbouring tables, scopes and tenants (acme/other, " +
				"acme/r/s, acme/r/s2, acme/r.s, globex/r)",
			run: replaySince,
		},
		{
			name: "ReplaySinceStopsWhenContextIsDone",
			proves: "A replay whose context ends during it returns the context's error after the " +
				"event it was sending.",
			publishes: "events on acme/r",
			run:       replaySinceStopsWhenContextIsDone,
		},
		{
			name:      "ReplaySinceWithADoneContextReturnsItsErrorAndSendsNothing",
			proves:    "A replay under a context already done returns its error and sends nothing.",
			publishes: "events on acme/r",
			run:       replaySinceDoneContext,
		},
		{
			name: "ReplaySincePullFailureIsAnError",
			proves: "A replay whose broker is closed midway (the case calls Close from inside " +
				"send) sends nothing more and ends with an error wrapping ErrClosed, not a " +
				"context's (nor ErrUnavailable, or an early nil): a closed broker is neither " +
				"a failing one nor being caught up.",
			publishes: "events on acme/r",
			run:       replaySincePullFailure,
		},
		{
			name: "ReplaySinceStopsAfterTheEventSendRefused",
			proves: "Send returning false stops the replay after exactly that event, with a nil " +
				"end.",
			publishes: "10 events on acme/r",
			run:       replaySinceSendFalse,
		},
		{
			name: "ReplaySinceToASlowSendArrivesWholeAndInOrder",
			proves: "A replay to a client taking 5 ms per event, over 300 events, arrives whole " +
				"and in order.",
			publishes: "300 events on acme/slow",
			run:       replaySinceSlowSend,
		},
		{
			name: "ReplaySinceDoesNotSendEventsPublishedDuringIt",
			proves: "Events published while a replay runs are not sent by it (the caller's live " +
				"subscription has them), though they are stored.",
			publishes: "20 events on acme/tail, 5 more during the replay",
			run:       replaySinceNoTail,
		},
		{
			name: "ReplaySinceSendsMessagesWithTopicDataHeadersAndTimestamp",
			proves: "Each replayed event is a *mq.Message with its topic, data, headers and a " +
				"stored timestamp; its settle methods are harmless no-ops.",
			publishes: "1 event with headers on acme/shape/sc",
			run:       replaySinceMessageShape,
		},
		{
			name: "ReplaySinceRefusesANilSendAndLosesNothing",
			proves: "A nil send is refused with ErrInvalidConfig, never a panic, even with events to " +
				"send, and the events are still all there.",
			publishes: "events on acme/r",
			run:       replaySinceNilSend,
		},
		{
			name: "ReplaySinceBeforeAnyStorableTimeIsEverythingAndAfterItNothing",
			proves: "A since far in the past (before any time a broker can store, however it " +
				"counts time) replays everything, one far in the future nothing: never the " +
				"reverse by an overflow, so a since taken from a client cannot replay the " +
				"whole history by being absurd.",
			publishes: "events on acme/r",
			run:       replaySinceOutOfRange,
		},
		{
			name: "OldestSequenceIsAtOrBelowEveryReplayedEventAndNeverMovesBack",
			proves: "For a broker that is an mq.HistoryHorizon: every replayed event carries a " +
				"Sequence at or above OldestSequence, which does not go down from one call to " +
				"the next; a nil context is ErrInvalidConfig and a call after Close ErrClosed. " +
				"Skipped for a broker that is no mq.HistoryHorizon.",
			publishes: "events on acme/r",
			run:       oldestSequenceBoundsReplays,
		},
		{
			name: "OldestSequenceWithADoneContextReturnsTheContextsError",
			proves: "OldestSequence under a context already cancelled or expired returns an " +
				"error wrapping that context's error, as mq.HistoryHorizon promises. " +
				"Skipped for a broker that is no mq.HistoryHorizon.",
			publishes: "nothing",
			run:       oldestSequenceWithADoneContext,
		},
	}
}

func oldestSequenceBoundsReplays(t *testing.T, h Harness) {
	e := setup(t, h)
	hh := optional[mq.HistoryHorizon](t, e.b)
	tp := e.twoReplayable()
	first, err := hh.OldestSequence(e.ctx)
	require.NoError(t, err)
	var seqs []uint64
	require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		seqs = append(seqs, m.Sequence)
		return true
	}))
	require.Len(t, seqs, 2)
	for _, s := range seqs {
		assert.GreaterOrEqual(t, s, first, "a replayed event's Sequence is below the oldest held")
	}
	assert.Less(t, seqs[0], seqs[1], "a replay's Sequences grow")
	again, err := hh.OldestSequence(e.ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, again, first, "the oldest moved back")
	assert.LessOrEqual(t, again, seqs[0], "the oldest is past an event the replay still sends")

	var nilCtx context.Context
	_, err = hh.OldestSequence(nilCtx)
	assert.ErrorIs(t, err, mq.ErrInvalidConfig, "a nil context")
	require.NoError(t, e.b.Close())
	_, err = hh.OldestSequence(e.ctx)
	assert.ErrorIs(t, err, mq.ErrClosed, "after Close")
}

func replaySince(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "r", "")
	beforeAll := time.Now().Add(-time.Minute)
	e.publish(tp, "one")
	e.replayReaches(tp, 1)
	since := time.Now()
	e.publish(tp, "two")
	e.publish(topic(Acme, "other", ""), "other table")
	e.publish(topic(Acme, "r", "s"), "scoped")
	e.publish(topic(Acme, "r", "s2"), "other scope")
	e.publish(topic(Acme, "r.s", ""), "dotted table")
	e.publish(topic(Globex, "r", ""), "globex")
	e.publish(tp, "three")
	for _, last := range []struct {
		tp   mq.Topic
		data string
	}{{tp, "three"}, {topic(Acme, "r", "s"), "scoped"}, {topic(Globex, "r", ""), "globex"}, {topic(Acme, "r.s", ""), "dotted table"}} {
		e.replayThrough(last.tp, time.Time{}, last.data)
	}

	for _, c := range []struct {
		name  string
		tp    mq.Topic
		since time.Time
		want  []string
	}{
		{"SinceInTheMiddle", tp, since, []string{"two", "three"}},
		{"ZeroTimeIsFromTheBeginning", tp, time.Time{}, []string{"one", "two", "three"}},
		{"SinceBeforeEverything", tp, beforeAll, []string{"one", "two", "three"}},
		{"SinceInTheFutureIsACleanEmptyEnd", tp, time.Now().Add(time.Hour), []string{}},
		{"ScopedTopicIsExact", topic(Acme, "r", "s"), time.Time{}, []string{"scoped"}},
		{"TableWithADotIsNotTableAndScope", topic(Acme, "r.s", ""), time.Time{}, []string{"dotted table"}},
		{"OtherTenantNeverLeaks", topic(Globex, "r", ""), time.Time{}, []string{"globex"}},
		{"NeverPublishedTopicIsEmpty", topic(Acme, "never", ""), time.Time{}, []string{}},
		{"TenantWithoutEventsIsEmpty", topic(Globex, "other", ""), time.Time{}, []string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sub := *e
			sub.t = t
			assert.Equal(t, c.want, sub.replay(c.tp, c.since))
		})
	}
}

// twoReplayable publishes "one" and "two" on Acme/r and waits until both replay.
func (e *env) twoReplayable() mq.Topic {
	e.t.Helper()
	tp := topic(Acme, "r", "")
	e.publish(tp, "one")
	e.publish(tp, "two")
	e.replayReaches(tp, 2)
	return tp
}

func replaySinceStopsWhenContextIsDone(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := e.twoReplayable()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var sent []string
	err := e.b.ReplaySince(ctx, tp, time.Time{}, func(m *mq.Message) bool {
		sent = append(sent, string(m.Data))
		cancel()
		return true
	})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"one"}, sent)
}

func replaySinceDoneContext(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := e.twoReplayable()
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	sent := 0
	err := e.b.ReplaySince(ctx, tp, time.Time{}, func(*mq.Message) bool { sent++; return true })
	assert.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, sent)
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	err = e.b.ReplaySince(expired, tp, time.Time{}, func(*mq.Message) bool { sent++; return true })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, sent)
}

func replaySincePullFailure(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := e.twoReplayable()
	var sent []string
	err := e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		sent = append(sent, string(m.Data))
		if len(sent) == 1 {
			closed := make(chan error, 1)
			go func() { closed <- e.b.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					e.errorf("Close: %v", err)
				}
			case <-time.After(wait):
				e.errorf("Close did not return within %s while a replay was sending", wait)
				return false
			}
		}
		return true
	})
	require.Error(t, err, "a replay whose broker was closed ended as if caught up")
	assert.ErrorIs(t, err, mq.ErrClosed, "a replay whose broker was closed midway")
	assert.NotErrorIs(t, err, mq.ErrUnavailable, "a closed broker is not an unavailable one")
	assert.False(t, isContextErr(err), "the error is a context's: %v", err)
	assert.Equal(t, []string{"one"}, sent)
}

func replaySinceSendFalse(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "r", "")
	for i := range 10 {
		e.publish(tp, fmt.Sprint(i))
	}
	e.replayReaches(tp, 10)
	for _, stopAt := range []int{1, 3, 10} {
		var sent []string
		err := e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
			sent = append(sent, string(m.Data))
			return len(sent) < stopAt
		})
		assert.NoError(t, err, "stop at %d", stopAt)
		assert.Equal(t, seq("", stopAt), sent, "stop at %d", stopAt)
	}
}

func replaySinceSlowSend(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "slow", "")
	const n = 300
	for i := range n {
		e.publish(tp, fmt.Sprint(i))
	}
	e.replayReaches(tp, n)
	var sent []string
	err := e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		sent = append(sent, string(m.Data))
		time.Sleep(5 * time.Millisecond)
		return true
	})
	require.NoError(t, err)
	assert.Equal(t, seq("", n), sent)
}

func replaySinceNoTail(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "tail", "")
	const n = 20
	for i := range n {
		e.publish(tp, fmt.Sprint(i))
	}
	e.replayReaches(tp, n)
	var sent []string
	err := e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		sent = append(sent, string(m.Data))
		if len(sent) == 1 {
			for i := range 5 {
				if err := e.b.Publish(e.ctx, tp, []byte(fmt.Sprintf("late-%d", i))); err != nil {
					e.errorf("publish during the replay: %v", err)
				}
			}
			// Let the late events reach the replayable history before going on.
			time.Sleep(quiet)
		}
		return true
	})
	require.NoError(t, err)
	assert.Equal(t, seq("", n), sent, "the replay chased the live tail")
	e.replayEventually(tp, time.Time{}, append(seq("", n), seq("late-", 5)...))
}

func replaySinceMessageShape(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := topic(Acme, "shape", "sc")
	before := time.Now().Add(-time.Hour)
	e.publish(tp, "payload", mq.WithHeader("X-Replay", "kept"))
	e.replayReaches(tp, 1)
	var got []*mq.Message
	require.NoError(t, e.b.ReplaySince(e.ctx, tp, time.Time{}, func(m *mq.Message) bool {
		got = append(got, m)
		return true
	}))
	require.Len(t, got, 1)
	m := got[0]
	require.NotNil(t, m)
	assert.Equal(t, []byte("payload"), m.Data)
	assert.Equal(t, tp, m.Topic())
	key, _ := tp.Key()
	assert.Equal(t, key, m.TopicKey())
	assert.Equal(t, "kept", m.Headers.Get("X-Replay"))
	assert.False(t, m.Timestamp.IsZero(), "Timestamp is zero")
	assert.True(t, m.Timestamp.After(before), "Timestamp %v is before the publish", m.Timestamp)
	assert.NotNil(t, m.Ctx, "Message.Ctx")
	assert.NoError(t, m.Ack(), "a replayed message's Ack")
	assert.NoError(t, m.Nak(), "a replayed message's Nak")
	assert.NoError(t, m.DoubleAck(e.ctx), "a replayed message's DoubleAck")
}

func replaySinceNilSend(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := e.twoReplayable()
	var err error
	require.NotPanics(t, func() { err = e.b.ReplaySince(e.ctx, tp, time.Time{}, nil) }, "ReplaySince with a nil send")
	require.ErrorIs(t, err, mq.ErrInvalidConfig, "ReplaySince with a nil send")
	assert.False(t, isContextErr(err), "the error is a context's: %v", err)
	assert.Equal(t, []string{"one", "two"}, e.replay(tp, time.Time{}))
}

func replaySinceOutOfRange(t *testing.T, h Harness) {
	e := setup(t, h)
	tp := e.twoReplayable()
	all := []string{"one", "two"}
	for _, c := range []struct {
		since time.Time
		want  []string
	}{
		{time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), all},
		{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), all},
		{time.Date(1677, 9, 21, 0, 0, 0, 0, time.UTC), all},
		{time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), all},
		{time.Date(2262, 4, 12, 0, 0, 0, 0, time.UTC), []string{}},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), []string{}},
		{time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), []string{}},
	} {
		got, err := e.tryReplay(tp, c.since, 0)
		require.NoError(t, err, "replay since %v", c.since)
		assert.Equal(t, c.want, got, "replay since %v", c.since)
	}
}

// A host calls OldestSequence before a replay under a deadline of its own, and must be
// able to tell its ended ctx from a broker at fault.
func oldestSequenceWithADoneContext(t *testing.T, h Harness) {
	e := setup(t, h)
	hh := optional[mq.HistoryHorizon](t, e.b)
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for _, ctx := range []context.Context{cancelled, expired} {
		_, err := hh.OldestSequence(ctx)
		assert.ErrorIs(t, err, ctx.Err(),
			"OldestSequence under a done context: mq.HistoryHorizon promises ctx's error when ctx ends first")
	}
}
