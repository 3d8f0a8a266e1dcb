package mq

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSeqSet_MergesTouchingRangesAndKeepsWhatIsAboveAFloor(t *testing.T) {
	var s seqSet
	for _, seq := range []uint64{5, 7, 3, 6, 10, 11, 1} {
		s.add(seq)
	}
	assert.Equal(t, []seqRange{{1, 1}, {3, 3}, {5, 7}, {10, 11}}, s.ranges)
	s.addRange(2, 4)
	assert.Equal(t, []seqRange{{1, 7}, {10, 11}}, s.ranges, "a range joins the ones it touches")
	for seq, want := range map[uint64]bool{0: false, 1: true, 7: true, 8: false, 9: false, 10: true, 11: true, 12: false} {
		assert.Equal(t, want, s.has(seq), "has(%d)", seq)
	}
	s.add(0)
	assert.False(t, s.has(0), "0 is no stream sequence")

	b := newBudgets(1, 0)
	b.ackedRanges(0, s.ranges)
	assert.Equal(t, []seqRange{{6, 7}, {10, 11}}, b.ackedAbove(0, 5))
	assert.Equal(t, []seqRange{{10, 11}}, b.ackedAbove(0, 8), "the floor counts as acknowledged")
	assert.Empty(t, b.ackedAbove(0, 11))
}

func TestSeqRanges_RoundTripThroughTheStoredFormAndRefuseBadInput(t *testing.T) {
	for _, ranges := range [][]seqRange{nil, {{4, 4}}, {{1, 3}, {5, 5}, {9, 1 << 40}}} {
		got, err := parseSeqRanges(formatSeqRanges(ranges))
		require.NoError(t, err)
		assert.Equal(t, ranges, got)
	}
	assert.Equal(t, "1-3,5", formatSeqRanges([]seqRange{{1, 3}, {5, 5}}))
	for _, bad := range []string{",", "x", "3-1", "0", "0-2", "1-", "-1", "1,,2", "1-2-3"} {
		_, err := parseSeqRanges(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestHeldQueue_KeepsEventsInAnyCommitOrderAndForgetsThoseReleased(t *testing.T) {
	var q heldQueue
	ev := func(seq uint64) heldEvent { return heldEvent{tenant: "t", size: int64(seq)} }
	for _, seq := range []uint64{3, 4, 1, 6, 5, 2} { // answers overtake each other
		require.True(t, q.add(seq, ev(seq)), "add %d", seq)
	}
	assert.False(t, q.add(4, ev(99)), "a held event is not held twice")
	got, ok := q.get(4)
	assert.True(t, ok)
	assert.Equal(t, ev(4), got, "the first add stays")

	for _, seq := range []uint64{1, 3, 6} {
		got, ok := q.remove(seq)
		require.True(t, ok, "remove %d", seq)
		assert.Equal(t, ev(seq), got)
		_, again := q.remove(seq)
		assert.False(t, again, "releasing %d twice", seq)
	}
	for seq, want := range map[uint64]bool{1: false, 2: true, 3: false, 4: true, 5: true, 6: false, 7: false} {
		_, ok := q.get(seq)
		assert.Equal(t, want, ok, "get(%d)", seq)
	}
	assert.Equal(t, []uint64{2, 3, 4, 5}, slotSeqs(q), "released slots at either end are trimmed")
	require.True(t, q.add(3, ev(3)), "a released slot in the middle can be held again")
	assert.Equal(t, 4, q.live)
}

func TestHeldQueue_AnEventHeldLongDoesNotKeepThoseReleasedAfterIt(t *testing.T) {
	var q heldQueue
	const n = 10_000
	for seq := uint64(1); seq <= n; seq++ {
		require.True(t, q.add(seq, heldEvent{tenant: "t", size: 1, keyedID: "k"}))
	}
	for seq := uint64(2); seq <= n-1; seq++ { // 1 stays held (a poison event), so does n
		_, ok := q.remove(seq)
		require.True(t, ok)
	}
	assert.Equal(t, 2, q.live)
	assert.Less(t, len(q.slots), 2*compactAt, "released slots behind a held one are compacted")
	for _, s := range q.slots[len(q.slots):cap(q.slots)] {
		assert.Equal(t, heldEvent{}, s.ev, "a slot past the end keeps no event alive")
	}
	_, ok := q.get(1)
	assert.True(t, ok)
	_, ok = q.get(n)
	assert.True(t, ok)
}

func slotSeqs(q heldQueue) []uint64 {
	var seqs []uint64
	for _, s := range q.slots {
		seqs = append(seqs, s.seq)
	}
	return seqs
}

// TestHeldQueue_AgreesWithAMapUnderRandomCommitsAndReleases drives a queue and a plain
// map with the same random adds and removes, in the orders a partition sees them
// (mostly ascending, some late answers and acks out of order, repeats), and checks
// that they hold the same events after every step.
func TestHeldQueue_AgreesWithAMapUnderRandomCommitsAndReleases(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q heldQueue
	want := map[uint64]heldEvent{}
	next := uint64(1)
	for step := range 20_000 {
		var seq uint64
		switch r := rng.IntN(10); {
		case r < 5: // the stream's next event
			seq = next
			next++
		case r < 7: // a late answer or a repeat, near the back
			seq = next - uint64(rng.IntN(int(min(next, 50))))
		default: // an ack, mostly near the front
			seq = next - uint64(rng.IntN(int(next)))
		}
		if seq == 0 {
			continue
		}
		ev := heldEvent{tenant: "t", size: int64(step)}
		if rng.IntN(3) == 0 {
			got, ok := q.remove(seq)
			w, wok := want[seq]
			require.Equal(t, wok, ok, "step %d: remove %d", step, seq)
			require.Equal(t, w, got, "step %d: remove %d", step, seq)
			delete(want, seq)
		} else {
			_, held := want[seq]
			require.Equal(t, !held, q.add(seq, ev), "step %d: add %d", step, seq)
			if !held {
				want[seq] = ev
			}
		}
		require.Equal(t, len(want), q.live, "step %d", step)
	}
	for seq, ev := range want {
		got, ok := q.get(seq)
		require.True(t, ok, "seq %d", seq)
		require.Equal(t, ev, got)
	}
	require.True(t, slices.IsSortedFunc(q.slots, func(a, b heldSlot) int { return cmp.Compare(a.seq, b.seq) }))
}
