//go:build integration

package mq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dlqBroker is a broker with the dead-letter workflow, and its core for the checks.
type dlqBroker interface {
	Broker
	DeadLetterManager
}

var (
	_ DeadLetterManager = (*EmbeddedNATS)(nil)
	_ DeadLetterManager = (*ExternalNATS)(nil)
)

func TestEmbeddedNATS_DeadLetterWorkflow(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 1<<20))
	testDeadLetterWorkflow(t, e, e.core)
}

func TestExternalNATS_DeadLetterWorkflowAsTheRestrictedUser(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	testDeadLetterWorkflow(t, e, e.core)
}

// TestEmbeddedNATS_RedriveStopsAtTheBudget: a redrive the tenant's budget refuses is
// ErrQueueFull, and what it did not store stays parked.
func TestEmbeddedNATS_RedriveStopsAtTheBudget(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	park(t, e, "acme", "orders", 3)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1))
	n, err := e.Redrive(ctx, "acme", DeadLetterSelector{All: true})
	require.ErrorIs(t, err, ErrQueueFull)
	assert.Equal(t, 0, n)
	counts, err := e.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	assert.Equal(t, uint64(3), counts.Total, "nothing redriven, everything still parked")
}

// park parks n events of tenant's table as the worker's poison policy would, with data
// "<tenant>-<table>-<i>", an own header and the Mq-Dead-* ones.
func park(t *testing.T, b Broker, tenant TenantID, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	key, err := Topic{Tenant: tenant, Table: table}.Key()
	require.NoError(t, err)
	for i := range n {
		msg := &Message{
			Data:    fmt.Appendf(nil, "%s-%s-%02d", tenant, table, i),
			Headers: Headers{"X-Orig": {"v1", "v2"}},
			key:     key,
		}
		require.NoError(t, b.DeadLetter(ctx, msg,
			WithHeader(HeaderDeadReason, DeadReasonHandlerFailed), WithHeader(HeaderDeadAttempts, "5")))
	}
}

func parkedCount(t *testing.T, b Broker, tenant TenantID, table string) uint64 {
	t.Helper()
	c, err := b.DeadLetterCounts(testCtx(t), tenant, table)
	require.NoError(t, err)
	if table == "" {
		return c.Total
	}
	return c.Tables[table]
}

// partitionLastSeq is how many events tenant's partition ever stored.
func partitionLastSeq(t *testing.T, c *natsCore, tenant TenantID) uint64 {
	t.Helper()
	s, err := c.js.Stream(testCtx(t), c.partitions[Partition(tenant, c.topo.Partitions)])
	require.NoError(t, err)
	return s.CachedInfo().State.LastSeq
}

