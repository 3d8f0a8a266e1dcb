//go:build unix

package main

import (
	"errors"
	"os/signal"
	"syscall"
)

// failWritesToAClosedPipe makes a write to a pipe whose reader is gone fail with EPIPE
// instead of killing the process with SIGPIPE, the Go runtime's default for stdout and
// stderr: `mqctl demo | head -1` then ends as an output that could not be written
// (exit 1, said on stderr), and the demo removes its temporary store on the way out,
// as it does on SIGINT.
func failWritesToAClosedPipe() { signal.Ignore(syscall.SIGPIPE) }

// readerGone reports whether err is a write into a pipe whose reader left.
func readerGone(err error) bool { return errors.Is(err, syscall.EPIPE) }
