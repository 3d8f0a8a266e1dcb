// Command mqctl is the toolbox of github.com/wavehouse/mq.
//
// Usage:
//
//	mqctl <command> [flags]
//
// Each command lives in a file of its own that registers itself in init with
// [register]; `mqctl help` lists them.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// command is one subcommand. run parses its own flags (see [command.flags]) and
// returns the process exit code: 0 success, 1 failure, 2 a usage error. Its output
// lost (a write to stdout failed) is a failure too, see [env.outputLost].
type command struct {
	name    string
	summary string // one line for the command list
	usage   string // the argument synopsis after the name, e.g. "[-timeout d]"
	run     func(ctx context.Context, env *env, args []string) int
}

// env is what a command writes to. [run] makes stdout an [*output].
type env struct {
	stdout, stderr io.Writer
}

// output is a command's stdout as [run] hands it over. It remembers the first write
// that failed (a full disk, a closed pipe) and fails every write after it, so what
// reaches stdout is a whole prefix of the output, never one with a gap.
type output struct {
	mu       sync.Mutex
	w        io.Writer
	err      error
	reported bool
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	o.err = err
	return n, err
}

// outputLost reports whether a write to stdout failed; the first time it is asked
// after one did, it says on stderr what could not be written, prefixed by who (as
// "mqctl check"), unless the reader of a pipe left (`mqctl dlq ls … | head`), which
// it did on purpose. A command whose output is lost exits 1: its output is what it
// was run for, and the caller would otherwise take a partial or empty result for a
// whole one.
func (e *env) outputLost(who, what string) bool { return e.lost(who, what, false) }

// doneLost is outputLost for the report of work already done (a redrive, a removal):
// said on stderr even when the reader left, or the operator could not tell whether
// anything changed.
func (e *env) doneLost(who, what string) bool { return e.lost(who, what, true) }

// helped is the exit code after help written to stdout: 0, or 1 if it was lost.
func (e *env) helped(who string) int {
	if e.outputLost(who, "the help") {
		return 1
	}
	return 0
}

func (e *env) lost(who, what string, always bool) bool {
	o, ok := e.stdout.(*output)
	if !ok {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		return false
	}
	if !o.reported && (always || !readerGone(o.err)) {
		fmt.Fprintf(e.stderr, "%s: could not write %s to stdout: %v\n", who, what, o.err)
	}
	o.reported = true
	return true
}

var commands = map[string]command{}

// register adds a command; called from the init of each command's file.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("mqctl: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// flags returns a FlagSet for c that reports a usage error, its usage after it, on
// stderr instead of exiting; asked-for help goes to stdout (see [parse] and [help]).
func (c command) flags(e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("mqctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: mqctl %s %s\n\n%s\n", c.name, c.usage, c.summary)
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// help prints fs's usage to stdout and returns exit code 0: asked for (-h), the usage
// is the command's output, to page or grep, not a complaint.
func help(e *env, fs *flag.FlagSet) int {
	fs.SetOutput(e.stdout)
	fs.Usage()
	fs.SetOutput(e.stderr)
	return e.helped(fs.Name())
}

// parse parses args into fs; it returns the exit code to stop with, or -1 to go on.
// Help asked for with -h or -help goes to stdout (exit 0); a usage error and the
// usage after it go to stderr (exit 2).
func parse(e *env, fs *flag.FlagSet, args []string) int {
	// The flag package prints the usage before it says whether help was asked for.
	var said bytes.Buffer
	fs.SetOutput(&said)
	err := fs.Parse(args)
	fs.SetOutput(e.stderr)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = e.stdout.Write(said.Bytes())
		return e.helped(fs.Name())
	}
	if err != nil {
		_, _ = e.stderr.Write(said.Bytes())
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		fs.Usage()
		return 2
	}
	var empty string
	fs.Visit(func(f *flag.Flag) {
		if nonEmpty[f.Name] && f.Value.String() == "" && empty == "" {
			empty = f.Name
		}
	})
	if empty != "" {
		// The library would read it as the default name, not the one meant.
		fmt.Fprintf(fs.Output(), "%s: -%s given empty\n", fs.Name(), empty)
		fs.Usage()
		return 2
	}
	return -1
}

// nonEmpty are the flags naming part of the topology: given, they must name something.
var nonEmpty = map[string]bool{"prefix": true, "history": true, "ingest-consumer": true, "ingest-group": true}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: mqctl <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-12s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'mqctl <command> -h' for a command's flags.")
}

// run dispatches args (without the program name) and returns the exit code.
func run(ctx context.Context, e *env, args []string) int {
	e = &env{stdout: &output{w: e.stdout}, stderr: e.stderr}
	if len(args) == 0 {
		usage(e.stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return e.helped("mqctl")
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "mqctl: unknown command %q\n\n", args[0])
		usage(e.stderr)
		return 2
	}
	code := c.run(ctx, e, args[1:])
	// Each command says what it could not write; this is for one that did not look.
	if e.outputLost("mqctl "+c.name, "its output") {
		return 1
	}
	return code
}

func main() {
	failWritesToAClosedPipe()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}
