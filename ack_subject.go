package mq

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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

// delivery is what a JetStream delivery's ack subject tells of it.
type delivery struct {
	streamSeq, consumerSeq, numDelivered uint64
	timestamp                            time.Time
}

// parseDelivery reads a delivery's sequences, attempt and store time from its ack
// subject, as jetstream.Msg.Metadata does, without Metadata's allocation and copies
// (measured: half the worker's per-delivery cost before its handler). The subject is
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>, or, from
// newer servers, the same with a domain and an account hash before the stream and
// possibly more tokens after the pending count; names hold no dot, so the count of
// tokens tells which.
func parseDelivery(reply string) (delivery, bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return delivery{}, false
	}
	skip := 2 // the stream and the consumer before <delivered>
	switch tokens := 2 + strings.Count(rest, ".") + 1; {
	case tokens == 9:
	case tokens >= 11: // a v2 subject may grow tokens at its end
		skip = 4 // and the domain and the account hash
	default:
		return delivery{}, false
	}
	for range skip {
		_, rest, _ = strings.Cut(rest, ".")
	}
	var nums [4]uint64 // <delivered>.<sseq>.<cseq>.<ts>
	for i := range nums {
		var token string
		token, rest, _ = strings.Cut(rest, ".")
		v, err := strconv.ParseUint(token, 10, 64)
		if err != nil {
			return delivery{}, false
		}
		nums[i] = v
	}
	return delivery{numDelivered: nums[0], streamSeq: nums[1], consumerSeq: nums[2], timestamp: time.Unix(0, int64(nums[3]))}, true
}

// deliveryOf is parseDelivery of m's ack subject, failing as jetstream.Msg.Metadata
// does on a message that is not a JetStream delivery.
func deliveryOf(m jetstream.Msg) (delivery, error) {
	if d, ok := parseDelivery(m.Reply()); ok {
		return d, nil
	}
	return delivery{}, fmt.Errorf("%w: ack subject %q", jetstream.ErrNotJSMessage, m.Reply())
}
