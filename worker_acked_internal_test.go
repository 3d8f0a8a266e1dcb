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

func TestAcked_ADurableWithoutMaxAckPendingIsBoundedStill(t *testing.T) {
	for _, maxAckPending := range []int{0, -1, 1 << 30} {
		assert.Equal(t, maxAckedRemembered, newAcked(maxAckPending).limit, "MaxAckPending %d", maxAckPending)
	}
}
