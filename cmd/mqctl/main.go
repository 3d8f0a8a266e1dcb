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
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// command is one subcommand. run parses its own flags (see [command.flags]) and
// returns the process exit code: 0 success, 1 failure, 2 a usage error.
type command struct {
	name    string
	summary string // one line for the command list
	usage   string // the argument synopsis after the name, e.g. "[-timeout d]"
	run     func(ctx context.Context, env *env, args []string) int
}

// env is what a command writes to.
type env struct {
	stdout, stderr io.Writer
}

var commands = map[string]command{}

// register adds a command; called from the init of each command's file.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("mqctl: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// flags returns a FlagSet for c that reports errors (and -h) as a usage error on
// stderr instead of exiting.
func (c command) flags(e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("mqctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: mqctl %s %s\n\n%s\n", c.name, c.usage, c.summary)
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(e.stderr, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses args into fs; it returns the exit code to stop with, or -1 to go on.
func parse(fs *flag.FlagSet, args []string) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
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
	if len(args) == 0 {
		usage(e.stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "mqctl: unknown command %q\n\n", args[0])
		usage(e.stderr)
		return 2
	}
	return c.run(ctx, e, args[1:])
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}
