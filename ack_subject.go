package mq

import "strconv"

// builtAckSubject is the ack subject of stream seq's delivery by the durable consumer,
// for when the reply the server gave with it is gone: with the process that got it (a
// crash), or with a pull the server served as the worker released it. The server reads
// the stream sequence from the subject and needs the delivery sequence only to fall
// within what the durable has outstanding (nats-server v2.15.3, consumer.processNak):
// the last one delivered, lastDelivered, does. upstream_nak_test.go pins that.
func builtAckSubject(stream, consumer string, seq, lastDelivered uint64) string {
	return "$JS.ACK." + stream + "." + consumer + ".1." + strconv.FormatUint(seq, 10) + "." +
		strconv.FormatUint(lastDelivered, 10) + ".0.0"
}

// ackNak is a plain nak: the event goes on the durable's redelivery queue now.
var ackNak = []byte("-NAK")
