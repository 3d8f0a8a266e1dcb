package mq

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine running: every broker the
// tests open is closed, and Close must stop everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
