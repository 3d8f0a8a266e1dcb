package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "status",
		summary: "a live table of the partitions, their owners, the history's sources, parked counts and consumers (read-only)",
		usage:   "-url nats://host:4222[,...] [-interval 2s] [-once] [auth flags] [topology flags]",
		run:     runStatus,
	})
}

// clearScreen moves the cursor home and clears the terminal, so each refresh redraws
// the table in place.
const clearScreen = "\x1b[H\x1b[2J"

func runStatus(ctx context.Context, e *env, args []string) int {
	c := commands["status"]
	fs := c.flags(e)
	nf := addNATSFlags(fs, waitVerifies)
	interval := fs.Duration("interval", 2*time.Second, "how often a terminal's table is refreshed")
	once := fs.Bool("once", false, "print the table once and exit (also when stdout is not a terminal)")
	listen := fs.Duration("listen", time.Second, "how long each refresh listens for the workers' heartbeats")
	if code := parse(e, fs, args); code >= 0 {
		return code
	}
	cfg, ok := nf.config(fs)
	if !ok {
		return 2
	}
	if *interval <= 0 || *listen <= 0 {
		fmt.Fprintln(e.stderr, "mqctl status: -interval and -listen must be positive")
		return 2
	}
	b, err := mq.NewNATS(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl status: %v\n", err)
		return connectExit(err)
	}
	defer b.Close()
	live := !*once && isTerminal(e.stdout)
	for {
		s, err := b.Status(ctx, mq.StatusOptions{ListenWorkers: *listen})
		if err != nil {
			if ctx.Err() != nil && live {
				return 0
			}
			fmt.Fprintf(e.stderr, "mqctl status: %v\n", err)
			return 1
		}
		var out bytes.Buffer
		if live {
			out.WriteString(clearScreen)
			fmt.Fprintf(&out, "%s  every %s  (Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), *interval)
		}
		writeStatus(&out, s)
		_, _ = e.stdout.Write(out.Bytes())
		if e.outputLost("mqctl status", "the status table") {
			return 1
		}
		if !live {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*interval):
		}
	}
}

// isTerminal reports whether w is a character device, which a terminal is and a pipe
// or file is not.
func isTerminal(w io.Writer) bool {
	if o, ok := w.(*output); ok {
		w = o.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// writeStatus prints the snapshot's sections as aligned tables.
func writeStatus(w io.Writer, s mq.TopologyStatus) {
	owners := map[int][]string{}
	for _, wk := range s.Workers {
		for _, p := range wk.Owned {
			owners[p] = append(owners[p], workerLabel(wk))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSTREAM\tMESSAGES\tBYTES\tPENDING\tACK PENDING\tREDELIVERED\tOWNER\tPINNED")
	for _, p := range s.Partitions {
		pinned := "-"
		if p.PinnedID != "" {
			pinned = shortID(p.PinnedID) + " since " + p.PinnedAt.UTC().Format(time.TimeOnly)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Partition, p.Stream, p.Messages, p.Bytes,
			p.Pending, p.AckPending, p.Redelivered, cell(strings.Join(owners[p.Partition], ",")), pinned)
	}
	section(tw, "WORKER\tNAME\tOWNED\tCLAIM\tLEAVING")
	for _, wk := range s.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\n", shortID(wk.ID), cell(wk.Name), cell(ints(wk.Owned)), cell(ints(wk.Claim)), wk.Leaving)
	}
	if len(s.Workers) == 0 {
		fmt.Fprintln(tw, "(no worker heard)")
	}
	section(tw, fmt.Sprintf("HISTORY %s: %d messages, %d bytes, %s", s.History.Stream, s.History.Messages, s.History.Bytes, window(s.History, time.Now())))
	fmt.Fprintln(tw, "SOURCE\tLAG\tLAST SEEN\tERROR")
	for _, src := range s.History.Sources {
		seen := "never"
		if src.LastSeen >= 0 {
			seen = src.LastSeen.Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", src.Stream, src.Lag, seen, cell(src.Error))
	}
	section(tw, "TENANT\tPARKED")
	for _, t := range slices.Sorted(maps.Keys(s.DeadLetters)) {
		fmt.Fprintf(tw, "%s\t%d\n", cell(string(t)), s.DeadLetters[t])
	}
	if len(s.DeadLetters) == 0 {
		fmt.Fprintln(tw, "(nothing parked)")
	}
	section(tw, "STREAM\tCONSUMER\tKIND\tPENDING\tACK PENDING\tREDELIVERED\tWAITING")
	for _, c := range s.Consumers {
		kind := "ephemeral"
		if c.Durable {
			kind = "durable"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", c.Stream, c.Name, kind, c.Pending, c.AckPending, c.Redelivered, c.Waiting)
	}
	if s.ConsumersErr != nil {
		fmt.Fprintf(tw, "(consumers not listed: %v)\n", s.ConsumersErr)
	}
	_ = tw.Flush()
}

// section starts a new table under a blank line.
func section(w io.Writer, header string) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, header)
}

// workerLabel names a worker by its connection's name and, since several workers may
// share a host, the start of its id.
func workerLabel(w mq.WorkerStatus) string {
	if w.Name == "" {
		return shortID(w.ID)
	}
	return w.Name + "/" + shortID(w.ID)
}

// shortID cuts a generated id to its last 8 characters, enough to tell workers apart
// on one screen: a nuid's first characters are its process's prefix, shared by every
// id the process makes.
func shortID(id string) string { return id[max(0, len(id)-8):] }

func ints(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// window says how far back a replay reaches, beside the history's max_age: a window
// well short of it means max_bytes drops events first.
func window(h mq.HistoryStatus, now time.Time) string {
	limit := "no max_age"
	if h.MaxAge > 0 {
		limit = "max_age " + h.MaxAge.String()
	}
	if h.Oldest.IsZero() {
		return "replays reach nothing (" + limit + ")"
	}
	return fmt.Sprintf("replays reach back %s (%s)", now.Sub(h.Oldest).Round(time.Second), limit)
}
