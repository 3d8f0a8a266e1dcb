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

func TestReplySlot_ASlotWhoseRequestGotNoAnswerIsDroppedSoItsLateAnswerReachesNoLaterCaller(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	held := make(chan string, 1)
	sub, err := f.nc.Subscribe("svc.first", func(m *nats.Msg) { held <- m.Reply }) // answered below, late
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())
	answerWith(t, f, "svc.second", `{"stream":"S","seq":2}`)
	base := nc.NumSubscriptions()

	s, err := r.take()
	require.NoError(t, err)
	_, err = s.request(testCtx(t), nc, nats.NewMsg("svc.first"), 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded, "nobody answered in time")
	r.put(s)
	assert.False(t, s.sub.IsValid(), "the slot was unsubscribed")
	assert.Equal(t, base, nc.NumSubscriptions())
	assert.Zero(t, r.open)
	require.NoError(t, f.nc.Publish(<-held, []byte(`{"stream":"S","seq":1}`)))
	require.NoError(t, f.nc.Flush())

	next, err := r.take()
	require.NoError(t, err)
	defer r.put(next)
	ack, err := next.request(testCtx(t), nc, nats.NewMsg("svc.second"), time.Minute)
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
	r.put(s)
	assert.Empty(t, r.idle, "a slot left waiting is not reused")
	assert.False(t, s.sub.IsValid())
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

func TestReplySlots_AreReusedAndNoMoreThanTheBoundAreSubscribed(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	const bound = 4
	r := &replySlots{nc: nc, max: bound}
	answerWith(t, f, "svc.stored", `{"stream":"S","seq":1}`)
	base := nc.NumSubscriptions()
	ask := func(s *replySlot) error {
		_, err := s.request(testCtx(t), nc, nats.NewMsg("svc.stored"), time.Minute)
		return err
	}

	for range 10 {
		s, err := r.take()
		require.NoError(t, err)
		require.NoError(t, ask(s))
		r.put(s)
	}
	assert.Equal(t, base+1, nc.NumSubscriptions(), "one caller at a time: one slot")

	var held []*replySlot
	for range bound {
		s, err := r.take()
		require.NoError(t, err)
		require.NotNil(t, s)
		held = append(held, s)
	}
	s, err := r.take()
	require.NoError(t, err)
	assert.Nil(t, s, "every slot in use: the caller uses nats.go's request")
	assert.Equal(t, base+bound, nc.NumSubscriptions())
	for _, s := range held {
		require.NoError(t, ask(s))
		r.put(s)
	}
	s, err = r.take()
	require.NoError(t, err)
	require.NotNil(t, s, "given back, a slot serves the next caller")
	require.NoError(t, ask(s))
	r.put(s)
	assert.Equal(t, base+bound, nc.NumSubscriptions())
}

func TestEmbeddedNATS_PublishersBeyondTheReplySlotsAreEachStoredAndConfirmed(t *testing.T) {
	e := openEmbedded(t, "")
	e.core.replies.max = 1 // before any publish
	ctx := testCtx(t)
	require.NoError(t, e.SetMaxBytes(ctx, "acme", 1<<20))
	topic := Topic{Tenant: "acme", Table: "t"}
	const callers = 16
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			for range 10 {
				if err := e.Publish(ctx, topic, []byte("x")); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "caller %d", i)
	}
	s, err := e.js.Stream(ctx, e.core.partitions[Partition("acme", e.topo.Partitions)])
	require.NoError(t, err)
	assert.Equal(t, uint64(callers*10), s.CachedInfo().State.Msgs, "every event stored once")
	assert.Equal(t, 1, e.core.replies.open, "the one slot, the rest through nats.go's request")
}

// panicOnDone is a context whose Done panics: only the send itself calls it (Publish
// checks Err first), so the panic comes while the event is on its way.
type panicOnDone struct{ context.Context }

func (panicOnDone) Done() <-chan struct{} { panic("mq test: Done called") }

func TestReplySlot_ASlotWhoseWaitPanickedIsDroppedNotGivenToTheNextCaller(t *testing.T) {
	f := newNATSFixture(t)
	nc := replyConn(t, f)
	r := &replySlots{nc: nc}
	answerWith(t, f, "svc.stored", `{"stream":"S","seq":1}`)

	s, err := r.take()
	require.NoError(t, err)
	require.PanicsWithValue(t, "mq test: Done called", func() {
		defer r.put(s)
		_, _ = s.request(panicOnDone{testCtx(t)}, nc, nats.NewMsg("svc.stored"), time.Minute)
	})
	assert.Empty(t, r.idle, "its answer may still come: the slot is dropped")
	assert.False(t, s.sub.IsValid())
	assert.Zero(t, r.busy)
}
