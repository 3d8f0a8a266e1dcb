package mqtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func purgeCases() []testCase {
	return []testCase{
		{
			name: "PurgeAcked",
			proves: "With PurgesAcked, a cutoff after everything removes the acked events (an " +
				"unacked one survives any cutoff) and reports true; without it, nothing is " +
				"removed and it reports false.",
			flags:     []string{"PurgesAcked"},
			publishes: "events on acme/p and other tenants' p",
			run:       purgeAcked,
		},
		{
			name: "PurgeAckedKeepsAckedEventsStoredAfterTheCutoff",
			proves: "A cutoff before the events were stored keeps them all, acked or not, and " +
				"reports nothing removed.",
			publishes: "events on acme/p and other tenants' p",
			run:       purgeAckedKeepsRecent,
		},
		{
			name:      "PurgeAckedAppliesEachTenantsOwnCutoff",
			proves:    "Each tenant is purged at its own cutoff.",
			flags:     []string{"PurgesAcked"},
			publishes: "events on acme/p, globex/p and other tenants' p",
			run:       purgeAckedPerTenant,
		},
		{
			name:      "PurgeAckedTenantAbsentFromTheMapKeepsNothingAcked",
			proves:    "A tenant missing from the map keeps nothing it acknowledged.",
			flags:     []string{"PurgesAcked"},
			publishes: "events on acme/p, globex/p and other tenants' p",
			run:       purgeAckedAbsentTenant,
		},
		{
			name:      "PurgeAckedUnknownConsumer",
			proves:    "A consumer name the broker cannot map is ErrConsumerNotFound.",
			publishes: "nothing",
			run:       purgeAckedUnknownConsumer,
		},
		{
			name: "PurgeAckedRefusesACutoffForAnInvalidTenantAndRemovesNothing",
			proves: "A key of the cutoff map that is not a valid tenant (a misspelt \"Acme\", " +
				"an empty one) is ErrInvalidTenant, and every acked event of acme stays, " +
				"though the misspelling left acme absent from the map.",
			publishes: "events on acme/p and other tenants' p",
			run:       purgeAckedInvalidTenant,
		},
		{
			name: "PurgeAckedCutoffBeforeAnyStorableTimeKeepsAllAndAfterItPurgesAllAcked",
			proves: "A cutoff far in the past (before any time a broker can store) removes " +
				"nothing; one far in the future is \"now or later\": with PurgesAcked it " +
				"removes everything acknowledged, never the reverse by an overflow.",
			flags:     []string{"PurgesAcked"},
			publishes: "events on acme/p and other tenants' p",
			run:       purgeAckedOutOfRange,
		},
	}
}

var purgeEvents = []string{"a", "b", "c", "left"}

// ackedButLeft publishes a, b, c and "left" on each tenant's table "p", acks all but
// "left" through Durable (confirmed), and waits until all are replayable.
func (e *env) ackedButLeft(tenants ...mq.TenantID) {
	e.t.Helper()
	for _, id := range tenants {
		for _, d := range purgeEvents {
			e.publish(topic(id, "p", ""), d)
		}
	}
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if string(m.Data) == "left" {
			return nil
		}
		return e.ackEach(m)
	})
	got := byTenant(next(e.t, c.deliveries, len(purgeEvents)*len(tenants)))
	for _, id := range tenants {
		require.Equal(e.t, purgeEvents, got[id], "deliveries of %s", id)
		e.replayReaches(topic(id, "p", ""), len(purgeEvents))
	}
}

func (e *env) purge(olderThan map[mq.TenantID]time.Time) bool {
	e.t.Helper()
	purged, err := e.b.PurgeAcked(e.ctx, Durable, olderThan)
	require.NoError(e.t, err, "purge acked")
	return purged
}

func purgeAcked(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme)
	future := time.Now().Add(time.Hour)
	purged := e.purge(map[mq.TenantID]time.Time{Acme: future, Globex: future})
	tp := topic(Acme, "p", "")
	if h.Caps.PurgesAcked {
		assert.True(t, purged, "Caps.PurgesAcked: PurgeAcked reported nothing removed")
		e.replayEventually(tp, time.Time{}, []string{"left"})
		return
	}
	assert.False(t, purged, "Caps.PurgesAcked is false, yet PurgeAcked reported a removal")
	e.replayEventually(tp, time.Time{}, purgeEvents)
	time.Sleep(quiet)
	assert.Equal(t, purgeEvents, e.replay(tp, time.Time{}), "Caps.PurgesAcked is false, yet events left the history")
}

