//go:build !unix

package main

// failWritesToAClosedPipe does nothing: only Unix kills a writer to a closed pipe
// with SIGPIPE; elsewhere the write fails on its own.
func failWritesToAClosedPipe() {}
