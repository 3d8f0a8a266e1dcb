package mq

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The hot words and the map together must answer as a plain set would, whatever the
// order: in order, out of order, and far apart.
func TestSeqBits_AnswersAsAPlainSetDoesUnderAnyOrderOfChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s, model := newSeqBits(), map[uint64]bool{}
	next := uint64(1)
	for range 200_000 {
		var seq uint64
		switch r.IntN(4) {
		case 0, 1: // near the front, as acks come
			next += uint64(r.IntN(3))
			seq = next
		case 2: // a little behind it, as a tenant held by a retry
			seq = next - min(next-1, uint64(r.IntN(300)))
		default: // anywhere
			seq = 1 + uint64(r.IntN(int(next)+5000))
		}
		switch r.IntN(3) {
		case 0, 1:
			require.Equal(t, !model[seq], s.set(seq), "set %d", seq)
			model[seq] = true
		default:
			s.clear(seq)
			delete(model, seq)
		}
		probe := 1 + uint64(r.IntN(int(next)+5000))
		require.Equal(t, model[probe], s.has(probe), "has %d", probe)
	}
	for seq := uint64(1); seq <= next+5000; seq++ {
		require.Equal(t, model[seq], s.has(seq), "has %d at the end", seq)
	}
}

// A word emptied by clears does not stay in the map.
func TestSeqBits_ForgetsEmptiedWords(t *testing.T) {
	s := newSeqBits()
	for seq := uint64(1); seq <= 64*100; seq++ {
		s.set(seq)
	}
	for seq := uint64(1); seq <= 64*100; seq++ {
		s.clear(seq)
	}
	require.LessOrEqual(t, len(s.words), 2, "emptied words kept: %d", len(s.words))
}
