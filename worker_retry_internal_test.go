package mq

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRetryDelay_DoublesPerAttemptUpToItsCapsAndNeverOverflows: the delay doubles
// from RetryDelay per earlier attempt up to MaxRetryDelay and the ack wait, also when
// MaxRetryDelay is the largest duration and the attempts run into the hundreds, where
// a doubling past the cap overflowed into a negative delay (an immediate nak).
func TestRetryDelay_DoublesPerAttemptUpToItsCapsAndNeverOverflows(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		cfg     ConsumerConfig
		ackWait time.Duration
		attempt int
		want    time.Duration
	}{
		{"first attempt", ConsumerConfig{RetryDelay: time.Second}, time.Minute, 1, time.Second},
		{"third attempt", ConsumerConfig{RetryDelay: time.Second}, time.Minute, 3, 4 * time.Second},
		{"capped by MaxRetryDelay", ConsumerConfig{RetryDelay: time.Second, MaxRetryDelay: 5 * time.Second}, time.Minute, 10, 5 * time.Second},
		{"capped by the ack wait", ConsumerConfig{RetryDelay: time.Second, MaxRetryDelay: time.Hour}, 30 * time.Second, 10, 30 * time.Second},
		{"largest MaxRetryDelay, attempt 35", ConsumerConfig{MaxDeliveries: -1, MaxRetryDelay: math.MaxInt64}, time.Minute, 35, time.Minute},
		{"largest MaxRetryDelay, attempt 1000", ConsumerConfig{MaxDeliveries: -1, MaxRetryDelay: math.MaxInt64}, time.Minute, 1000, time.Minute},
		{"largest MaxRetryDelay, no ack wait known", ConsumerConfig{MaxDeliveries: -1, MaxRetryDelay: math.MaxInt64}, 0, 1000, math.MaxInt64},
		{"largest both", ConsumerConfig{RetryDelay: math.MaxInt64, MaxRetryDelay: math.MaxInt64}, 0, 3, math.MaxInt64},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := newWorkerPolicy(c.cfg, 4)
			require.NoError(t, err)
			got := (&dispatcher{policy: p}).retryDelay(&entry{attempt: c.attempt, ackWait: c.ackWait})
			assert.Equal(t, c.want, got)
		})
	}
}
