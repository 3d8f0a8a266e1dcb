package mq

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine running: every broker the
// tests open is closed, and Close must stop everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server v2.15.2 leaves this goroutine waiting out a source's request
		// timeout after Shutdown when a source never answers (seen with an external
		// source in the verifier's tests); it is the server's, not the broker's.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
	)
}