func testDeadLetterWorkflow(t *testing.T, b dlqBroker, c *natsCore) {
	ctx := testCtx(t)
	// Interleaved, so a page has to skip what is not acme's orders.
	for range 5 {
		park(t, b, "globex", "orders", 1)
		park(t, b, "acme", "other", 1)
	}
	park(t, b, "acme", "orders", 25)
	require.Equal(t, uint64(25), parkedCount(t, b, "acme", "orders"))

	// Paging: 25 in pages of 10, oldest first, each with its headers.
	var orders []*Message
	cursor, pages := "", 0
	for {
		page, next, err := b.DeadLetters(ctx, "acme", DeadLetterQuery{Table: "orders", Limit: 10, Cursor: cursor})
		require.NoError(t, err)
		pages++
		orders = append(orders, page...)
		if next == "" {
			break
		}
		require.Len(t, page, 10)
		cursor = next
		require.Less(t, pages, 5, "paging does not end")
	}
	require.Len(t, orders, 25)
	assert.LessOrEqual(t, pages, 4)
	for i, m := range orders {
		assert.Equal(t, fmt.Sprintf("acme-orders-%02d", i), string(m.Data), "oldest first")
		assert.Equal(t, Topic{Tenant: "acme", Table: "orders"}, m.Topic())
		assert.Equal(t, []string{"v1", "v2"}, m.Headers["X-Orig"])
		assert.Equal(t, DeadReasonHandlerFailed, m.Headers.Get(HeaderDeadReason))
		assert.NotContains(t, m.Headers, HeaderIdempotencyKey)
		assert.NotEmpty(t, m.ID)
		assert.False(t, m.Timestamp.IsZero())
	}
	all, next, err := b.DeadLetters(ctx, "acme", DeadLetterQuery{})
	require.NoError(t, err)
	assert.Empty(t, next)
	assert.Len(t, all, 30, "every table of acme")
	globex, _, err := b.DeadLetters(ctx, "globex", DeadLetterQuery{})
	require.NoError(t, err)
	require.Len(t, globex, 5)

	got, failed := consumeAll(t, b)

	// Redrive by id: exactly that one is stored again, with its own headers only.
	n, err := b.Redrive(ctx, "acme", DeadLetterSelector{IDs: []string{orders[3].ID}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	m := receive(t, got, failed)
	assert.Equal(t, "acme-orders-03", string(m.Data))
	assert.Equal(t, Topic{Tenant: "acme", Table: "orders"}, m.Topic())
	assert.Equal(t, []string{"v1", "v2"}, m.Headers["X-Orig"], "the original headers")
	for k := range m.Headers {
		assert.NotContains(t, k, "Mq-Dead-", "no dead-letter header goes back to ingest")
	}
	assert.Equal(t, uint64(24), parkedCount(t, b, "acme", "orders"), "gone from the dead-letter queue")
	_, err = b.Redrive(ctx, "acme", DeadLetterSelector{IDs: []string{orders[3].ID}})
	require.ErrorIs(t, err, ErrDeadLetterNotFound, "redriven already")

	// A redrive whose store went through but whose answer was lost (and so whose park
	// was not removed) is retried: the event is stored once.
	lost := orders[7]
	var seq uint64
	_, err = fmt.Sscan(lost.ID, &seq)
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, lost.Topic(), lost.Data, WithIdempotencyKey(redriveKey(c.deadLetters, seq))),
		"the first attempt's store")
	stored := partitionLastSeq(t, c, "acme")
	assert.Equal(t, "acme-orders-07", string(receive(t, got, failed).Data))
	n, err = b.Redrive(ctx, "acme", DeadLetterSelector{IDs: []string{lost.ID}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, stored, partitionLastSeq(t, c, "acme"), "the retried redrive stored nothing again")
	assert.Equal(t, uint64(23), parkedCount(t, b, "acme", "orders"))

	// Another tenant's parked event is never acme's to touch.
	_, err = b.Redrive(ctx, "acme", DeadLetterSelector{IDs: []string{globex[0].ID}})
	require.ErrorIs(t, err, ErrDeadLetterNotFound)
	_, err = b.DeleteDeadLetters(ctx, "acme", DeadLetterSelector{IDs: []string{globex[0].ID}})
	require.ErrorIs(t, err, ErrDeadLetterNotFound)

	// Delete removes only what it selects.
	n, err = b.DeleteDeadLetters(ctx, "acme", DeadLetterSelector{IDs: []string{orders[10].ID, orders[11].ID}})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	n, err = b.DeleteDeadLetters(ctx, "acme", DeadLetterSelector{Table: "other"})
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	assert.Equal(t, uint64(21), parkedCount(t, b, "acme", ""))
	assert.Equal(t, uint64(21), parkedCount(t, b, "acme", "orders"))

	// Redrive the rest of acme: globex's stay.
	n, err = b.Redrive(ctx, "acme", DeadLetterSelector{All: true})
	require.NoError(t, err)
	assert.Equal(t, 21, n)
	want := map[string]bool{}
	for i, m := range orders {
		if i != 3 && i != 7 && i != 10 && i != 11 {
			want[string(m.Data)] = true
		}
	}
	seen := map[string]bool{}
	for range 21 {
		seen[string(receive(t, got, failed).Data)] = true
	}
	assert.Equal(t, want, seen)
	assert.Equal(t, uint64(0), parkedCount(t, b, "acme", ""))
	assert.Equal(t, uint64(5), parkedCount(t, b, "globex", ""), "another tenant's parked events are untouched")

	// Bad input.
	_, _, err = b.DeadLetters(ctx, "", DeadLetterQuery{})
	assert.ErrorIs(t, err, ErrInvalidTenant)
	_, err = b.Redrive(ctx, "", DeadLetterSelector{All: true})
	assert.ErrorIs(t, err, ErrInvalidTenant)
	_, err = b.DeleteDeadLetters(ctx, "", DeadLetterSelector{All: true})
	assert.ErrorIs(t, err, ErrInvalidTenant)
	for _, id := range []string{"999999", "0", "x", ""} {
		_, err = b.Redrive(ctx, "globex", DeadLetterSelector{IDs: []string{id}})
		assert.ErrorIs(t, err, ErrDeadLetterNotFound, "id %q", id)
	}
	_, err = b.Redrive(ctx, "globex", DeadLetterSelector{})
	assert.ErrorIs(t, err, ErrInvalidConfig, "no selection")
	_, _, err = b.DeadLetters(ctx, "globex", DeadLetterQuery{Cursor: "nope"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, _, err = b.DeadLetters(ctx, "globex", DeadLetterQuery{Limit: -1})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.Equal(t, uint64(5), parkedCount(t, b, "globex", ""))
	var nilCtx context.Context
	_, _, err = b.DeadLetters(nilCtx, "globex", DeadLetterQuery{})
	assert.Error(t, err)
}

// TestEmbeddedNATS_ARedriveKilledHalfWayAndRerunStoresEachOnce: 100 parked events of
// two tables; the redrive of one table dies right after a store (before that park is
// removed) and is run again while the worker runs: every event of that table reaches
// the partition once and the worker once, none stays parked, the other table is
// untouched.
func TestEmbeddedNATS_ARedriveKilledHalfWayAndRerunStoresEachOnce(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for range 50 {
		park(t, e, "acme", "orders", 1)
		park(t, e, "acme", "users", 1)
	}
	got, failed := consumeAll(t, e)
	before := partitionLastSeq(t, e.core, "acme")

	calls := 0
	killed := errors.New("killed")
	dying := func(ctx context.Context, topic Topic, data []byte, opts ...PublishOpt) error {
		if err := e.Publish(ctx, topic, data, opts...); err != nil {
			return err
		}
		if calls++; calls == 20 {
			return killed // stored, the process dies before removing the park
		}
		return nil
	}
	n, err := e.core.redrive(ctx, "acme", DeadLetterSelector{Table: "orders"}, dying)
	require.ErrorIs(t, err, killed)
	assert.Equal(t, 19, n)
	assert.Equal(t, uint64(31), parkedCount(t, e, "acme", "orders"), "the 20th stored but still parked")

	n, err = e.Redrive(ctx, "acme", DeadLetterSelector{Table: "orders"})
	require.NoError(t, err)
	assert.Equal(t, 31, n)
	assert.Equal(t, before+50, partitionLastSeq(t, e.core, "acme"), "each event of orders stored once")
	assert.Equal(t, uint64(0), parkedCount(t, e, "acme", "orders"))
	assert.Equal(t, uint64(50), parkedCount(t, e, "acme", "users"), "the other table is untouched")
	for range 50 {
		m := receive(t, got, failed)
		assert.Equal(t, "orders", m.Topic().Table)
	}
}

// TestEmbeddedNATS_TwoRedrivesOfOneTableAtOnceStoreEachOnceAndNeitherFails: two
// operators (or a retried mqctl dlq redrive) redrive the same table at the same time.
// A park the other call removed first is no error for either; together they count
// each event once, each is stored once, and nothing stays parked.
func TestEmbeddedNATS_TwoRedrivesOfOneTableAtOnceStoreEachOnceAndNeitherFails(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	const parks = 40
	park(t, e, "acme", "orders", parks)
	before := partitionLastSeq(t, e.core, "acme")

	type result struct {
		n   int
		err error
	}
	results := make(chan result, 2)
	start := make(chan struct{})
	for range 2 {
		go func() {
			<-start
			n, err := e.Redrive(ctx, "acme", DeadLetterSelector{Table: "orders"})
			results <- result{n, err}
		}()
	}
	close(start)
	total := 0
	for range 2 {
		r := <-results
		require.NoError(t, r.err, "a redrive beside another")
		total += r.n
	}
	assert.Equal(t, parks, total, "the two calls count each event once")
	assert.Equal(t, before+parks, partitionLastSeq(t, e.core, "acme"), "each event stored once")
	assert.Equal(t, uint64(0), parkedCount(t, e, "acme", "orders"), "nothing stays parked")
}

// TestEmbeddedNATS_ARedrivenEventKeepsItsMessageID: the redrive stores the event under a
// key of its park (a retried redrive stores it once), yet its deliveries carry the ID
// the first ones did, keyed or not, so a handler's idempotent writes still match.
func TestEmbeddedNATS_ARedrivenEventKeepsItsMessageID(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "orders"}
	require.NoError(t, e.Publish(ctx, topic, []byte("keyed"), WithIdempotencyKey("order-1")))
	require.NoError(t, e.Publish(ctx, topic, []byte("unkeyed")))
	c, err := e.CreateConsumer(ctx, ConsumerConfig{MaxDeliveries: 1})
	require.NoError(t, err)
	type delivery struct{ data, id, header string }
	got := make(chan delivery, 8)
	var redriven atomic.Bool
	stop, _, err := c.Consume(func(m *Message) error {
		got <- delivery{string(m.Data), m.ID, m.Headers.Get(HeaderEventID)}
		if !redriven.Load() {
			return errors.New("poison, until redriven")
		}
		return m.Ack()
	}, 0)
	require.NoError(t, err)
	defer stop()
	first := map[string]string{}
	for range 2 {
		d := <-got
		first[d.data] = d.id
	}
	assert.Equal(t, "order-1", first["keyed"])
	require.Eventually(t, func() bool {
		counts, err := e.DeadLetterCounts(ctx, "acme", "")
		return err == nil && counts.Total == 2
	}, 20*time.Second, 20*time.Millisecond, "both were parked")
	redriven.Store(true)
	n, err := e.Redrive(ctx, "acme", DeadLetterSelector{All: true})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for range 2 {
		select {
		case d := <-got:
			assert.Equal(t, first[d.data], d.id, "the redriven %q's ID", d.data)
			assert.Empty(t, d.header, "the broker's own header shows in Headers, where a host could copy it to another event")
		case <-ctx.Done():
			t.Fatal("a redriven event never came")
		}
	}
}

// TestEmbeddedNATS_CloseUnderDeadLetterReadsEndsEachWithSuccessOrErrClosed: a read of
// the dead-letter queue that Close cuts off is ErrClosed, as a call after Close is;
// it was ErrUnavailable, which tells a host to retry a broker that is gone.
func TestEmbeddedNATS_CloseUnderDeadLetterReadsEndsEachWithSuccessOrErrClosed(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, t.TempDir())
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	for i := range 30 {
		require.NoError(t, e.DeadLetter(ctx, NewMessage(ctx, Topic{Tenant: "acme", Table: "t" + strconv.Itoa(i%3)}, []byte("x"))))
	}
	reads := map[string]func() error{
		"DeadLetters": func() error { _, _, err := e.DeadLetters(ctx, "acme", DeadLetterQuery{Limit: 5}); return err },
		"DeadLetters of a table": func() error {
			_, _, err := e.DeadLetters(ctx, "acme", DeadLetterQuery{Table: "t2", Limit: 5})
			return err
		},
		"DeadLetterCounts": func() error { _, err := e.DeadLetterCounts(ctx, "acme", ""); return err },
		"Redrive of an id never parked": func() error {
			_, err := e.Redrive(ctx, "acme", DeadLetterSelector{IDs: []string{"999999"}})
			if errors.Is(err, ErrDeadLetterNotFound) {
				return nil
			}
			return err
		},
	}
	var wg sync.WaitGroup
	var calls atomic.Int64
	for name, read := range reads {
		for range 4 {
			wg.Go(func() {
				for {
					err := read()
					if err == nil {
						calls.Add(1)
						continue
					}
					if !errors.Is(err, ErrClosed) {
						t.Errorf("%s during Close: %v, want success or ErrClosed", name, err)
					}
					return
				}
			})
		}
	}
	require.Eventually(t, func() bool { return calls.Load() >= 200 }, 10*time.Second, time.Millisecond)
	require.NoError(t, e.Close())
	wg.Wait()
}

// TestDeadLetterSelector_TwoWaysAtOnceAreRefusedAndNothingIsDone: All with IDs acted on
// the IDs alone, silently, while the selector's contract is exactly one way.
func TestDeadLetterSelector_TwoWaysAtOnceAreRefusedAndNothingIsDone(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	park(t, e, "acme", "orders", 2)
	page, _, err := e.DeadLetters(ctx, "acme", DeadLetterQuery{})
	require.NoError(t, err)
	id := []string{page[0].ID}
	for name, sel := range map[string]DeadLetterSelector{
		"All and IDs":        {All: true, IDs: id},
		"All and a Table":    {All: true, Table: "orders"},
		"a Table and IDs":    {Table: "orders", IDs: id},
		"All, Table and IDs": {All: true, Table: "orders", IDs: id},
	} {
		n, err := e.DeleteDeadLetters(ctx, "acme", sel)
		assert.ErrorIs(t, err, ErrInvalidConfig, "delete, %s", name)
		assert.Zero(t, n, "delete, %s", name)
		n, err = e.Redrive(ctx, "acme", sel)
		assert.ErrorIs(t, err, ErrInvalidConfig, "redrive, %s", name)
		assert.Zero(t, n, "redrive, %s", name)
	}
	assert.Equal(t, uint64(2), parkedCount(t, e, "acme", ""), "nothing removed")
}
