package mq

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func quietGroup(timeout time.Duration) *group {
	return newGroup(&dispatcher{core: &natsCore{log: slog.New(slog.DiscardHandler)}}, "beats", timeout)
}

func TestGroup_APeerUnheardWhileThisProcessDidNotRunStaysLiveForAMemberTimeoutAfter(t *testing.T) {
	const timeout = 3 * time.Second
	now := time.Now()
	quiet := &peer{seen: now.Add(-9 * time.Second)} // last heard before the stall

	stalled := quietGroup(timeout)
	stalled.ticked = now.Add(-10 * time.Second) // its loop's beat is 9 s late
	stalled.noteStall(now)
	assert.False(t, stalled.silent(quiet, now), "a peer unheard only while this process was stopped was taken for dead")
	assert.False(t, stalled.silent(quiet, now.Add(timeout)))
	assert.True(t, stalled.silent(quiet, now.Add(timeout+time.Millisecond)), "a peer still unheard a member timeout after the stall is silent")

	running := quietGroup(timeout)
	running.ticked = now.Add(-running.interval()) // on time
	running.noteStall(now)
	assert.True(t, running.silent(quiet, now), "a process that ran throughout takes a peer unheard for a member timeout for dead")
}

func TestGroup_AStallShorterThanASecondCountsUnderAShortMemberTimeout(t *testing.T) {
	const timeout = time.Second
	now := time.Now()
	g := quietGroup(timeout)
	g.ticked = now.Add(-1500 * time.Millisecond) // beat due 1.17 s ago
	quiet := &peer{seen: g.ticked}
	g.noteStall(now)
	assert.False(t, g.silent(quiet, now), "a peer unheard for 1.5 s, 1.17 s of them while this process was stopped, was taken for dead")
}

func TestGroup_AMemberThatStallsAgainAndAgainStillTakesADeadPeerForSilent(t *testing.T) {
	const timeout = 3 * time.Second
	g := quietGroup(timeout)
	start := time.Now()
	dead := &peer{seen: start}
	// Every beat comes 1.2 s late: 1 s of running (the interval), then 1.2 s stopped.
	at := start
	for range 5 {
		g.ticked = at
		at = at.Add(g.interval() + 1200*time.Millisecond)
		g.noteStall(at)
	}
	// 5 s of running since the peer was last heard, 6 s of stalls.
	assert.True(t, g.silent(dead, at), "repeated stalls kept a dead peer live for ever")
	assert.Len(t, g.stalls, 5)
}

func TestGroup_AStallSeenByAHeartbeatAndThenByTheLateBeatCountsOnce(t *testing.T) {
	const timeout = 3 * time.Second
	g := quietGroup(timeout)
	now := time.Now()
	g.ticked = now.Add(-6 * time.Second)
	g.noteStall(now.Add(-10 * time.Millisecond)) // a heartbeat heard first
	g.noteStall(now)                             // then the loop's own late beat
	assert.Len(t, g.stalls, 1)
	assert.Equal(t, now, g.stalls[0].to)
	assert.True(t, g.silent(&peer{seen: now.Add(-9 * time.Second)}, now), "4 s of running since the peer was heard, yet it is live")
}
