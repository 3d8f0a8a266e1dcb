package mqtest

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

func deadLetterWorkflowCases() []testCase {
	return []testCase{
		{
			name: "DeadLetterManagerRedrivesByIDWithTheOriginalHeadersAndDeletes",
			proves: "A broker that implements mq.DeadLetterManager pages a tenant's parks oldest " +
				"first (a page that ends the list gives no next cursor), redrives one by id to its own topic with its own headers (no " +
				"Mq-Dead-* one), after which it is no longer parked, and deletes the rest; " +
				"another tenant's park is never touched. Skipped for a broker without the " +
				"interface.",
			publishes: "parks on acme/orders and globex/orders",
			run:       redriveByIDAndDelete,
		},
		{
			name: "ARedrivenEventKeepsItsMessageID",
			proves: "An event a handler parked (DeadLetter, then Ack) and a redrive brought back " +
				"is delivered with the Message.ID of its first delivery, keyed or not, so a " +
				"handler's writes made idempotent by it still match. Skipped for a broker " +
				"without mq.DeadLetterManager.",
			publishes: "a keyed and an unkeyed event on acme/orders, parked and redriven",
			run:       redriveKeepsID,
		},
		{
			name: "DeadLetterManagerTakesAnIDGivenTwiceAsOneEvent",
			proves: "A selector naming one park twice redrives or deletes it once, counts it " +
				"once and is no error (a retried or merged id list is common). Skipped for " +
				"a broker without mq.DeadLetterManager.",
			publishes: "2 parks on acme/orders",
			run:       sameIDTwice,
		},
	}
}

func redriveKeepsID(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	tp := topic(Acme, "orders", "")
	e.publish(tp, "keyed", mq.WithIdempotencyKey("order-7"))
	e.publish(tp, "unkeyed")
	var parking atomic.Bool
	parking.Store(true)
	c := e.consume(mq.ConsumerConfig{}, func(m *mq.Message) error {
		if parking.Load() {
			if err := e.b.DeadLetter(e.ctx, m); err != nil {
				return err
			}
		}
		return e.ackEach(m)
	})
	first := map[string]string{}
	for _, d := range next(t, c.deliveries, 2) {
		first[d.data] = d.msg.ID
	}
	require.Equal(t, "order-7", first["keyed"], "a keyed event's ID is its key")
	require.NotEmpty(t, first["unkeyed"], "an unkeyed event's ID")
	assertCounts(t, map[string]uint64{"orders": 2}, 2, e.counts(Acme, ""), "both parked")
	parking.Store(false)
	n, err := dm.Redrive(e.ctx, Acme, mq.DeadLetterSelector{All: true})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, d := range next(t, c.deliveries, 2) {
		assert.Equal(t, first[d.data], d.msg.ID, "the redriven %q's ID", d.data)
	}
}

func sameIDTwice(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	tp := topic(Acme, "orders", "")
	e.park(tp, "redriven")
	e.park(tp, "deleted")
	page, _, err := dm.DeadLetters(e.ctx, Acme, mq.DeadLetterQuery{})
	require.NoError(t, err)
	require.Len(t, page, 2)

	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	n, err := dm.Redrive(e.ctx, Acme, mq.DeadLetterSelector{IDs: []string{page[0].ID, page[0].ID}})
	require.NoError(t, err, "redrive of one id given twice")
	assert.Equal(t, 1, n, "redriven")
	assert.Equal(t, "redriven", next1(t, c.deliveries).data)
	n, err = dm.DeleteDeadLetters(e.ctx, Acme, mq.DeadLetterSelector{IDs: []string{page[1].ID, page[1].ID}})
	require.NoError(t, err, "delete of one id given twice")
	assert.Equal(t, 1, n, "deleted")
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme: nothing parked")
	none(t, c.deliveries)
}

func redriveByIDAndDelete(t *testing.T, h Harness) {
	e := setup(t, h)
	dm := deadLetterManager(t, e)
	tp := topic(Acme, "orders", "")
	for _, d := range []string{"first", "second", "third"} {
		e.park(tp, d, mq.WithHeader("X-Orig", d), mq.WithHeader(mq.HeaderDeadReason, mq.DeadReasonHandlerFailed))
	}
	e.park(topic(Globex, "orders", ""), "foreign")

	page, next, err := dm.DeadLetters(e.ctx, Acme, mq.DeadLetterQuery{Limit: 2})
	require.NoError(t, err)
	require.Len(t, page, 2)
	require.NotEmpty(t, next)
	rest, last, err := dm.DeadLetters(e.ctx, Acme, mq.DeadLetterQuery{Limit: 2, Cursor: next})
	require.NoError(t, err)
	assert.Empty(t, last, "the second page of 2 ended acme's 3 parks, so it gives no next cursor (one would lead to a page of nothing)")
	whole, after, err := dm.DeadLetters(e.ctx, Acme, mq.DeadLetterQuery{Limit: 3})
	require.NoError(t, err)
	assert.Len(t, whole, 3)
	assert.Empty(t, after, "a full page that ends the list gives no cursor to a page of nothing")
	page = append(page, rest...)
	require.Len(t, page, 3)
	for i, d := range []string{"first", "second", "third"} {
		assert.Equal(t, d, string(page[i].Data), "oldest first")
		assert.Equal(t, mq.DeadReasonHandlerFailed, page[i].Headers.Get(mq.HeaderDeadReason))
	}

	c := e.consume(mq.ConsumerConfig{}, e.ackEach)
	n, err := dm.Redrive(e.ctx, Acme, mq.DeadLetterSelector{IDs: []string{page[1].ID}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	got := next1(t, c.deliveries)
	assert.Equal(t, "second", got.data)
	assert.Equal(t, tp, got.topic)
	assert.Equal(t, "second", got.msg.Headers.Get("X-Orig"))
	assert.Empty(t, got.msg.Headers.Get(mq.HeaderDeadReason), "a redriven event carries no Mq-Dead-* header")
	assertCounts(t, map[string]uint64{"orders": 2}, 2, e.counts(Acme, ""), "acme after the redrive")

	_, err = dm.Redrive(e.ctx, Acme, mq.DeadLetterSelector{IDs: []string{page[1].ID}})
	assert.ErrorIs(t, err, mq.ErrDeadLetterNotFound, "redriven already")
	n, err = dm.DeleteDeadLetters(e.ctx, Acme, mq.DeadLetterSelector{All: true})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assertCounts(t, nil, 0, e.counts(Acme, ""), "acme after the delete")
	assertCounts(t, map[string]uint64{"orders": 1}, 1, e.counts(Globex, ""), "globex")
	none(t, c.deliveries)
}

// deadLetterManager is e's broker as an mq.DeadLetterManager; the case is skipped for a
// broker without it.
func deadLetterManager(t *testing.T, e *env) mq.DeadLetterManager {
	t.Helper()
	return optional[mq.DeadLetterManager](t, e.b)
}

func next1(t *testing.T, ch <-chan delivery) delivery {
	t.Helper()
	return next(t, ch, 1)[0]
}
