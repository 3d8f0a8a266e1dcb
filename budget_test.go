package mq

import (
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
