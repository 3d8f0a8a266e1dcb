package mq

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldBacklog is a dispatcher holding partition 0 for the events noted pending at
// open, of which want were still pending at the take.
func heldBacklog(want int, noted map[TenantID][]uint64) (*dispatcher, *unit) {
	d := &dispatcher{core: &natsCore{log: quietLog}, lanes: map[TenantID]*lane{}, units: map[int]*unit{}}
	d.wake = sync.NewCond(&d.mu)
	u := &unit{p: 0, backlog: &backlog{want: want, tenants: noted}}
	d.units[0] = u
	return d, u
}

func TestBacklog_HoldsOnlyTheTenantsWithANotedEventStillToCome(t *testing.T) {
	d, u := heldBacklog(3, map[TenantID][]uint64{"acme": {4, 7}, "globex": {5}})
	acme, globex, other := &lane{tenant: "acme"}, &lane{tenant: "globex"}, &lane{tenant: "initech"}
	assert.True(t, u.holds(acme))
	assert.True(t, u.holds(globex))
	assert.False(t, u.holds(other), "a tenant with nothing noted goes on")

	d.backlogArrived(u, "globex", 5)
	assert.False(t, u.holds(globex), "globex's one noted event arrived")
	d.backlogArrived(u, "acme", 9) // a new event: acme still waits for 4 and 7
	d.backlogArrived(u, "acme", 7)
	assert.True(t, u.holds(acme), "acme's 4 is still to come")
	d.backlogArrived(u, "acme", 4)
	assert.Nil(t, u.backlog, "every noted event arrived")
}

// After a crash the noted events include some acknowledged out of order, which the
// server never sends again: the backlog ends once as many noted events arrived as the
// durable had pending at the take, not an ack wait later.
func TestBacklog_EndsOnceAsManyNotedEventsArrivedAsTheDurableHadPending(t *testing.T) {
	d, u := heldBacklog(2, map[TenantID][]uint64{"acme": {4, 7}, "globex": {5, 6}})
	d.backlogArrived(u, "acme", 7)
	require.NotNil(t, u.backlog)
	d.backlogArrived(u, "globex", 6)
	assert.Nil(t, u.backlog, "4 and 5 were acknowledged before the crash: nothing more is due")
}

// Another worker ran some noted events before the server first served this one: those
// at or below the ack floor, and those acked in this process, are not waited for.
func TestBacklog_ForgetsTheNotedEventsSettledBeforeTheFirstDelivery(t *testing.T) {
	d, u := heldBacklog(4, map[TenantID][]uint64{"acme": {4, 7}, "globex": {5}, "initech": {8}})
	d.core.ackedHere = func(ref eventRef) bool { return ref.seq == 7 }
	d.dropSettled(u, u.backlog, 5)
	require.NotNil(t, u.backlog)
	assert.Equal(t, map[TenantID][]uint64{"initech": {8}}, u.backlog.tenants)
	assert.False(t, u.holds(&lane{tenant: "acme"}), "acme's noted events were acked")
	assert.True(t, u.holds(&lane{tenant: "initech"}))
	d.backlogArrived(u, "initech", 8)
	assert.Nil(t, u.backlog, "the one event left arrived")
}

func TestBacklog_EndsWhenEveryNotedEventWasSettledElsewhere(t *testing.T) {
	d, u := heldBacklog(2, map[TenantID][]uint64{"acme": {4, 7}})
	u.shared.Store(false)
	d.dropSettled(u, u.backlog, 7)
	assert.Nil(t, u.backlog)
	assert.True(t, u.shared.Load(), "another worker was served: what it holds is not known here")
}

func TestReturning_GivesAPartitionsEventsOnlyWhileItsDurableDeliveredNothingNew(t *testing.T) {
	var r returning
	r.note(2, 10, "acme", 4)
	r.note(2, 10, "acme", 7)
	got := r.since(2, 10)
	assert.Equal(t, map[TenantID][]uint64{"acme": {4, 7}}, got)
	got["acme"][0] = 99 // a taker's copy: the next taker gets the events as noted
	assert.Equal(t, map[TenantID][]uint64{"acme": {4, 7}}, r.since(2, 10))
	assert.Nil(t, r.since(1, 10), "nothing noted on partition 1")
	assert.Nil(t, r.since(2, 11), "the durable delivered beyond them")
	assert.Nil(t, r.since(2, 10), "and they are forgotten")
}
