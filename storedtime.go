package mq

import (
	"math"
	"time"
)

// JetStream stamps a stored event with nanoseconds since 1970 in an int64, and compares
// a start or cutoff time the same way, through time.UnixNano, whose result is undefined
// outside that range: given as is, the year 1600 wraps to a time in the future and
// 2262-04-12 to one in the past. So a time reaches the server only inside the range a
// stored time can take, and the brokers answer for the others themselves.
var (
	// firstStoredTime is the earliest time an int64 of nanoseconds holds,
	// 1677-09-21T00:12:43.145224192Z.
	firstStoredTime = time.Unix(0, math.MinInt64)
	// lastStoredTime is the latest, 2262-04-11T23:47:16.854775807Z.
	lastStoredTime = time.Unix(0, math.MaxInt64)
)

// beforeAnyStored reports whether t is earlier than any stored event can be: every
// stored event is at or after it.
func beforeAnyStored(t time.Time) bool { return t.Before(firstStoredTime) }

// afterAnyStored reports whether t is later than any stored event can be: none is at
// or after it.
func afterAnyStored(t time.Time) bool { return t.After(lastStoredTime) }
