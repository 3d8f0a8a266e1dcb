package mq

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dlqWant compares a deadLetterTables result with want, reporting both on a mismatch.
func dlqWant(t *testing.T, got, want map[string]uint64) {
	t.Helper()
	if got == nil {
		t.Fatalf("deadLetterTables returned a nil map")
	}
	if !maps.Equal(got, want) {
		t.Errorf("deadLetterTables = %v, want %v", got, want)
	}
}

func TestDeadLetterTables_EveryScopeCountsUnderItsTable(t *testing.T) {
	subs := subjects{prefix: "wh", n: 4}
	perSubject := map[string]uint64{
		"wh.dlq.acme.orders":             2,
		"wh.dlq.acme.orders.org_1":       3,
		"wh.dlq.acme.orders.org%2E2":     4,
		"wh.dlq.acme.clicks.x":           1,
		"wh.dlq.acme.default%2Eclicks":   6,
		"wh.dlq.acme.%C3%A9.%2A":         8,
		"wh.dlq.acme.default%2Eclicks.s": 10,
	}
	dlqWant(t, deadLetterTables(perSubject, subs, ""), map[string]uint64{
		"orders":         9,
		"clicks":         1,
		"default.clicks": 16,
		"é":              8,
	})
}

func TestDeadLetterTables_TheTableFilterKeepsAllOfThatTablesScopes(t *testing.T) {
	subs := subjects{prefix: "wh", n: 4}
	perSubject := map[string]uint64{
		"wh.dlq.acme.orders":        2,
		"wh.dlq.acme.orders.org_1":  3,
		"wh.dlq.acme.orders.org_2":  4,
		"wh.dlq.acme.clicks":        1,
		"wh.dlq.acme.clicks.orders": 5, // scope "orders" of table "clicks"
		"wh.dlq.acme.orders2":       7,
	}
	dlqWant(t, deadLetterTables(perSubject, subs, "orders"), map[string]uint64{"orders": 9})
	dlqWant(t, deadLetterTables(perSubject, subs, "clicks"), map[string]uint64{"clicks": 6})
	dlqWant(t, deadLetterTables(perSubject, subs, "missing"), map[string]uint64{})
}

