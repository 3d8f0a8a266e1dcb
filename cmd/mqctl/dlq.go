package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "dlq",
		summary: "list, redrive or remove a tenant's parked events on a live cluster",
		usage: "ls|redrive|rm -url nats://host:4222[,...] -tenant T [-table name | -id 3,5 | -all] [auth flags] [topology flags]\n\n" +
			"  ls       a page of the tenant's parked events, oldest first (-limit, -cursor, -headers)\n" +
			"  redrive  publish the selected events to ingest again, removing each once stored\n" +
			"  rm       remove the selected events (-all needs -yes)",
		run: runDLQ,
	})
}

// dlqFlags are the flags of the dlq subcommands.
type dlqFlags struct {
	nats    *natsFlags
	tenant  string
	table   string
	ids     string
	all     bool
	yes     bool
	limit   int
	cursor  string
	headers bool
}

func runDLQ(ctx context.Context, e *env, args []string) int {
	c := commands["dlq"]
	fs := c.flags(e)
	var f dlqFlags
	f.nats = addNATSFlags(fs, waitVerifies)
	fs.StringVar(&f.tenant, "tenant", "", "the tenant whose parked events to act on (required)")
	fs.StringVar(&f.table, "table", "", "only this table's parked events, every scope of it")
	fs.StringVar(&f.ids, "id", "", "redrive/rm: only these ids, comma-separated, as ls prints them")
	fs.BoolVar(&f.all, "all", false, "redrive/rm: every parked event of the tenant")
	fs.BoolVar(&f.yes, "yes", false, "rm: confirm removing every parked event of the tenant (with -all)")
	fs.IntVar(&f.limit, "limit", 100, "ls: the page's size")
	fs.StringVar(&f.cursor, "cursor", "", "ls: where the page starts, as the previous page printed it")
	fs.BoolVar(&f.headers, "headers", false, "ls: print every header of each event")
	if len(args) == 0 || !slices.Contains([]string{"ls", "redrive", "rm"}, args[0]) {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return help(e, fs)
		}
		fmt.Fprintln(e.stderr, "mqctl dlq: the first argument must be ls, redrive or rm")
		fs.Usage()
		return 2
	}
	sub := args[0]
	if code := parse(e, fs, args[1:]); code >= 0 {
		return code
	}
	cfg, ok := f.nats.config(fs)
	if !ok {
		return 2
	}
	if f.tenant == "" {
		fmt.Fprintln(e.stderr, "mqctl dlq: -tenant is required")
		return 2
	}
	if err := mq.TenantID(f.tenant).Validate(); err != nil {
		fmt.Fprintf(e.stderr, "mqctl dlq %s: -tenant: %v\n", sub, err)
		return 2
	}
	if msg := f.misplaced(fs, sub); msg != "" {
		fmt.Fprintf(e.stderr, "mqctl dlq %s: %s\n", sub, msg)
		return 2
	}
	var sel mq.DeadLetterSelector
	if sub != "ls" {
		var msg string
		if sel, msg = f.selector(sub); msg != "" {
			fmt.Fprintf(e.stderr, "mqctl dlq %s: %s\n", sub, msg)
			return 2
		}
	}
	b, err := mq.NewNATS(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl dlq %s: %v\n", sub, err)
		return connectExit(err)
	}
	defer b.Close()
	tenant := mq.TenantID(f.tenant)
	var done string // what a redrive or rm did, also when it failed part way
	switch sub {
	case "ls":
		err = f.list(ctx, e, b, tenant)
		if e.outputLost("mqctl dlq ls", "the page of parked events") {
			return 1
		}
		if errors.Is(err, mq.ErrInvalidConfig) { // the library read -limit or -cursor
			fmt.Fprintf(e.stderr, "mqctl dlq ls: %v\n", err)
			return 2
		}
	case "redrive":
		n, rerr := b.Redrive(ctx, tenant, sel)
		done, err = fmt.Sprintf("redrove %d parked events of %s", n, tenant), rerr
	case "rm":
		n, rerr := b.DeleteDeadLetters(ctx, tenant, sel)
		done, err = fmt.Sprintf("removed %d parked events of %s", n, tenant), rerr
	}
	if err != nil {
		if done != "" {
			fmt.Fprintf(e.stderr, "mqctl dlq %s: %s, then: %v\n", sub, done, err)
		} else {
			fmt.Fprintf(e.stderr, "mqctl dlq %s: %v\n", sub, err)
		}
		return 1
	}
	if done != "" {
		fmt.Fprintln(e.stdout, done)
		// Done all the same: stderr says what, since stdout could not.
		if e.doneLost("mqctl dlq "+sub, strconv.Quote(done)) {
			return 1
		}
	}
	return 0
}

