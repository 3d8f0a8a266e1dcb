package mqtest

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// TestRun_CasesNeedingEndDeliverySkipWithTheReasonWhenItIsNil: EndDelivery is
// optional; exactly the cases that end delivery from outside skip without it, saying
// why, and run with it.
func TestRun_CasesNeedingEndDeliverySkipWithTheReasonWhenItIsNil(t *testing.T) {
	var skipped []string
	with := Harness{EndDelivery: func(*testing.T, mq.Broker) {}}
	for _, c := range cases() {
		if c.skip == nil {
			continue
		}
		if reason := c.skip(Harness{}); reason == "Harness.EndDelivery is nil" {
			skipped = append(skipped, c.name)
			assert.Empty(t, c.skip(with), "%s with an EndDelivery", c.name)
		}
	}
	assert.ElementsMatch(t, []string{
		"FailedOnceWhenDeliveryEnds",
		"FailedNeverAfterStop",
		"HealthReportsAnEndedConsumeUntilStoppedAndErrClosedAfterClose",
	}, skipped)
}

// TestHarness_WaitScaleMultipliesTheFieldByTheEnvironment: WaitScale 0 is 1, the
// environment variable multiplies it, and a factor that is not positive is an error
// that names where it came from.
func TestHarness_WaitScaleMultipliesTheFieldByTheEnvironment(t *testing.T) {
	for _, c := range []struct {
		field float64
		env   string
		want  float64
	}{{0, "", 1}, {2, "", 2}, {0, "0.5", 0.5}, {3, "2", 6}} {
		t.Setenv(waitScaleEnv, c.env)
		got, err := Harness{WaitScale: c.field}.waitScale()
		require.NoError(t, err, "WaitScale %v, %s=%q", c.field, waitScaleEnv, c.env)
		assert.InDelta(t, c.want, got, 1e-9, "WaitScale %v, %s=%q", c.field, waitScaleEnv, c.env)
	}
	t.Setenv(waitScaleEnv, "")
	_, err := Harness{WaitScale: -1}.waitScale()
	assert.ErrorContains(t, err, "Harness.WaitScale")
	for _, bad := range []string{"fast", "0", "-2", "Inf", "NaN"} {
		t.Setenv(waitScaleEnv, bad)
		_, err := Harness{}.waitScale()
		assert.ErrorContains(t, err, waitScaleEnv, "%s=%q", waitScaleEnv, bad)
	}
	assert.Equal(t, baseWait/5, scaled(baseWait, 0.2))
	assert.Equal(t, time.Duration(math.MaxInt64), scaled(baseWait, 1e12), "a huge scale is the longest wait, not a wrapped one")
}
