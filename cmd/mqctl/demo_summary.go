package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wavehouse/mq"
)

// summary prints every check against its expectation, then what the workers handled,
// the poison event's attempts and its park, the dead letters and the phases' times.
func (d *demoRun) summary(dl demoDeadLetters, total time.Duration) {
	fmt.Fprintln(d.out, "\nsummary")
	w := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  count\tgot\twant\tresult")
	for _, c := range d.checks {
		mark := "ok"
		if c.got != c.want {
			mark = "MISMATCH"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", c.what, c.got, c.want, mark)
	}
	_ = w.Flush()

	d.mu.Lock()
	d.workerSummary()
	d.mu.Unlock()
	parkedSummary(d.out, dl)

	dlq := dl.counts
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

// workerSummary prints, under d.mu, each worker's calls, writes, tenants and the
// partitions those tenants are on, then the handler's calls on the poison event.
func (d *demoRun) workerSummary() {
	fmt.Fprintln(d.out, "\nworkers (partitions: those of the tenants each one handled, by mq.Partition)")
	w := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  worker\tcalls\twritten\ttenants (calls)\tpartitions")
	for _, m := range d.fleet.members {
		var tenants []string
		for _, t := range slices.Sorted(maps.Keys(m.tenants)) {
			tenants = append(tenants, fmt.Sprintf("%s (%d)", t, m.tenants[t]))
		}
		fmt.Fprintf(w, "  %s\t%d\t%d\t%s\t%s\n", m.name, m.calls, m.written, orDash(strings.Join(tenants, ", ")),
			orDash(strings.Trim(strings.Join(strings.Fields(fmt.Sprint(d.partitionsOf(m))), ", "), "[]")))
	}
	_ = w.Flush()
	fmt.Fprintf(d.out, "  partition handovers: %d (a partition's calls moving to the other worker)\n", d.fleet.handovers)

	poison := d.plan.poison
	fmt.Fprintf(d.out, "\npoison event %s (%s), as the handler saw it\n", poison.id(), poison.topic())
	w = tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  attempt\tworker\tcall\tafter\tsequence\tid\treturned")
	for _, a := range d.fleet.poison {
		after := a.at.Sub(d.fleet.poison[0].at)
		fmt.Fprintf(w, "  %d\t%s\t#%d\t%s\t%d\t%s\t%s\n", a.attempt, a.worker, a.call, round(after), a.sequence, a.id, a.err)
	}
	_ = w.Flush()
}

// parkedSummary prints every event read back from the dead-letter stream with the
// headers the poison policy gave it.
func parkedSummary(out io.Writer, dl demoDeadLetters) {
	fmt.Fprintf(out, "\nparked events, read back from stream %s with DeadLetters\n", dl.stream)
	if len(dl.parked) == 0 {
		fmt.Fprintln(out, "  none")
	}
	for _, p := range dl.parked {
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, row := range [][2]string{
			{"event", p.demoID + " on " + p.key},
			{"stored", p.stored.UTC().Format(time.RFC3339Nano)},
			{mq.HeaderDeadReason, p.reason},
			{mq.HeaderDeadError, p.lastErr},
			{mq.HeaderDeadAttempts, p.attempts},
			{mq.HeaderDeadPartition, p.part},
			{mq.HeaderDeadSequence, p.sequence},
			{mq.HeaderDeadFirstAttempt, p.first},
			{mq.HeaderDeadLastAttempt, p.last},
		} {
			fmt.Fprintf(w, "  %s\t%s\n", row[0], orDash(row[1]))
		}
		_ = w.Flush()
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
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
