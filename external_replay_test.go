//go:build integration

package mq

import (
	"testing"
)

func TestExternalNATS_ANilSendAndTimesOutOfRangeAreRefusedOrClampedAndLoseNothing(t *testing.T) {
	t.Parallel()
	checkOutOfRangeInput(t, newExternalFixture(t).broker(t), false)
}

func TestExternalNATS_SettlingAHeldMessageAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	checkSettlingAfterCloseIsErrClosed(t, newExternalFixture(t).broker(t))
}
