package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wavehouse/mq"
)

// TestStatusTableSaysWhyConsumersAreNotListed: a user without the consumer list gets
// the rest of the table and a line saying why the consumers are missing.
func TestStatusTableSaysWhyConsumersAreNotListed(t *testing.T) {
	var b strings.Builder
	writeStatus(&b, mq.TopologyStatus{
		Partitions:   []mq.PartitionStatus{{Partition: 0, Stream: "WH_INGEST_0", Messages: 3}},
		History:      mq.HistoryStatus{Stream: "WH_HISTORY"},
		ConsumersErr: errors.New("status: list the consumers of WH_INGEST_0: permissions violation"),
	})
	out := b.String()
	for _, want := range []string{"WH_INGEST_0", "HISTORY WH_HISTORY", "(consumers not listed: status: list the consumers of WH_INGEST_0: permissions violation)"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestStatusTableShowsHowFarBackAReplayReaches: the history's line gives its window
// beside its max_age, so an operator sees max_bytes cutting the window short.
func TestStatusTableShowsHowFarBackAReplayReaches(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		h    mq.HistoryStatus
		want string
	}{
		{mq.HistoryStatus{Oldest: now.Add(-90 * time.Second), MaxAge: 15 * time.Minute}, "replays reach back 1m30s (max_age 15m0s)"},
		{mq.HistoryStatus{MaxAge: 15 * time.Minute}, "replays reach nothing (max_age 15m0s)"},
		{mq.HistoryStatus{Oldest: now.Add(-time.Hour)}, "replays reach back 1h0m0s (no max_age)"},
	} {
		if got := window(c.h, now); got != c.want {
			t.Errorf("window(%+v) = %q, want %q", c.h, got, c.want)
		}
	}
}

// TestStatusTableQuotesNamesOthersChose: a tenant read from a foreign park's subject,
// a worker's name and a source's error reach the terminal quoted, not as the control
// sequences they hold.
func TestStatusTableQuotesNamesOthersChose(t *testing.T) {
	var b strings.Builder
	writeStatus(&b, mq.TopologyStatus{
		History:     mq.HistoryStatus{Stream: "WH_HISTORY"},
		Workers:     []mq.WorkerStatus{{ID: "w1", Name: "box\x1b[2J"}},
		DeadLetters: map[mq.TenantID]uint64{"ev\x1b]0;owned\x07il": 2},
	})
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("raw control bytes in the status table: %q", out)
	}
	for _, want := range []string{`"ev\x1b]0;owned\ail"`, `"box\x1b[2J"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
}
