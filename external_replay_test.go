//go:build integration

package mq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxiedBroker boots an ExternalNATS that reaches the fixture's server through a
// loopback proxy, with publishTimeout bounding each request.
func proxiedBroker(t *testing.T, publishTimeout time.Duration) (*externalFixture, *loopbackProxy, *ExternalNATS) {
	t.Helper()
	f := newExternalFixture(t)
	p := newLoopbackProxy(t, f.srv.Addr().String())
	e := f.broker(t, func(c *NATSConfig) {
		c.URLs = []string{p.URL()}
		c.PublishTimeout = publishTimeout
	})
	return f, p, e
}

// awaitDelivered waits until the server has sent n events of the replay consumer
// filtered to subject, reading as the operator over its own connection.
func (f *natsFixture) awaitDelivered(ctx context.Context, history, subject string, n uint64) error {
	s, err := f.admin.Stream(ctx, history)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		infos := s.ListConsumers(ctx)
		for ci := range infos.Info() {
			if ci.Config.FilterSubject == subject && ci.Delivered.Consumer >= n {
				return nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the server never sent %d events of %s: %w", n, subject, ctx.Err())
}

func TestReplay_ALostBatchIsAskedForAgainNotEndedEarly(t *testing.T) {
	t.Parallel()
	// A generous bound: asking again spans the client's reconnect through the proxy.
	f, p, e := proxiedBroker(t, 20*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "lost"}
	const n = replayBatch + 44
	want := publishReplayable(t, e, topic, n)
	subject, _, err := e.core.subs.ingestTopic(topic)
	require.NoError(t, err)

	lost := make(chan error, 1)
	var got []string
	err = e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		got = append(got, string(m.Data))
		if len(got) == replayBatch {
			// The whole first batch is in. Lose the second in transit: the ack-less
			// consumer counts it as delivered. Then cut the connection, so the client
			// reconnects and asks on a healthy one.
			p.dropFromServer()
			go func() {
				err := f.awaitDelivered(ctx, e.topo.HistoryStream, subject, n)
				p.cut()
				lost <- err
			}()
		}
		return true
	})
	require.NoError(t, <-lost)
	require.NoError(t, err, "a lost batch is not the end of the replay")
	assert.Equal(t, want, got, "every event, once each, in order")
}

func TestReplay_AServerThatStopsAnsweringIsUnavailableBeforeTheCallersDeadline(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		dropAt int // events sent before the server's answers stop arriving
	}{
		{"BeforeTheReplayStarts", 0},
		{"AfterTheFirstBatch", replayBatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, p, e := proxiedBroker(t, 500*time.Millisecond)
			setup := testCtx(t)
			require.NoError(t, e.SetMaxBytes(setup, "acme", 1<<20))
			topic := Topic{Tenant: "acme", Table: "silent"}
			publishReplayable(t, e, topic, replayBatch+44)
			if c.dropAt == 0 {
				p.dropFromServer()
			}
			// The caller's deadline is far beyond the broker's own bound.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			sent := 0
			err := e.ReplaySince(ctx, topic, time.Time{}, func(*Message) bool {
				sent++
				if sent == c.dropAt {
					p.dropFromServer()
				}
				return true
			})
			require.ErrorIs(t, err, ErrUnavailable)
			require.NoError(t, ctx.Err(), "the replay waited for the caller's deadline, not its own bound: %v", err)
			assert.Equal(t, c.dropAt, sent)
			p.cut() // Close drains over a fresh connection
		})
	}
}

func TestExternalNATS_SettlingAHeldMessageAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	checkSettlingAfterCloseIsErrClosed(t, newExternalFixture(t).broker(t))
}
