package mq

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reply slots a synchronous publish waits on, against a real server: a responder
// on a plain subject stands in for a stream where the test must choose the answer.

// replyConn is a fresh connection to f's server, closed at cleanup.
func replyConn(t *testing.T, f *natsFixture) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(f.srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// answerWith answers every request on subject with data, from the fixture's connection.
func answerWith(t *testing.T, f *natsFixture, subject, data string) {
	t.Helper()
	sub, err := f.nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond([]byte(data)) })
	require.NoError(t, err)
	require.NoError(t, f.nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func TestReplySlot_AnAnswerThatCameAfterItsCallerGaveUpIsNotTakenForTheNextRequests(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	held := make(chan string, 1)
	sub, err := f.nc.Subscribe("svc.first", func(m *nats.Msg) { held <- m.Reply }) // answered below, late
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())
	answerWith(t, f, "svc.second", `{"stream":"S","seq":2}`)

	s, err := r.take()
	require.NoError(t, err)
	_, err = s.request(testCtx(t), nc, nats.NewMsg("svc.first"), 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded, "nobody answered in time")
	require.NoError(t, f.nc.Publish(<-held, []byte(`{"stream":"S","seq":1}`)))
	require.Eventually(t, func() bool { return len(s.answer) == 1 }, 10*time.Second, time.Millisecond,
		"the late answer reached the slot")

	ack, err := s.request(testCtx(t), nc, nats.NewMsg("svc.second"), time.Minute)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), ack.Sequence, "the second request's own answer, not the late one")
}

func TestReplySlot_ACallerWaitingWhenTheConnectionClosesIsToldAtOnce(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	arrived := make(chan struct{}, 1)
	sub, err := f.nc.Subscribe("svc.silent", func(*nats.Msg) { arrived <- struct{}{} }) // never answers
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())

	s, err := r.take()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.request(context.Background(), nc, nats.NewMsg("svc.silent"), time.Hour)
		done <- err
	}()
	<-arrived
	nc.Close()
	select {
	case err := <-done:
		require.ErrorIs(t, err, nats.ErrConnectionClosed)
	case <-testCtx(t).Done():
		t.Fatal("the caller still waits after its connection closed")
	}
}

func TestReplySlot_ACallerWhoseContextEndsGetsItsContextsError(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	arrived := make(chan struct{}, 1)
	sub, err := f.nc.Subscribe("svc.silent", func(*nats.Msg) { arrived <- struct{}{} })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())

	s, err := r.take()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := s.request(ctx, nc, nats.NewMsg("svc.silent"), time.Hour)
		done <- err
	}()
	<-arrived
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// The answers a slot reads as jetstream's PublishMsg does, one row per outcome.
func TestReplySlot_ReadsEachAnswerAsJetStreamsPublishDoes(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	answerWith(t, f, "svc.stored", `{"stream":"S","seq":7}`)
	answerWith(t, f, "svc.duplicate", `{"stream":"S","seq":7,"duplicate":true}`)
	answerWith(t, f, "svc.refused", `{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}`)
	answerWith(t, f, "svc.garbled", `not json`)
	answerWith(t, f, "svc.nameless", `{"seq":7}`)

	ask := func(subject string) (*jetstream.PubAck, error) {
		s, err := r.take()
		require.NoError(t, err)
		defer r.put(s)
		return s.request(testCtx(t), nc, nats.NewMsg(subject), time.Minute)
	}
	ack, err := ask("svc.stored")
	require.NoError(t, err)
	assert.Equal(t, jetstream.PubAck{Stream: "S", Sequence: 7}, *ack)
	ack, err = ask("svc.duplicate")
	require.NoError(t, err)
	assert.True(t, ack.Duplicate)

	_, err = ask("svc.refused")
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.ErrorCode(jsErrStreamNotMatchCode), apiErr.ErrorCode)

	_, err = ask("svc.garbled")
	require.ErrorIs(t, err, jetstream.ErrInvalidJSAck)
	_, err = ask("svc.nameless")
	require.ErrorIs(t, err, jetstream.ErrInvalidJSAck, "an answer without its stream is no ack")
	_, err = ask("svc.nobody")
	require.ErrorIs(t, err, jetstream.ErrNoStreamResponse, "no responder: the server's 503")
	assert.True(t, noAnswer(err), "sent again, as a lost answer is")
}

func TestReplySlots_AreReusedAndAtMostTheBoundStaySubscribedAfterABurst(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	answerWith(t, f, "svc.stored", `{"stream":"S","seq":1}`)
	base := nc.NumSubscriptions()
	ask := func() error {
		s, err := r.take()
		if err != nil {
			return err
		}
		defer r.put(s)
		_, err = s.request(testCtx(t), nc, nats.NewMsg("svc.stored"), time.Minute)
		return err
	}

	for range 10 {
		require.NoError(t, ask())
	}
	assert.Equal(t, base+1, nc.NumSubscriptions(), "one caller at a time: one slot")

	// More callers at once than the bound: each holds its slot until all have one.
	callers := maxIdleReplySlots + 44
	var all, wg sync.WaitGroup
	all.Add(callers)
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			s, err := r.take()
			all.Done()
			if err != nil {
				errs <- err
				return
			}
			all.Wait()
			_, err = s.request(testCtx(t), nc, nats.NewMsg("svc.stored"), time.Minute)
			r.put(s)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Len(t, r.idle, maxIdleReplySlots)
	assert.Equal(t, base+maxIdleReplySlots, nc.NumSubscriptions(), "the slots over the bound unsubscribed")
	require.NoError(t, ask(), "an idle slot still answers")
}
