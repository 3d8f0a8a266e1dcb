package mq

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// The room Publish keeps for a park. The poison policy parks an event with headers it
// did not have (HeaderDead*, HeaderEventID, a longer message id), so an event stored
// at the server's max payload could never be parked: its park was refused as too
// large on every try, and its tenant waited behind it for ever. Publish therefore
// refuses an event unless its park fits too, with the first minDeadErrorLen bytes of
// the handler's error; a park cuts the error to what the server takes
// (prepareFitting).

// minDeadErrorLen is how much of the handler's error (HeaderDeadError) the room Publish
// keeps for a park holds.
const minDeadErrorLen = 128

// deadHeadersRoom is the size of the HeaderDead* lines of a park at their widest, the
// error at minDeadErrorLen, beside the partition's number.
var deadHeadersRoom = func() int {
	widestTime := len(time.Date(2006, 1, 2, 15, 4, 5, 999999999, time.UTC).Format(time.RFC3339Nano))
	return headerLineLen(HeaderDeadReason, len(DeadReasonHandlerFailed)) +
		headerLineLen(HeaderDeadAttempts, len(strconv.Itoa(math.MaxInt))) +
		headerLineLen(HeaderDeadSequence, maxSeqDigits) +
		headerLineLen(HeaderDeadFirstAttempt, widestTime) + headerLineLen(HeaderDeadLastAttempt, widestTime) +
		headerLineLen(HeaderDeadError, minDeadErrorLen)
}()

// maxSeqDigits is the length of the largest sequence in decimal.
var maxSeqDigits = len(strconv.FormatUint(math.MaxUint64, 10))

// parkKey is the idempotency key of the poison policy's park of event id, read at
// seq from partition part: one park per event, even when the park or its ack is
// retried.
func parkKey(part int, seq uint64, id string) string {
	return fmt.Sprintf("%s%d.%d.%s", parkKeyPrefix, part, seq, id)
}

const parkKeyPrefix = "mq-park."

// parkGrowth is how many bytes the poison policy's park of an event adds to its size
// as prepare built it for partition stream with headers h (message id included): the
// park's message id, HeaderEventID and HeaderDead* lines at their widest, and the
// dead-letter stream's name, less the lines the park replaces. The event's own
// headers, trace context included, are parked as they are.
func (c *natsCore) parkGrowth(h Headers, tenant, stream string) int {
	msgID, carried := h.Get(HeaderIdempotencyKey), h.Get(HeaderEventID)
	id := eventIDOr(carried, TenantID(tenant), msgID)
	lastPart := len(c.partitions) - 1
	own := headerLineLen(HeaderIdempotencyKey, len(msgID)) + len(stream)
	if carried != "" {
		own += headerLineLen(HeaderEventID, len(carried))
	}
	park := headerLineLen(HeaderIdempotencyKey, len(tenant)+len(".")+parkKeyLen(lastPart, id)) +
		headerLineLen(HeaderEventID, len(id)) + len(c.deadLetters) +
		headerLineLen(HeaderDeadPartition, digits(lastPart)) + deadHeadersRoom
	return park - own
}

// parkKeyLen is the longest parkKey of event id from partition part, counted rather
// than built: Publish counts it on every call.
func parkKeyLen(part int, id string) int {
	return len(parkKeyPrefix) + digits(part) + len(".") + maxSeqDigits + len(".") + len(id)
}

// headerLineLen is the size of one header line of name k and a value n bytes long,
// as nats.go encodes it ("k: v\r\n").
func headerLineLen(k string, n int) int { return len(k) + len(": \r\n") + n }
