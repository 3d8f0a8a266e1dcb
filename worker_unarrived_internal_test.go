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

// A release unpins a pin it never got only when the durable delivered nothing since
// the take and the pin is new since then: a drained pull of this worker's that the
// server pinned as it dropped it. A pin held at the take, one this worker got, or a
// delivery since the take (the pin's holder may hold that event) leaves it alone.
func TestPinnedToADrainedPull_OnlyANewPinThatGotNothing(t *testing.T) {
	const group = "ingest"
	info := func(pin string, delivered uint64) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{
			Delivered:      jetstream.SequenceInfo{Consumer: delivered},
			PriorityGroups: []jetstream.PriorityGroupState{{Group: group, PinnedClientID: pin}},
		}
	}
	taken := func(got, atTake string, deliveredAtTake uint64) *unit {
		u := &unit{group: group, pinAtTake: atTake}
		if got != "" {
			u.pin.Store(&got)
		}
		u.lastDelivery.Store(deliveredAtTake)
		return u
	}
	for _, c := range []struct {
		name string
		info *jetstream.ConsumerInfo
		u    *unit
		want bool
	}{
		{"a new pin, nothing delivered since the take", info("N", 7), taken("", "", 7), true},
		{"a new pin replacing the take's, nothing delivered since", info("N", 7), taken("", "T", 7), true},
		{"no pin", info("", 7), taken("", "", 7), false},
		{"the pin another pull held at the take", info("T", 7), taken("", "T", 7), false},
		{"a new pin that got a delivery since the take", info("N", 8), taken("", "", 7), false},
		{"a pin after this worker got one of its own", info("N", 7), taken("A", "", 7), false},
	} {
		assert.Equal(t, c.want, pinnedToADrainedPull(c.info, c.u), c.name)
	}
}
