package main

import (
	"errors"
	"syscall"
)

// failWritesToAClosedPipe does nothing: Windows has no SIGPIPE, and a write into a
// closed pipe fails on its own.
func failWritesToAClosedPipe() {}

// errNoData is ERROR_NO_DATA, what a write into a pipe being closed fails with.
const errNoData = syscall.Errno(232)

// readerGone reports whether err is a write into a pipe whose reader left.
func readerGone(err error) bool {
	return errors.Is(err, syscall.ERROR_BROKEN_PIPE) || errors.Is(err, errNoData) || errors.Is(err, syscall.EPIPE)
}
