package main

import (
	"github.com/wavehouse/mq"
)

// worker is the ingest worker's handler: it "writes" every event (DoubleAck) and parks
// the poison one on the dead-letter queue before acking it.
func (d *demoRun) worker(msg *mq.Message) error {
	d.mu.Lock()
	d.deliveries++
	ev, ok := d.decode("worker", msg)
	alreadyParked := d.parked[ev.id()]
	d.mu.Unlock()
	if !ok {
		return msg.Ack() // nothing a redelivery could fix; the problem fails the demo
	}
	if ev.Poison && !alreadyParked {
		err := d.broker.DeadLetter(msg.Ctx, msg, mq.WithHeader("X-Error", "demo worker: poison event rejected"))
		if err != nil {
			return err // not parked: nak, so the park is tried again on redelivery
		}
		d.mu.Lock()
		d.parked[ev.id()] = true
		d.mu.Unlock()
	}
	if err := msg.DoubleAck(msg.Ctx); err != nil {
		d.mu.Lock()
		d.problem("worker: DoubleAck %s: %v", ev.id(), err)
		d.mu.Unlock()
		return nil // settled (or tried): returning the error would also nak it
	}
	d.mu.Lock()
	d.written[ev.id()] = true
	d.mu.Unlock()
	return nil
}