func TestDeadLetterTables_ADottedTableNeverSharesACountWithATableAndScope(t *testing.T) {
	subs := subjects{prefix: "wh", n: 4}
	dotted, err := Topic{Tenant: "acme", Table: "a.b"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := Topic{Tenant: "acme", Table: "a", Scope: "b"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if subs.deadLetter(dotted) != "wh.dlq.acme.a%2Eb" || subs.deadLetter(scoped) != "wh.dlq.acme.a.b" {
		t.Fatalf("dead-letter subjects %q and %q", subs.deadLetter(dotted), subs.deadLetter(scoped))
	}
	perSubject := map[string]uint64{
		subs.deadLetter(dotted): 5,
		subs.deadLetter(scoped): 7,
	}
	dlqWant(t, deadLetterTables(perSubject, subs, ""), map[string]uint64{"a.b": 5, "a": 7})
	dlqWant(t, deadLetterTables(perSubject, subs, "a.b"), map[string]uint64{"a.b": 5})
	dlqWant(t, deadLetterTables(perSubject, subs, "a"), map[string]uint64{"a": 7})
}

func TestDeadLetterTables_AForeignSubjectCountsUnderItsWholeTail(t *testing.T) {
	subs := subjects{prefix: "wh", n: 4}
	perSubject := map[string]uint64{
		"wh.dlq.Bad.x":          1, // our prefix, a tail Key could not have written
		"wh.dlq.a.b.c.d":        2,
		"wh.dlq.acme.%2e":       3,
		"other.dlq.acme.t.s":    4, // another prefix: the whole subject
		"wh.other.acme.t":       5,
		"wh.dlq.acme.t":         6,
		"wh.ingest.01.acme.t.s": 7,
	}
	dlqWant(t, deadLetterTables(perSubject, subs, ""), map[string]uint64{
		"Bad.x":                 1,
		"a.b.c.d":               2,
		"acme.%2e":              3,
		"other.dlq.acme.t.s":    4,
		"wh.other.acme.t":       5,
		"t":                     6,
		"wh.ingest.01.acme.t.s": 7,
	})
	dlqWant(t, deadLetterTables(perSubject, subs, "Bad.x"), map[string]uint64{"Bad.x": 1})
}

func TestDeadLetterTables_ReadsTheKeyUnderItsOwnPrefix(t *testing.T) {
	subs := subjects{prefix: "acme-wh", n: 4}
	perSubject := map[string]uint64{
		"acme-wh.dlq.acme.orders.s": 2,
		"wh.dlq.acme.orders":        3, // not this prefix's
	}
	dlqWant(t, deadLetterTables(perSubject, subs, ""), map[string]uint64{
		"orders":             2,
		"wh.dlq.acme.orders": 3,
	})
}

func TestDeadLetterTables_AnEmptyInputGivesAnEmptyNonNilMap(t *testing.T) {
	subs := subjects{prefix: "wh", n: 4}
	dlqWant(t, deadLetterTables(map[string]uint64{}, subs, ""), map[string]uint64{})
	dlqWant(t, deadLetterTables(nil, subs, ""), map[string]uint64{})
	dlqWant(t, deadLetterTables(nil, subs, "orders"), map[string]uint64{})
}

// TestDeadLetterCounts_IsOneSubjectFilteredStreamInfoRequest: counting a tenant's parks
// asks the server once, with the tenant's subject filter, and still counts right.
func TestDeadLetterCounts_IsOneSubjectFilteredStreamInfoRequest(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, e.SetMaxBytes(ctx, "globex", 1<<20))
	for _, tp := range []Topic{{Tenant: "acme", Table: "a"}, {Tenant: "acme", Table: "a", Scope: "s"}, {Tenant: "acme", Table: "b"}, {Tenant: "globex", Table: "a"}} {
		require.NoError(t, e.DeadLetter(ctx, NewMessage(ctx, tp, []byte("x"))))
	}
	// The server hands a request to every subscriber of its subject, this one included,
	// before JetStream answers it; the connection delivers in order.
	sub, err := e.nc.SubscribeSync("$JS.API.STREAM.INFO." + e.topo.DeadLetterStream())
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, e.nc.Flush())

	counts, err := e.DeadLetterCounts(ctx, "acme", "")
	require.NoError(t, err)
	assert.Equal(t, DeadLetterCounts{Tables: map[string]uint64{"a": 2, "b": 1}, Total: 3}, counts)

	var requests []string
	for {
		m, err := sub.NextMsg(300 * time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) {
			break
		}
		require.NoError(t, err)
		requests = append(requests, string(m.Data))
	}
	require.Len(t, requests, 1, "stream info requests: %q", requests)
	var req struct {
		SubjectsFilter string `json:"subjects_filter"`
	}
	require.NoError(t, json.Unmarshal([]byte(requests[0]), &req))
	assert.Equal(t, "wh.dlq.acme.>", req.SubjectsFilter)

	require.NoError(t, e.js.DeleteStream(ctx, e.topo.DeadLetterStream()))
	_, err = e.DeadLetterCounts(ctx, "acme", "")
	require.ErrorIs(t, err, ErrUnavailable, "a dead-letter stream gone is unavailable, not an empty count")
	assert.Contains(t, err.Error(), e.topo.DeadLetterStream())
}

// TestEmbeddedNATS_ParksOfATenantNeverBudgetedAreCounted: such a tenant has no queue
// of its own (ErrNoDeadLetterQueue), but a host may park a message of it; that park is
// counted rather than stored where no count shows it.
func TestEmbeddedNATS_ParksOfATenantNeverBudgetedAreCounted(t *testing.T) {
	e := openEmbedded(t, "")
	ctx := testCtx(t)
	_, err := e.DeadLetterCounts(ctx, "never", "")
	require.ErrorIs(t, err, ErrNoDeadLetterQueue, "nothing parked yet")
	require.NoError(t, e.DeadLetter(ctx, NewMessage(ctx, Topic{Tenant: "never", Table: "t", Scope: "s"}, []byte("x"))))
	counts, err := e.DeadLetterCounts(ctx, "never", "")
	require.NoError(t, err)
	assert.Equal(t, DeadLetterCounts{Tables: map[string]uint64{"t": 1}, Total: 1}, counts)
	parked, _, err := e.DeadLetters(ctx, "never", DeadLetterQuery{})
	require.NoError(t, err)
	assert.Len(t, parked, 1)
}
