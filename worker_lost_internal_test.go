package mq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLostWait_HoldsOnlyTheTenantsOfEventsLostInTransitUntilEachArrives(t *testing.T) {
	d, u := heldBacklog(0, nil)
	u.backlog = nil
	d.awaitLost(u, map[TenantID][]uint64{"acme": {7, 4}, "globex": {5}})
	acme, globex, other := &lane{tenant: "acme"}, &lane{tenant: "globex"}, &lane{tenant: "initech"}
	assert.True(t, u.holds(acme))
	assert.True(t, u.holds(globex))
	assert.False(t, u.holds(other), "a tenant that lost nothing goes on")

	d.awaitLost(u, map[TenantID][]uint64{"acme": {6}}) // a second jump adds to the first
	d.lostArrived(u, "globex", 5)
	assert.False(t, u.holds(globex), "globex's lost event is back")
	d.lostArrived(u, "acme", 9) // a later event: acme still waits
	d.lostArrived(u, "acme", 4)
	d.lostArrived(u, "acme", 7)
	assert.True(t, u.holds(acme), "acme's 6 is still to come")
	d.lostArrived(u, "acme", 6)
	assert.False(t, u.holds(acme))
	assert.Nil(t, u.lost, "every lost event is back")
}

func TestLostWait_EndsOnceTwoAckWaitsRanOut(t *testing.T) {
	d, u := heldBacklog(0, nil)
	u.backlog, u.ackWait = nil, time.Minute
	d.awaitLost(u, map[TenantID][]uint64{"acme": {4}})
	d.endLostWait(u, time.Now().Add(90*time.Second))
	require.NotNil(t, u.lost, "an ack wait and a half: a new leader can redeliver that late")
	d.endLostWait(u, time.Now().Add(3*time.Minute))
	assert.Nil(t, u.lost)
	assert.False(t, u.holds(&lane{tenant: "acme"}), "the ack wait brings it back, or nothing will")
}