// misplaced names a flag given that sub does not take, or a -limit ls cannot use.
func (f *dlqFlags) misplaced(fs *flag.FlagSet, sub string) string {
	ls, change := []string{"ls"}, []string{"redrive", "rm"}
	only := map[string][]string{"limit": ls, "cursor": ls, "headers": ls, "id": change, "all": change, "yes": {"rm"}}
	var msg string
	fs.Visit(func(fl *flag.Flag) {
		if subs, ok := only[fl.Name]; ok && msg == "" && !slices.Contains(subs, sub) {
			msg = fmt.Sprintf("-%s is for %s only", fl.Name, strings.Join(subs, " and "))
		}
	})
	if msg == "" && f.limit < 1 {
		msg = fmt.Sprintf("-limit %d: must be at least 1", f.limit)
	}
	return msg
}

// selector is what -all, -table and -id pick, or why they cannot be used: exactly one
// is needed, and rm -all needs -yes.
func (f *dlqFlags) selector(sub string) (mq.DeadLetterSelector, string) {
	var sel mq.DeadLetterSelector
	given := 0
	if f.all {
		sel.All = true
		given++
	}
	if f.table != "" {
		sel.Table = f.table
		given++
	}
	if f.ids != "" {
		for id := range strings.SplitSeq(f.ids, ",") {
			if id = strings.TrimSpace(id); id != "" {
				// An id is a sequence on the dead-letter stream, as ls prints it.
				if n, err := strconv.ParseUint(id, 10, 64); err != nil || n == 0 {
					return sel, fmt.Sprintf("-id %q: %q is no parked event's id (a sequence, as ls prints)", f.ids, id)
				}
				sel.IDs = append(sel.IDs, id)
			}
		}
		given++
	}
	switch {
	case given != 1:
		return sel, "give exactly one of -all, -table and -id"
	case f.ids != "" && len(sel.IDs) == 0:
		return sel, fmt.Sprintf("-id %q names no id", f.ids)
	case sub == "rm" && f.all && !f.yes:
		return sel, "-all removes every parked event of the tenant for good; add -yes to confirm"
	}
	return sel, ""
}

// list prints one page of the tenant's parked events and, when more follow, the
// cursor of the next. Its error is the query's.
func (f *dlqFlags) list(ctx context.Context, e *env, b mq.DeadLetterManager, tenant mq.TenantID) error {
	page, next, err := b.DeadLetters(ctx, tenant, mq.DeadLetterQuery{Table: f.table, Limit: f.limit, Cursor: f.cursor})
	if err != nil {
		return err
	}
	// The rows are aligned on their own, then each event's headers are put under its
	// row: a line of one cell in the tabwriter would end the columns' block, and the
	// rows after it would be aligned apart from the column header.
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTABLE\tSCOPE\tPARKED\tREASON\tATTEMPTS\tERROR")
	for _, m := range page {
		t := m.Topic()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, cell(t.Table), cell(t.Scope),
			m.Timestamp.UTC().Format(time.RFC3339), cell(m.Headers.Get(mq.HeaderDeadReason)),
			cell(m.Headers.Get(mq.HeaderDeadAttempts)), cell(m.Headers.Get(mq.HeaderDeadError)))
	}
	_ = tw.Flush()
	// Every cell is one line (shown quotes a newline), so line i+1 is page[i]'s row.
	lines := strings.SplitAfter(table.String(), "\n")
	indent := strings.Repeat(" ", strings.Index(lines[0], "TABLE")+2)
	var out bytes.Buffer
	out.WriteString(lines[0])
	for i, m := range page {
		out.WriteString(lines[i+1])
		if !f.headers {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			for _, v := range m.Headers[k] {
				fmt.Fprintf(&out, "%s%s: %s\n", indent, shown(k), shown(v))
			}
		}
	}
	_, _ = e.stdout.Write(out.Bytes()) // a failed write is the caller's to see, in e.outputLost
	fmt.Fprintf(e.stdout, "%d parked events of %s on this page\n", len(page), tenant)
	if next != "" {
		fmt.Fprintf(e.stdout, "next page: -cursor %s\n", next)
	}
	return nil
}

// cell is s as one column of a table: "-" when empty, so the columns stay aligned,
// else shown.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return shown(s)
}

// shown is s Go-quoted when it holds what a terminal would act on or a tab would
// misalign (a control character, ESC, DEL, bytes that are not UTF-8), else s itself:
// tables, scopes, headers, errors and worker names are bytes a tenant or a host chose.
func shown(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
