package mqtest

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// deadLetterTenantCases hold mq.DeadLetterManager to its tenant boundary: an operator
// acting for one tenant names parks by the IDs DeadLetters returned, and an ID that
// reached them from another tenant's page must not act on that tenant's parks.
func deadLetterTenantCases() []testCase {
	return []testCase{
		{
			name: "DeadLetterManagerRefusesAnotherTenantsParkIDAndActsOnNothing",
			proves: "Redrive and DeleteDeadLetters for acme, given the ID of a park of globex's " +
				"(alone, or after one of acme's own), return an error wrapping " +
				"mq.ErrDeadLetterNotFound and a count of 0, and redrive or remove nothing: " +
				"both parks stay, and nothing is delivered. Skipped for a broker without " +
				"the interface, or whose park IDs are per tenant so that globex's names a " +
				"park of acme's too.",
			publishes: "1 park on acme/orders and 1 on globex/orders",
			run:       foreignParkIDRefused,
		},
	}
}

func foreignParkIDRefused(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	e.park(topic(Acme, "orders", ""), "acme's")
	e.park(topic(Globex, "orders", ""), "globex's")
	own := parkIDs(t, e, dm, Acme)
	foreign := parkIDs(t, e, dm, Globex)
	require.Len(t, own, 1, "acme's parks")
	require.Len(t, foreign, 1, "globex's parks")
	if slices.Contains(own, foreign[0]) {
		t.Skipf("globex's park ID %q names a park of acme's too: IDs are per tenant, so none of acme's is foreign", foreign[0])
	}

	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	for _, op := range []struct {
		name string
		do   func(mq.TenantID, mq.DeadLetterSelector) (int, error)
	}{
		{"Redrive", func(tn mq.TenantID, sel mq.DeadLetterSelector) (int, error) { return dm.Redrive(e.ctx, tn, sel) }},
		{"DeleteDeadLetters", func(tn mq.TenantID, sel mq.DeadLetterSelector) (int, error) {
			return dm.DeleteDeadLetters(e.ctx, tn, sel)
		}},
	} {
		for _, ids := range [][]string{foreign, {own[0], foreign[0]}} {
			n, err := op.do(Acme, mq.DeadLetterSelector{IDs: ids})
			assert.ErrorIs(t, err, mq.ErrDeadLetterNotFound,
				"%s for acme of IDs %q, globex's among them: an ID that is not the tenant's park must be refused as not found", op.name, ids)
			assert.Zero(t, n, "%s for acme of IDs %q: an ID that is not the tenant's park means nothing is done", op.name, ids)
		}
	}
	assertCounts(t, map[string]uint64{"orders": 1}, 1, e.counts(Acme, ""), "acme's park, after calls refused for a foreign ID")
	assertCounts(t, map[string]uint64{"orders": 1}, 1, e.counts(Globex, ""), "globex's park, after acme's calls named it")
	assert.Equal(t, foreign, parkIDs(t, e, dm, Globex), "globex's park, after acme's calls named it")
	noneBecause(t, c.deliveries, quiet, "every Redrive named a foreign ID, so nothing may be redriven")
}

// parkIDs lists the IDs of tenant's parks, oldest first, from one page.
func parkIDs(t *testing.T, e *env, dm mq.DeadLetterManager, tenant mq.TenantID) []string {
	t.Helper()
	page, _, err := dm.DeadLetters(e.ctx, tenant, mq.DeadLetterQuery{})
	require.NoError(t, err, "DeadLetters of %s", tenant)
	var ids []string
	for _, m := range page {
		ids = append(ids, m.ID)
	}
	return ids
}
