package mqtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// deadLetterQueryCases hold mq.DeadLetterManager to what its query and selector say:
// a Table narrows to that table, and a query it cannot serve is an error, never a
// page of something else.
func deadLetterQueryCases() []testCase {
	return []testCase{
		{
			name: "DeadLetterManagerTableNarrowsAPageAndASelectorToThatTableEveryScope",
			proves: "DeadLetterQuery.Table pages that table's parks alone, every scope of it " +
				"included, oldest first; a selector's Table redrives or deletes that table's " +
				"parks of the tenant and leaves the other tables' and other tenants' parked. " +
				"Skipped for a broker without mq.DeadLetterManager.",
			publishes: "parks on acme/orders, acme/orders/s, acme/users and globex/users",
			run:       deadLetterTableFilter,
		},
		{
			name: "DeadLettersRefusesABadCursorOrLimitAndAnInvalidTenant",
			proves: "DeadLetters given a cursor it never returned or a negative limit returns an " +
				"error wrapping mq.ErrInvalidConfig, rather than a page from the oldest; " +
				"given an invalid tenant, one wrapping mq.ErrInvalidTenant, rather than an " +
				"empty page. Skipped for a broker without mq.DeadLetterManager.",
			publishes: "1 park on acme/orders",
			run:       deadLettersRefusesBadQueries,
		},
	}
}

func deadLetterTableFilter(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	e.park(topic(Acme, "orders", ""), "order 1")
	e.park(topic(Acme, "users", ""), "user 1")
	e.park(topic(Acme, "orders", "s"), "order 2")
	e.park(topic(Acme, "users", ""), "user 2")
	e.park(topic(Globex, "users", ""), "globex's user")

	for table, want := range map[string][]string{"orders": {"order 1", "order 2"}, "users": {"user 1", "user 2"}} {
		page, next, err := dm.DeadLetters(e.ctx, Acme, mq.DeadLetterQuery{Table: table})
		require.NoError(t, err, "DeadLetters of acme, table %s", table)
		assert.Equal(t, want, parkDatas(page), "DeadLetterQuery.Table %q must page that table's parks alone, every scope, oldest first", table)
		assert.Empty(t, next, "DeadLetters of acme, table %s: the page held every park of the table, so no next cursor", table)
	}

	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	n, err := dm.Redrive(e.ctx, Acme, mq.DeadLetterSelector{Table: "users"})
	require.NoError(t, err, "Redrive of acme's table users")
	assert.Equal(t, 2, n, "Redrive of acme's table users: its 2 parks, and no other table's or tenant's")
	assert.Equal(t, []string{"user 1", "user 2"}, datas(next(t, c.deliveries, 2)), "Redrive of acme's table users, delivered")
	assertCounts(t, map[string]uint64{"orders": 2}, 2, e.counts(Acme, ""), "acme, after redriving table users: orders must stay parked")
	assertCounts(t, map[string]uint64{"users": 1}, 1, e.counts(Globex, ""), "globex, after acme's table users was redriven")

	e.park(topic(Acme, "users", ""), "user 3")
	n, err = dm.DeleteDeadLetters(e.ctx, Acme, mq.DeadLetterSelector{Table: "orders"})
	require.NoError(t, err, "DeleteDeadLetters of acme's table orders")
	assert.Equal(t, 2, n, "DeleteDeadLetters of acme's table orders: its 2 parks, every scope, and no other table's")
	assertCounts(t, map[string]uint64{"users": 1}, 1, e.counts(Acme, ""), "acme, after deleting table orders: users must stay parked")
	assertCounts(t, map[string]uint64{"users": 1}, 1, e.counts(Globex, ""), "globex, after acme's table orders was deleted")
	noneBecause(t, c.deliveries, quiet, "only table users was redriven, and it was delivered")
}

func deadLettersRefusesBadQueries(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	e.park(topic(Acme, "orders", ""), "parked")
	// A cursor is opaque, but no broker's is this: it has spaces and a bang.
	for _, q := range []mq.DeadLetterQuery{{Cursor: "not a cursor DeadLetters returned!"}, {Limit: -1}} {
		page, _, err := dm.DeadLetters(e.ctx, Acme, q)
		assert.ErrorIs(t, err, mq.ErrInvalidConfig, "DeadLetters with %+v: a bad cursor or limit must be refused, not served", q)
		assert.Empty(t, parkDatas(page), "DeadLetters with %+v: a refused query returns no page", q)
	}
	for _, tenant := range []mq.TenantID{"", "Not.A.Tenant"} {
		_, _, err := dm.DeadLetters(e.ctx, tenant, mq.DeadLetterQuery{})
		assert.ErrorIs(t, err, mq.ErrInvalidTenant, "DeadLetters of tenant %q: an invalid tenant must be refused, not given an empty page", tenant)
	}
}

// parkDatas is the data of each parked event of page, in order.
func parkDatas(page []*mq.Message) []string {
	var ds []string
	for _, m := range page {
		ds = append(ds, string(m.Data))
	}
	return ds
}
