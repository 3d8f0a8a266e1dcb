//go:build !unix

package mq

import "time"

// processCPU reports no CPU time where getrusage does not exist.
func processCPU() (time.Duration, bool) { return 0, false }
