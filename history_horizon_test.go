package mq

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistoryHorizon_AHistoryThatNeverHeldAnEventStartsAtSequenceOne(t *testing.T) {
	e := openEmbedded(t, "")
	oldest, err := e.OldestSequence(testCtx(t))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), oldest, "a client that saw nothing (Sequence 0) missed nothing")
}

// TestHistoryHorizon_TellsAReplayThatCameBackShortFromOneThatDidNot drops the history's
// oldest events as its max_age or max_bytes would (a purge below a sequence), and checks
// the README's recipe: a client whose last Sequence + 1 is below the oldest missed
// events that its replay, ending with nil, cannot show.
func TestHistoryHorizon_TellsAReplayThatCameBackShortFromOneThatDidNot(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "horizon"}
	publishReplayable(t, e, topic, 10)
	var seqs []uint64
	require.NoError(t, e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		seqs = append(seqs, m.Sequence)
		return true
	}))
	require.Len(t, seqs, 10)
	oldest, err := e.OldestSequence(ctx)
	require.NoError(t, err)
	assert.Equal(t, seqs[0], oldest, "nothing dropped yet")

	hist, err := e.js.Stream(ctx, e.topo.HistoryStream)
	require.NoError(t, err)
	require.NoError(t, hist.Purge(ctx, jetstream.WithPurgeSequence(seqs[4])), "the four oldest age out")
	var replayed []uint64
	require.NoError(t, e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		replayed = append(replayed, m.Sequence)
		return true
	}), "a replay short of events is still a nil end")
	oldest, err = e.OldestSequence(ctx)
	require.NoError(t, err)
	assert.Equal(t, seqs[4], oldest)
	assert.Equal(t, seqs[4:], replayed, "the replay starts at the oldest held")
	missed := func(last uint64) bool { return last+1 < oldest }
	assert.True(t, missed(seqs[2]), "a client that saw up to the third event missed the fourth")
	assert.False(t, missed(seqs[3]), "a client that saw up to the fourth missed nothing")

	require.NoError(t, hist.Purge(ctx), "everything ages out")
	oldest, err = e.OldestSequence(ctx)
	require.NoError(t, err)
	assert.Equal(t, seqs[9]+1, oldest, "an emptied history starts at the next event")
	assert.False(t, missed(seqs[9]), "a client that saw the last event missed nothing")
	assert.True(t, missed(seqs[8]), "one that saw the one before missed the last")
}

func TestHistoryHorizon_RefusesANilContextAndAnswersClosedAndCancelled(t *testing.T) {
	e := openEmbedded(t, "")
	var nilCtx context.Context
	_, err := e.OldestSequence(nilCtx)
	require.ErrorIs(t, err, ErrInvalidConfig)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	_, err = e.OldestSequence(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, e.Close())
	_, err = e.OldestSequence(testCtx(t))
	require.ErrorIs(t, err, ErrClosed)
}
