package mqtest_test

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/wavehouse/mq"
)

// memSub is one Subscribe: the events stored since it began, handed to its handler one
// at a time by its own goroutine.
type memSub struct {
	ctx     context.Context
	handler mq.Handler
	queue   []*memEvent
	wake    chan struct{}
	done    chan struct{}
}

func (b *memBroker) Subscribe(ctx context.Context, _ string, handler mq.Handler) error {
	if handler == nil {
		return fmt.Errorf("mem: subscribe: %w: nil handler", mq.ErrInvalidConfig)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed("subscribe")
	}
	s := &memSub{ctx: ctx, handler: handler, wake: make(chan struct{}, 1), done: make(chan struct{})}
	b.subs[s] = true
	go b.runSub(s)
	return nil
}

func (b *memBroker) runSub(s *memSub) {
	defer close(s.done)
	for {
		b.mu.Lock()
		if b.closed || s.ctx.Err() != nil {
			delete(b.subs, s)
			b.mu.Unlock()
			return
		}
		if len(s.queue) == 0 {
			b.mu.Unlock()
			select {
			case <-s.wake:
			case <-s.ctx.Done():
			case <-b.quit:
			}
			continue
		}
		ev := s.queue[0]
		s.queue = s.queue[1:]
		b.stats.OutMsgs++
		b.stats.OutBytes += int64(len(ev.data))
		b.mu.Unlock()
		ctx := otel.GetTextMapPropagator().Extract(s.ctx, memCarrier(ev.headers))
		_ = call(s.handler, ev.message(ctx, 1)) // the hub has nothing to redeliver
	}
}

// call runs handler, turning a panic into an error as mq.Handler says.
func call(handler mq.Handler, m *mq.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mem: handler panicked on %s: %v", m.TopicKey(), r)
		}
	}()
	return handler(m)
}

func (b *memBroker) ReplaySince(ctx context.Context, tp mq.Topic, since time.Time, send func(*mq.Message) bool) error {
	key, err := tp.Key()
	if err != nil {
		return err
	}
	if send == nil {
		return fmt.Errorf("mem: replay of %s: send is nil: %w", tp, mq.ErrInvalidConfig)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errClosed("replay")
	}
	// The history as it is now: a replay never chases the live tail.
	var history []*memEvent
	for _, ev := range b.log {
		if ev.key == key && !ev.stored.Before(since) {
			history = append(history, ev)
		}
	}
	b.mu.Unlock()
	for _, ev := range history {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.mu.Lock()
		closed := b.closed
		b.mu.Unlock()
		if closed {
			return errClosed("replay")
		}
		if !send(ev.message(ctx, 1)) {
			return nil
		}
	}
	return nil
}
