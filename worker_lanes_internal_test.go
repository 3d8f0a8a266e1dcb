package mq

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An emptied lane is kept for its tenant's next event, and dropped once it stayed
// empty from one sweep to the next, so a worker that served many tenants once does not
// keep a lane for each of them.
func TestSweepLanes_DropsALaneOnlyOnceItStayedEmptyForAWholeSweep(t *testing.T) {
	d := &dispatcher{lanes: map[TenantID]*lane{}}
	idle := &lane{tenant: "idle", used: true}
	waiting := &lane{tenant: "waiting", queue: []*entry{{seq: 1}}}
	running := &lane{tenant: "running", running: &entry{seq: 2}}
	held := &lane{tenant: "held", blocked: &entry{seq: 3}}
	for _, l := range []*lane{idle, waiting, running, held} {
		d.lanes[l.tenant] = l
	}

	d.sweepLanes()
	assert.Same(t, idle, d.lanes["idle"], "a lane used since the last sweep was dropped")

	d.sweepLanes()
	assert.NotContains(t, d.lanes, TenantID("idle"), "a lane empty for a whole sweep was kept")
	for _, l := range []*lane{waiting, running, held} {
		assert.Same(t, l, d.lanes[l.tenant], "lane %s holds an event and was dropped", l.tenant)
	}
}

// The ready lanes come out in the order they went in, however pushes and pops
// interleave, and the array does not grow beyond what is ready at once.
func TestReadyLanes_PopsInPushOrderAndKeepsItsArrayBounded(t *testing.T) {
	var q readyLanes
	var want []*lane
	next := 0
	for round := range 200 {
		for range round%7 + 1 {
			l := &lane{part: next}
			next++
			q.push(l)
			want = append(want, l)
		}
		for range round%5 + 1 {
			if q.len() == 0 {
				break
			}
			assert.Same(t, want[0], q.pop())
			want = want[1:]
		}
		assert.Equal(t, len(want), q.len())
		assert.LessOrEqual(t, len(q.lanes), 2*len(want)+32, "popped lanes kept in the array")
	}
	for q.len() > 0 {
		assert.Same(t, want[0], q.pop())
		want = want[1:]
	}
	assert.Empty(t, want)
}
