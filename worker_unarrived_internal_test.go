package mq

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
)

// A release waits for the deliveries counted since the take unless they can only have
// gone to another pull: the server's pin is not the one this worker last got, or, before
// it got any, is the one another pull held at the take.
func TestPinnedElsewhere_OnlyWhenThePinCannotBeThisWorkers(t *testing.T) {
	const group = "ingest"
	pinned := func(id string) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{PriorityGroups: []jetstream.PriorityGroupState{
			{Group: "other", PinnedClientID: "X"},
			{Group: group, PinnedClientID: id},
		}}
	}
	unit := func(last, atTake string) *unit {
		u := &unit{group: group, pinAtTake: atTake}
		if last != "" {
			u.pin.Store(&last)
		}
		return u
	}
	for _, c := range []struct {
		name       string
		server     string
		last, take string
		want       bool
	}{
		{"the pin this worker last got", "A", "A", "", false},
		{"a pin other than the one it last got", "B", "A", "", true},
		{"no pin at all", "", "A", "", false},
		{"no delivery yet, and the pin another pull held at the take", "T", "", "T", true},
		{"no delivery yet, and a pin new since the take (maybe its own)", "N", "", "T", false},
		{"no delivery yet, unpinned at the take, pinned since", "N", "", "", false},
	} {
		assert.Equal(t, c.want, pinnedElsewhere(pinned(c.server), unit(c.last, c.take)), c.name)
	}
}
