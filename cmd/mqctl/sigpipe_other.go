//go:build !unix && !windows

package main

// failWritesToAClosedPipe does nothing: only Unix kills a writer to a closed pipe
// with SIGPIPE; elsewhere the write fails on its own.
func failWritesToAClosedPipe() {}

// readerGone reports whether err is a write into a pipe whose reader left; this
// platform's error for it is not known here.
func readerGone(error) bool { return false }
