package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wavehouse/mq"
)

func (d *demoRun) summary(checks []demoCheck, dlq map[mq.TenantID]mq.DeadLetterCounts, total time.Duration) {
	fmt.Fprintln(d.out, "\nsummary")
	w := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  count\tgot\twant\tresult")
	for _, c := range checks {
		mark := "ok"
		if c.got != c.want {
			mark = "MISMATCH"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", c.what, c.got, c.want, mark)
	}
	_ = w.Flush()

	fmt.Fprintln(d.out, "\ndead letters per table")
	w = tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "  tenant\t%s\ttotal\n", strings.Join(demoTables, "\t"))
	for _, t := range demoTenants {
		row := []string{"  " + string(t)}
		for _, table := range demoTables {
			row = append(row, fmt.Sprint(dlq[t].Tables[table]))
		}
		row = append(row, fmt.Sprint(dlq[t].Total))
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	_ = w.Flush()

	fmt.Fprintln(d.out, "\nphases")
	w = tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	for _, p := range d.phases {
		fmt.Fprintf(w, "  %s\t%s\n", p.name, round(p.took))
	}
	fmt.Fprintf(w, "  total\t%s\n", round(total))
	_ = w.Flush()
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dB", n)
}

func joinTenants(ts []mq.TenantID) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// formatCounts renders a per-table count map in table order, e.g. "orders=1"; "-" if
// nothing is parked.
func formatCounts(m map[string]uint64) string {
	var parts []string
	for _, table := range slices.Sorted(maps.Keys(m)) {
		if m[table] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", table, m[table]))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func formatTotals(dlq map[mq.TenantID]mq.DeadLetterCounts) string {
	parts := make([]string, 0, len(demoTenants))
	for _, t := range demoTenants {
		parts = append(parts, fmt.Sprintf("%s %d", t, dlq[t].Total))
	}
	return strings.Join(parts, ", ")
}
