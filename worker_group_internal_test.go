package mq

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestGroup_APeerUnheardWhileThisProcessDidNotRunStaysLiveForAMemberTimeoutAfter(t *testing.T) {
	const timeout = 3 * time.Second
	now := time.Now()
	quiet := &peer{seen: now.Add(-9 * time.Second)} // last heard before the stall

	stalled := newGroup(&dispatcher{core: &natsCore{log: slog.New(slog.DiscardHandler)}}, "beats", timeout)
	stalled.ticked = now.Add(-10 * time.Second) // its loop's beat is 9 s late
	stalled.noteStall(now)
	assert.False(t, stalled.silent(quiet, now), "a peer unheard only while this process was stopped was taken for dead")
	assert.False(t, stalled.silent(quiet, now.Add(timeout)))
	assert.True(t, stalled.silent(quiet, now.Add(timeout+time.Millisecond)), "a peer still unheard a member timeout after the stall is silent")

	running := newGroup(&dispatcher{core: &natsCore{log: slog.New(slog.DiscardHandler)}}, "beats", timeout)
	running.ticked = now.Add(-running.interval()) // on time
	running.noteStall(now)
	assert.True(t, running.silent(quiet, now), "a process that ran throughout takes a peer unheard for a member timeout for dead")
}
