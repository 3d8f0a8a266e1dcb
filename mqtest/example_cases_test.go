package mqtest_test

import (
	"fmt"
	"slices"

	"github.com/wavehouse/mq/mqtest"
)

// Which cases a harness without Restart skips: the cases whose Hooks name it.
func ExampleCases() {
	for _, c := range mqtest.Cases() {
		if slices.Contains(c.Hooks, "Restart") {
			fmt.Println(c.Name)
		}
	}
	// Output:
	// AnIdleRestartDeliversEveryUnacknowledgedEventInOrder
	// ARestartRedeliversWhatWasNakedOrHeldAndNotWhatWasAcknowledged
	// ARestartKeepsDeadLettersAndBudgetsWhereTheBrokerStoresThem
	// ARestartKeepsEnforcingTheBudgetOfWhatIsStillQueued
}
