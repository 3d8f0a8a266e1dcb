package main

import (
	"errors"
	"strings"
	"testing"

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
