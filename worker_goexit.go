package mq

import "errors"

// A handler that ends its goroutine: runtime.Goexit, which t.FailNow and testify's
// require call inside a handler under test. It neither returns nor panics, so
// handle's recover never sees it; the code after the call never runs.

// errHandlerExited is the error a handler call that ended its goroutine counts as.
var errHandlerExited = errors.New("the handler ended its goroutine (runtime.Goexit, as t.FailNow and require do)")

// call runs e's handler call with d.mu let go, then settles its outcome with d.mu held
// again, as runLanes holds it. A call that ends its goroutine is settled here, in the
// deferred function, as a failed one (exited); without it the pool's goroutine died
// holding a lane that never ran again, and runLanes's deferred Unlock of a mutex let
// go crashed the process ("sync: unlock of unlocked mutex").
func (d *dispatcher) call(l *lane, u *unit, e *entry, t *tries) {
	returned := false
	defer func() {
		if !returned {
			d.exited(l, u, e, t)
		}
	}()
	d.mu.Unlock()
	hold := d.run(e, t)
	returned = true
	d.mu.Lock()
	d.settleCall(l, u, e, t, hold)
}

// exited settles e, whose handler call ended its goroutine, as failed with
// errHandlerExited (retried, or parked on its last delivery), and hands the goroutine's
// place in the pool to a new one. It runs as the goroutine ends, and returns with d.mu
// held: runLanes's deferred Unlock lets go of it.
func (d *dispatcher) exited(l *lane, u *unit, e *entry, t *tries) {
	d.core.log.Error("mq: a handler ended its goroutine; treated as its error", "topic", e.msg.key,
		"stream", d.core.partitions[e.part], "seq", e.seq, "error", errHandlerExited)
	hold := d.fail(e.msg.Ctx, e, t, errHandlerExited)
	d.mu.Lock()
	d.settleCall(l, u, e, t, hold)
	d.started--
	if d.ready.len() > 0 {
		d.wakeOne()
	}
}
