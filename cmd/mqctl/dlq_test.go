package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/wavehouse/mq"
)

// openEmbedded starts an embedded broker listening on loopback, for the commands to
// reach as an operator's cluster, with budgets for the tenants acme and other.
func openEmbedded(t *testing.T) *mq.EmbeddedNATS {
	t.Helper()
	e, err := mq.NewEmbedded(t.Context(), mq.EmbeddedOptions{StoreDir: t.TempDir(), ListenAddr: "127.0.0.1:0", NoSync: true,
		Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	for _, tenant := range []mq.TenantID{"acme", "other"} {
		if err := e.SetMaxBytes(t.Context(), tenant, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// parkEvents parks n events of tenant's table as the worker's poison policy does.
func parkEvents(t *testing.T, b mq.Broker, tenant mq.TenantID, table string, n int) {
	t.Helper()
	for range n {
		msg := mq.NewMessage(context.Background(), mq.Topic{Tenant: tenant, Table: table}, []byte("row"))
		if err := b.DeadLetter(t.Context(), msg, mq.WithHeader(mq.HeaderDeadReason, mq.DeadReasonHandlerFailed),
			mq.WithHeader(mq.HeaderDeadAttempts, "5"), mq.WithHeader(mq.HeaderDeadError, "bad row")); err != nil {
			t.Fatal(err)
		}
	}
}

func parkedOf(t *testing.T, b mq.Broker, tenant mq.TenantID) mq.DeadLetterCounts {
	t.Helper()
	c, err := b.DeadLetterCounts(t.Context(), tenant, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDLQListsRedrivesAndRemovesATenantsParkedEvents runs ls, redrive by table and rm by
// id and by -all against a live server, and checks what is left parked after each.
func TestDLQListsRedrivesAndRemovesATenantsParkedEvents(t *testing.T) {
	e := openEmbedded(t)
	parkEvents(t, e, "acme", "orders", 3)
	parkEvents(t, e, "acme", "users", 2)
	parkEvents(t, e, "other", "orders", 1)
	url := e.ClientURL()

	code, stdout, stderr := runArgs(t, "dlq", "ls", "-url", url, "-tenant", "acme", "-limit", "4")
	if code != 0 || strings.Count(stdout, mq.DeadReasonHandlerFailed) != 4 || !strings.Contains(stdout, "bad row") ||
		!strings.Contains(stdout, "next page: -cursor ") || !strings.Contains(stdout, "ID  ") {
		t.Fatalf("dlq ls: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	first := strings.Fields(strings.Split(stdout, "\n")[1])
	if first[1] != "orders" {
		t.Fatalf("dlq ls: the oldest parked event is not first:\n%s", stdout)
	}
	cursor := stdout[strings.Index(stdout, "-cursor ")+len("-cursor "):]
	code, stdout, _ = runArgs(t, "dlq", "ls", "-url", url, "-tenant", "acme", "-cursor", strings.TrimSpace(cursor), "-headers")
	if code != 0 || strings.Count(stdout, "users") != 1 || !strings.Contains(stdout, mq.HeaderDeadAttempts+": 5") {
		t.Fatalf("dlq ls, second page: exit %d\n%s", code, stdout)
	}

	code, stdout, stderr = runArgs(t, "dlq", "redrive", "-url", url, "-tenant", "acme", "-table", "orders")
	if c := parkedOf(t, e, "acme"); code != 0 || !strings.Contains(stdout, "redrove 3") || c.Total != 2 || c.Tables["orders"] != 0 {
		t.Fatalf("dlq redrive -table orders: exit %d, stdout %s, stderr %s, left %+v", code, stdout, stderr, c)
	}

	code, stdout, stderr = runArgs(t, "dlq", "rm", "-url", url, "-tenant", "acme", "-id", first[0])
	if code != 1 || !strings.Contains(stderr, "not found") || !strings.Contains(stderr, "removed 0") || stdout != "" {
		t.Fatalf("dlq rm of a redriven id: exit %d, stdout %q (want nothing: it failed), stderr %s", code, stdout, stderr)
	}
	if code, _, stderr := runArgs(t, "dlq", "ls", "-url", url, "-tenant", "acme", "-cursor", "zz"); code != 2 || !strings.Contains(stderr, "cursor") {
		t.Fatalf("dlq ls with a garbage cursor: exit %d, stderr %s; want a usage error", code, stderr)
	}
	if code, _, stderr := runArgs(t, "dlq", "rm", "-url", url, "-tenant", "acme", "-all"); code != 2 || !strings.Contains(stderr, "-yes") {
		t.Fatalf("dlq rm -all without -yes: exit %d, stderr %s", code, stderr)
	}
	code, stdout, _ = runArgs(t, "dlq", "rm", "-url", url, "-tenant", "acme", "-all", "-yes")
	if c := parkedOf(t, e, "acme"); code != 0 || !strings.Contains(stdout, "removed 2") || c.Total != 0 {
		t.Fatalf("dlq rm -all -yes: exit %d, stdout %s, left %+v", code, stdout, c)
	}
	if c := parkedOf(t, e, "other"); c.Total != 1 {
		t.Fatalf("another tenant's parked event was touched: %+v", c)
	}
}

func TestDLQRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"dlq"},
		{"dlq", "show", "-url", "nats://127.0.0.1:1", "-tenant", "a"},
		{"dlq", "ls", "-tenant", "a"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1"},
		{"dlq", "redrive", "-url", "nats://127.0.0.1:1", "-tenant", "a"},
		{"dlq", "redrive", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-all", "-table", "t"},
		// Refused before dialing: the port answers nothing, so a dial would be
		// ErrUnavailable and exit 1.
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "ACME"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-limit", "-1"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-limit", "0"},
		{"dlq", "redrive", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-id", "x,,y"},
		{"dlq", "rm", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-id", "-3"},
		{"dlq", "rm", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-id", "0"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-prefix="},
		{"demo", "-timeout", "0s"},
		{"demo", "-timeout", "-1s"},
		{"permissions", "-history="},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-all"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-id", "3"},
		{"dlq", "redrive", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-all", "-yes"},
		{"dlq", "redrive", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-all", "-limit", "5"},
		{"dlq", "rm", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-id", ","},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-partitions", "0"},
		{"dlq", "ls", "-url", "nats://127.0.0.1:1", "-tenant", "a", "-wait", "0s"},
	} {
		if code, _, stderr := runArgs(t, args...); code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, code, stderr)
		}
	}
}

// TestDLQListShowsTenantChosenBytesQuotedNotRaw: a table, scope, error or header value
// holding terminal controls (ESC, BEL, CR), a tab or bytes that are not UTF-8 is
// printed Go-quoted, so nothing a tenant chose reaches the operator's terminal raw or
// shifts the columns.
func TestDLQListShowsTenantChosenBytesQuotedNotRaw(t *testing.T) {
	e := openEmbedded(t)
	table, scope := "evil\x1b]0;owned\x07\x1b[2J\ttab\rcr", "bad\xffutf8"
	msg := mq.NewMessage(context.Background(), mq.Topic{Tenant: "acme", Table: table, Scope: scope}, []byte("row"))
	if err := e.DeadLetter(t.Context(), msg, mq.WithHeader(mq.HeaderDeadError, "line\x1b[31mred"),
		mq.WithHeader("X-Note", "bell\x07")); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runArgs(t, "dlq", "ls", "-url", e.ClientURL(), "-tenant", "acme", "-headers")
	if code != 0 {
		t.Fatalf("dlq ls: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if strings.ContainsAny(stdout, "\x1b\x07\r\t") || strings.Contains(stdout, "\xff") {
		t.Fatalf("dlq ls printed raw control bytes: %q", stdout)
	}
	for _, want := range []string{strconv.Quote(table), strconv.Quote(scope), strconv.Quote("line\x1b[31mred"),
		"X-Note: " + strconv.Quote("bell\x07")} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("dlq ls does not show %s:\n%s", want, stdout)
		}
	}
	if row := strings.Fields(strings.Split(stdout, "\n")[1]); row[1] != strconv.Quote(table) {
		t.Fatalf("dlq ls: the table is not one column: %q", row)
	}
}

// TestDLQListHeadersKeepTheRowsAlignedWithTheColumnHeader: -headers wrote each event's
// header lines, of one cell, into the rows' tabwriter, which ended the columns' block
// there, so every row after the first was aligned apart from the column header. Each
// row's cells must start where the column header's names do, and each row's headers
// follow it.
func TestDLQListHeadersKeepTheRowsAlignedWithTheColumnHeader(t *testing.T) {
	e := openEmbedded(t)
	// The wider table and error come later: a row aligned on its own shifts the columns.
	parkEvents(t, e, "acme", "a", 1)
	parkEvents(t, e, "acme", "a-much-longer-table-name", 1)
	msg := mq.NewMessage(context.Background(), mq.Topic{Tenant: "acme", Table: "mid-table", Scope: "a-long-scope-name"}, []byte("row"))
	if err := e.DeadLetter(t.Context(), msg, mq.WithHeader(mq.HeaderDeadReason, mq.DeadReasonHandlerFailed),
		mq.WithHeader(mq.HeaderDeadAttempts, "12345"), mq.WithHeader(mq.HeaderDeadError, "e")); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runArgs(t, "dlq", "ls", "-url", e.ClientURL(), "-tenant", "acme", "-headers")
	if code != 0 {
		t.Fatalf("dlq ls -headers: exit %d\n%s\n%s", code, stdout, stderr)
	}
	lines := strings.Split(stdout, "\n")
	header := lines[0]
	var starts []int
	for _, name := range []string{"TABLE", "SCOPE", "PARKED", "REASON", "ATTEMPTS", "ERROR"} {
		i := strings.Index(header, name)
		if i < 1 {
			t.Fatalf("no column %s in the header %q", name, header)
		}
		starts = append(starts, i)
	}
	var rows, headersAfterRow int
	for _, l := range lines[1:] {
		switch {
		case l == "" || strings.Contains(l, "parked events of acme on this page"):
		case l[0] != ' ': // a row: its id first
			if rows > 0 && headersAfterRow == 0 {
				t.Errorf("row %d has no header lines under it:\n%s", rows, stdout)
			}
			rows, headersAfterRow = rows+1, 0
			for _, s := range starts {
				if len(l) <= s || l[s-1] != ' ' || l[s] == ' ' {
					t.Errorf("row %d: no cell starts at column %d, where the header's does:\n%s\n%s", rows, s, header, l)
				}
			}
		default: // a header line under its row
			if rows == 0 {
				t.Errorf("a header line before any row: %q", l)
			}
			headersAfterRow++
		}
	}
	if rows != 3 || headersAfterRow == 0 || !strings.Contains(stdout, mq.HeaderDeadAttempts+": 12345") {
		t.Fatalf("dlq ls -headers: %d rows, want 3 each with its headers under it:\n%s", rows, stdout)
	}
}
