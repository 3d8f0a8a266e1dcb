package mq

import (
	"fmt"
	"math"
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
// tokens tells which. Each token is found once: a count, then a cut per token and
// strconv.ParseUint, took 1.5 times as long (measured, 125 ns against 80).
func parseDelivery(reply string) (delivery, bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return delivery{}, false
	}
	// ends[i] is where token i of rest ends; only the first eight are needed.
	var ends [8]int
	dots, from := 0, 0
	for ; dots < len(ends); dots++ {
		i := strings.IndexByte(rest[from:], '.')
		if i < 0 {
			break
		}
		ends[dots] = from + i
		from += i + 1
	}
	if dots == len(ends) {
		dots += strings.Count(rest[from:], ".")
	}
	first := 2 // the stream and the consumer before <delivered>
	switch tokens := 2 + dots + 1; {
	case tokens == 9:
		ends[dots] = len(rest) // <pending> ends the subject
	case tokens >= 11: // a v2 subject may grow tokens at its end
		first = 4 // after the domain and the account hash too
	default:
		return delivery{}, false
	}
	var nums [4]uint64 // <delivered>.<sseq>.<cseq>.<ts>
	for i := range nums {
		t := first + i
		v, ok := decimal(rest[ends[t-1]+1 : ends[t]])
		if !ok {
			return delivery{}, false
		}
		nums[i] = v
	}
	return delivery{numDelivered: nums[0], streamSeq: nums[1], consumerSeq: nums[2], timestamp: time.Unix(0, int64(nums[3]))}, true
}

// decimal reads s as strconv.ParseUint(s, 10, 64) does: digits alone, at least one,
// and no more than a uint64 holds.
func decimal(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		d := uint64(s[i] - '0')
		if d > 9 {
			return 0, false
		}
		// Nineteen digits never overflow; only a longer s is checked per digit.
		if i >= 19 && v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// deliveryOf is parseDelivery of m's ack subject, failing as jetstream.Msg.Metadata
// does on a message that is not a JetStream delivery.
func deliveryOf(m jetstream.Msg) (delivery, error) {
	if d, ok := parseDelivery(m.Reply()); ok {
		return d, nil
	}
	return delivery{}, fmt.Errorf("%w: ack subject %q", jetstream.ErrNotJSMessage, m.Reply())
}
