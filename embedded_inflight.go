package mq

import "github.com/nats-io/nats.go/jetstream"

// What the ingest durable had delivered and not seen settled when the store was last
// open: events in flight at a crash, and events Close handed back.
//
// The server brings them back only once their ack wait runs out (a minute by default),
// and a start that ends before that, with no Consume, moves the wait on again:
// nats-server v2.15.3 re-times every pending event it queues for redelivery at a
// start (consumer.checkPending). Without a listener nothing but this process can hold
// a delivery from the store: the store is locked to it, and nothing was delivered
// since the server started. So none of them is being handled anywhere, and the boot
// naks each, in sequence order, which puts it on the redelivery queue: the first pull
// gets them at once, with their delivery counts kept. The naks are not waited for, and
// an event whose ack wait ran out while the store was closed is queued first, so they
// may not come in sequence order; the worker's backlog (see returning) keeps each
// tenant's in order. With a listener, a worker in
// another process may still hold one and settle it after it reconnects, so the boot
// leaves them to their ack wait.
//
// nats.go's ResetConsumer, the maintained way to redeliver, was measured and not
// chosen: it moves the durable back to its ack floor, so every event acknowledged out
// of order above the floor that the partition still stores is delivered again (42 of
// 48 in the restart matrix's out-of-order cell), and every delivery count restarts.

// redeliverInFlight naks seqs, partition stream's events stored above the ingest
// durable's ack floor and delivered before the start, as info found the durable. An
// event among them that was acknowledged out of order is not pending, and the server
// ignores its nak. A nak that cannot be sent leaves its event to the ack wait.
func (e *EmbeddedNATS) redeliverInFlight(stream string, info *jetstream.ConsumerInfo, seqs []uint64) {
	if e.listening || len(seqs) == 0 || info.NumAckPending == 0 {
		return
	}
	// The reply subject the server gave each delivery is gone with the process that
	// got it.
	for _, seq := range seqs {
		if err := e.nc.Publish(builtAckSubject(stream, info.Name, seq, info.Delivered.Consumer), ackNak); err != nil {
			e.log.Warn("mq: cannot put back the events in flight at the last stop; the ack wait redelivers them",
				"stream", stream, "consumer", info.Name, "error", err)
			return
		}
	}
	e.log.Info("mq: events delivered before the start and never settled are delivered again at once",
		"stream", stream, "consumer", info.Name, "pending", info.NumAckPending)
}
