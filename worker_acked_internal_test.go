package mq

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAcked_RemembersTheLastMaxAckPendingSequencesAndForgetsOlderOnes(t *testing.T) {
	a := newAcked(3)
	for seq := uint64(1); seq <= 5; seq++ {
		a.add(seq)
	}
	for seq, want := range map[uint64]bool{1: false, 2: false, 3: true, 4: true, 5: true, 6: false} {
		assert.Equal(t, want, a.has(seq), "seq %d", seq)
	}
}

func TestAcked_ASequenceAckedTwiceTakesOnePlace(t *testing.T) {
	a := newAcked(2)
	a.add(1)
	a.add(1) // an Ack, then a DoubleAck
	a.add(2)
	assert.True(t, a.has(1), "a second ack of 1 pushed it out early")
	a.add(3)
	assert.False(t, a.has(1))
	assert.True(t, a.has(2))
	assert.True(t, a.has(3))
}

func TestAcked_ARaisedMaxAckPendingKeepsWhatWasRememberedAndRemembersMore(t *testing.T) {
	d := &dispatcher{acked: map[int]*acked{}}
	a := d.ackedOn(0, 2)
	for seq := uint64(1); seq <= 3; seq++ {
		a.add(seq) // 1 forgotten, the ring wrapped
	}
	assert.Same(t, a, d.ackedOn(0, 4), "a retake forgot what was acked before")
	for seq := uint64(4); seq <= 5; seq++ {
		a.add(seq)
	}
	for seq, want := range map[uint64]bool{1: false, 2: true, 3: true, 4: true, 5: true} {
		assert.Equal(t, want, a.has(seq), "seq %d", seq)
	}
	a.add(6) // full at 4: the oldest, 2, goes
	assert.False(t, a.has(2))
	assert.True(t, a.has(3))
}

func TestAcked_ADurableWithoutMaxAckPendingIsBoundedStill(t *testing.T) {
	for _, maxAckPending := range []int{0, -1, 1 << 30} {
		assert.Equal(t, maxAckedRemembered, newAcked(maxAckPending).limit, "MaxAckPending %d", maxAckPending)
	}
}
