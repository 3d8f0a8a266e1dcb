package mq

import "fmt"

// A broker's methods answer on a nil *EmbeddedNATS or *ExternalNATS, or a zero value
// of either, with an error that wraps ErrClosed, rather than a panic: a host that
// keeps a broker whose constructor failed, or closes one in a defer before it was
// opened, gets an error it can match.

// opened reports whether NewEmbedded made e.
func (e *EmbeddedNATS) opened() error {
	if e == nil || e.core == nil {
		return errNotOpened("EmbeddedNATS", "NewEmbedded")
	}
	return nil
}

// opened reports whether NewNATS made e.
func (e *ExternalNATS) opened() error {
	if e == nil || e.core == nil {
		return errNotOpened("ExternalNATS", "NewNATS")
	}
	return nil
}

func errNotOpened(kind, constructor string) error {
	return fmt.Errorf("%w: this %s was never opened (%s makes one)", ErrClosed, kind, constructor)
}
