package mq

// Headers are an event's headers. Keys are exact: case-sensitive and never
// canonicalised. The shape is that of NATS and HTTP headers.
//
// Every header is delivered exactly as published, or refused with ErrInvalidHeader
// before anything is sent, on Publish and DeadLetter alike (a parked message's own
// headers included). Refused: a name that is not an HTTP token (RFC 7230: letters,
// digits and !#$%&'*+-.^_`|~ only, so no "/", "(", "@", "=", ",", blank, byte beyond
// ASCII or control character), and a value with a line break (CR or LF) or with a
// blank (space or tab) at either end, which NATS headers cannot carry. Any other
// value is kept byte for byte: blanks inside, control characters, NUL, DEL, UTF-8 and
// bytes that are not UTF-8.
type Headers map[string][]string

// Add appends value to key's values.
func (h Headers) Add(key, value string) { h[key] = append(h[key], value) }

// Set replaces key's values with value.
func (h Headers) Set(key, value string) { h[key] = []string{value} }

// Get returns key's first value, or "".
func (h Headers) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// The headers the poison policy adds to an event it parks (ConsumerConfig.MaxDeliveries),
// beside the event's own.
const (
	// HeaderDeadReason is why the broker parked it: DeadReasonHandlerFailed or
	// DeadReasonVanished.
	HeaderDeadReason = "Mq-Dead-Reason"
	// HeaderDeadError is the handler's last error, on one line, cut to 1 KiB, and
	// further (to 128 bytes or less) when the event is near the server's max payload.
	HeaderDeadError = "Mq-Dead-Error"
	// HeaderDeadAttempts is the number of deliveries, in decimal.
	HeaderDeadAttempts = "Mq-Dead-Attempts"
	// HeaderDeadPartition and HeaderDeadSequence are the delivery unit the event was
	// read from and its sequence there.
	HeaderDeadPartition = "Mq-Dead-Partition"
	HeaderDeadSequence  = "Mq-Dead-Sequence"
	// HeaderDeadFirstAttempt and HeaderDeadLastAttempt are the first attempt the
	// parking worker saw and its last one, RFC 3339 in UTC with nanoseconds.
	HeaderDeadFirstAttempt = "Mq-Dead-First-Attempt"
	HeaderDeadLastAttempt  = "Mq-Dead-Last-Attempt"
)

// DeadReasonHandlerFailed is HeaderDeadReason of an event parked because the handler
// returned an error (or panicked) on its last delivery allowed.
const DeadReasonHandlerFailed = "handler-failed"

// DeadReasonVanished is HeaderDeadReason of a failed event parked from the worker's
// copy because its partition lost it before its retry (a cluster's leader-change race,
// an operator's delete or purge), while no other worker could have had it. The other
// headers are as for DeadReasonHandlerFailed, Mq-Dead-Error the handler's last error.
const DeadReasonVanished = "vanished"

// HeaderEventID is the broker's own header carrying an event's Message.ID where its
// idempotency key had to differ. A park sets it to the parked event's ID, and a
// redrive, which stores the event under a key of its park (so a retried redrive stores
// it once), keeps it: the redriven event's deliveries carry the ID its first ones did,
// for idempotent writes. No Message.Headers shows it, and a Publish or DeadLetter
// carrying it (as an option, or among a parked message's headers) is refused with
// ErrInvalidHeader: a park takes the ID from Message.ID alone, which on a delivered
// message is its event's (a message a host builds with WithDelivery carries the ID it
// was given).
const HeaderEventID = "Mq-Event-Id"

// HeaderIdempotencyKey is the header WithIdempotencyKey sets. A broker stores at most
// one event per key within its duplicate window and reports the repeats as success.
const HeaderIdempotencyKey = "Nats-Msg-Id"

// PublishOpt edits the headers of an event being published or parked. The map is never
// nil when an option runs. A nil PublishOpt is refused with ErrInvalidConfig before
// anything is sent.
type PublishOpt func(h Headers)

// WithHeader appends a header value; two calls with one key keep both values. Keys
// under the broker's reserved prefix (in any case; "Nats-" on the NATS brokers) are
// refused with ErrInvalidHeader, except HeaderIdempotencyKey, which WithIdempotencyKey
// sets (given twice, it is refused too: an event has one key); so are the names and
// values [Headers] cannot carry. Every other name reaches the consumer as published.
func WithHeader(key, value string) PublishOpt { return func(h Headers) { h.Add(key, value) } }

// WithIdempotencyKey makes the publish or park idempotent: a second one with the same
// key within the broker's duplicate window is dropped and reported as success. Keys are
// scoped to the tenant: two tenants' equal keys never collide, on Publish or on
// DeadLetter. Like every option, a later WithIdempotencyKey replaces an earlier one.
func WithIdempotencyKey(key string) PublishOpt {
	return func(h Headers) { h.Set(HeaderIdempotencyKey, key) }
}
