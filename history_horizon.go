package mq

import (
	"context"
	"fmt"
)

// OldestSequence returns the history's oldest sequence, or the next one when the
// history holds none (see HistoryHorizon).
func (e *EmbeddedNATS) OldestSequence(ctx context.Context) (uint64, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.oldestSequence(ctx)
}

// OldestSequence returns the history's oldest sequence, or the next one when the
// history holds none (see HistoryHorizon). The operator's max_age and max_bytes move
// it; a max_msgs_per_subject on the history drops events from the middle, which it
// cannot show (the verifier advises against one).
func (e *ExternalNATS) OldestSequence(ctx context.Context) (uint64, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.oldestSequence(ctx)
}

// oldestSequence reads the history's state: one request, bounded by PublishTimeout as
// every other is.
func (c *natsCore) oldestSequence(ctx context.Context) (uint64, error) {
	if ctx == nil {
		return 0, errNilContext("oldest sequence")
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
	defer cancel()
	s, err := c.js.Stream(rctx, c.topo.HistoryStream)
	if err != nil {
		what := "oldest sequence: history " + c.topo.HistoryStream
		if ctx.Err() != nil && !c.closed.Load() {
			return 0, fmt.Errorf("%s: %w", what, ctx.Err())
		}
		return 0, c.mapRequestError(what, err)
	}
	// An empty stream reports a first sequence of its last plus one, except one that
	// never held anything, which reports 0 for both.
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return st.LastSeq + 1, nil
	}
	return st.FirstSeq, nil
}
