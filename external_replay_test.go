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

// replayThroughOutage replays replayBatch+44 events of a fresh topic on a broker that
// reaches its server through a proxy, with bound as its PublishTimeout, under a
// caller's deadline of callerDeadline; once dropAt events were sent (before the
// replay, for 0) it calls outage with the proxy. It returns what was published, what
// the replay sent, its error, and the caller's context's error as it returned.
func replayThroughOutage(t *testing.T, bound, callerDeadline time.Duration, dropAt int, outage func(*loopbackProxy)) (want, got []string, err, callerErr error) {
	t.Helper()
	_, p, e := proxiedBroker(t, bound)
	t.Cleanup(p.cut) // before Close, which drains over a fresh connection
	setup := testCtx(t)
	require.NoError(t, e.SetMaxBytes(setup, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "outage"}
	want = publishReplayable(t, e, topic, replayBatch+44)
	if dropAt == 0 {
		outage(p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), callerDeadline)
	defer cancel()
	got = []string{}
	err = e.ReplaySince(ctx, topic, time.Time{}, func(m *Message) bool {
		got = append(got, string(m.Data))
		if len(got) == dropAt {
			outage(p)
		}
		return true
	})
	return want, got, err, ctx.Err()
}

// Where a replay is disturbed: as it starts, or once its first batch was sent.
var replayOutages = []struct {
	name   string
	dropAt int // events sent before the server's answers stop arriving
}{
	{"AsTheReplayStarts", 0},
	{"AfterTheFirstBatch", replayBatch},
}

func TestReplay_AServerThatStopsAnsweringIsUnavailableBeforeTheCallersDeadline(t *testing.T) {
	t.Parallel()
	// Each request of the replay, and each wait for its next event, is bounded by
	// PublishTimeout: a silent server is ErrUnavailable within about one bound. The
	// caller's deadline is ten of them, so a replay ended by it, not by its own
	// bound, has the deadline's error and the caller's ctx done.
	const bound = time.Second
	for _, c := range replayOutages {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, got, err, callerErr := replayThroughOutage(t, bound, 10*bound, c.dropAt, (*loopbackProxy).dropFromServer)
			require.ErrorIs(t, err, ErrUnavailable)
			require.NoError(t, callerErr, "the replay waited for the caller's deadline, not its own bound: %v", err)
			assert.Len(t, got, c.dropAt)
		})
	}
}

func TestReplay_AnOutageShorterThanTheRequestBoundIsRiddenOut(t *testing.T) {
	t.Parallel()
	// The server's answers are lost for half the replay's request bound: as the replay
	// starts, a request's answer; after the first batch, the next batch and then the
	// answer to creating the consumer that asks for it again (sent once the pull's wait
	// of replayPullWait and the old consumer's delete ran out). Either request is sent
	// again once the outage is over, within the same bound.
	const bound = 9 * time.Second
	for _, c := range replayOutages {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			want, got, err, _ := replayThroughOutage(t, bound, 60*time.Second, c.dropAt, func(p *loopbackProxy) {
				p.dropFromServer()
				time.AfterFunc(bound/2, p.resume)
			})
			require.NoError(t, err, "an outage shorter than the request bound ended the replay")
			assert.Equal(t, want, got, "every event, once each, in order")
		})
	}
}

func TestExternalNATS_SettlingAHeldMessageAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	checkSettlingAfterCloseIsErrClosed(t, newExternalFixture(t).broker(t))
}

func TestReplay_CloseDuringAPullIsErrClosedOnExternalNATS(t *testing.T) {
	t.Parallel()
	f := newExternalFixture(t)
	e := f.broker(t)
	checkCloseDuringAPullIsErrClosed(t, e, e.core, f.admin)
}