func purgeAckedKeepsRecent(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme)
	past := time.Now().Add(-time.Hour)
	assert.False(t, e.purge(map[mq.TenantID]time.Time{Acme: past, Globex: past}), "a cutoff before everything removed something")
	time.Sleep(quiet)
	assert.Equal(t, purgeEvents, e.replay(topic(Acme, "p", ""), time.Time{}))
}

func purgeAckedPerTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme, Globex)
	purged := e.purge(map[mq.TenantID]time.Time{Acme: time.Now().Add(time.Hour), Globex: time.Now().Add(-time.Hour)})
	assert.Equal(t, h.Caps.PurgesAcked, purged, "reported removal, Caps.PurgesAcked %v", h.Caps.PurgesAcked)
	if h.Caps.PurgesAcked {
		e.replayEventually(topic(Acme, "p", ""), time.Time{}, []string{"left"})
	} else {
		e.replayEventually(topic(Acme, "p", ""), time.Time{}, purgeEvents)
	}
	time.Sleep(quiet)
	assert.Equal(t, purgeEvents, e.replay(topic(Globex, "p", ""), time.Time{}), "globex, whose cutoff is before its events")
}

func purgeAckedAbsentTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme, Globex)
	purged := e.purge(map[mq.TenantID]time.Time{Globex: time.Now().Add(-time.Hour)})
	assert.Equal(t, h.Caps.PurgesAcked, purged, "reported removal, Caps.PurgesAcked %v", h.Caps.PurgesAcked)
	if h.Caps.PurgesAcked {
		e.replayEventually(topic(Acme, "p", ""), time.Time{}, []string{"left"})
	} else {
		e.replayEventually(topic(Acme, "p", ""), time.Time{}, purgeEvents)
	}
	assert.Equal(t, purgeEvents, e.replay(topic(Globex, "p", ""), time.Time{}), "globex, whose cutoff is before its events")
	if h.Caps.PurgesAcked {
		// nil map: every tenant is absent, so globex's acked events go too.
		assert.True(t, e.purge(nil), "a nil map purges every tenant's acked events")
		e.replayEventually(topic(Globex, "p", ""), time.Time{}, []string{"left"})
	}
}

func purgeAckedUnknownConsumer(t *testing.T, h Harness) {
	e := setup(t, h)
	_, err := e.b.PurgeAcked(e.ctx, "no-such-consumer", nil)
	assert.ErrorIs(t, err, mq.ErrConsumerNotFound)
	_, err = e.b.PurgeAcked(e.ctx, "no-such-consumer", map[mq.TenantID]time.Time{Acme: time.Now()})
	assert.ErrorIs(t, err, mq.ErrConsumerNotFound)
	_, err = e.b.PurgeAcked(e.ctx, Durable, nil)
	assert.NoError(t, err, "the worker's own durable")
}

func purgeAckedInvalidTenant(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme)
	for _, bad := range []mq.TenantID{"Acme", ""} {
		purged, err := e.b.PurgeAcked(e.ctx, Durable, map[mq.TenantID]time.Time{bad: time.Now().Add(time.Hour)})
		assert.ErrorIs(t, err, mq.ErrInvalidTenant, "a cutoff for %q", bad)
		assert.False(t, purged, "a cutoff for %q removes nothing", bad)
	}
	assert.Equal(t, purgeEvents, e.replay(topic(Acme, "p", ""), time.Time{}), "acme keeps every event")
}

func purgeAckedOutOfRange(t *testing.T, h Harness) {
	e := setup(t, h)
	e.ackedButLeft(Acme)
	tp := topic(Acme, "p", "")
	for _, past := range []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC),
	} {
		assert.False(t, e.purge(map[mq.TenantID]time.Time{Acme: past}), "a cutoff of %v removed something", past)
		assert.Equal(t, purgeEvents, e.replay(tp, time.Time{}), "after a cutoff of %v", past)
	}
	future := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	purged := e.purge(map[mq.TenantID]time.Time{Acme: future})
	assert.Equal(t, h.Caps.PurgesAcked, purged, "a cutoff of %v reported removal, Caps.PurgesAcked %v", future, h.Caps.PurgesAcked)
	if h.Caps.PurgesAcked {
		e.replayEventually(tp, time.Time{}, []string{"left"})
		return
	}
	assert.Equal(t, purgeEvents, e.replay(tp, time.Time{}), "Caps.PurgesAcked is false, yet events left the history")
}
