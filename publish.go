package mq

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// What the server says when it refuses a publish, and what the broker reserves.
const (
	reservedHeaderPrefix    = "nats-"
	errTextMaxBytes         = "maximum bytes exceeded"
	errTextMaxMsgsPerSubj   = "maximum messages per subject exceeded"
	errTextMaxMsgs          = "maximum messages exceeded"
	errTextAccountLimits    = "resource limits exceeded for account"
	errTextInsufficient     = "insufficient resources"
	jsErrStreamNotMatchCode = 10060
	jsErrMsgTooLargeCode    = 10054
	// The server holds too many open batches (429), on the stream or in all: atomic
	// (10210) or fast (10211). A batch ends within the server's batch timeout.
	jsErrAtomicTooManyInflight = 10210
	jsErrBatchTooManyInflight  = 10211
)

// outgoing is an event ready to send: its subject, the stream that must store it, its
// headers (its message id included) and data.
type outgoing struct {
	subject, stream string
	header          Headers
	data            []byte
	// wire is its size as nats.go counts it against the server's max payload
	// (wireSize), as a single publish sends it.
	wire int
	// span is the send's producer span, whose context header carries: the caller
	// ends it with the send's outcome (operation.end), which records its metrics.
	span *operation
}

// prepare builds the headers of an event (base, then the options, then ctx's trace
// context: the send's producer span, started by the caller), gives it its message id and checks everything that can be checked before
// a send. The id is the caller's idempotency key scoped to tenant, so two tenants'
// equal keys never collide on a stream they share (a collision is a Duplicate: the
// second event is dropped while its caller is told it was stored); without a key the
// event gets a fresh id. Publish and DeadLetter both take their id from here.
func (c *natsCore) prepare(ctx context.Context, tenant, subject, stream string, base Headers, data []byte, opts []PublishOpt) (outgoing, error) {
	h := make(Headers, len(base)+len(opts)+4)
	for k, v := range base {
		h[k] = append([]string(nil), v...)
	}
	for i, opt := range opts {
		if opt == nil { // a conditional option left unset
			return outgoing{}, fmt.Errorf("%w: publish option %d is nil", ErrInvalidConfig, i)
		}
		opt(h)
	}
	if _, ok := h[HeaderEventID]; ok {
		return outgoing{}, fmt.Errorf("%w: %q is the broker's own (a park and a redrive carry the event's ID in it)", ErrInvalidHeader, HeaderEventID)
	}
	carried, _ := ctx.Value(eventIDCarrier{}).(string)
	if carried != "" {
		h[HeaderEventID] = []string{carried}
	}
	if err := validateHeaders(h); err != nil {
		return outgoing{}, err
	}
	otel.GetTextMapPropagator().Inject(ctx, headerCarrier(h))
	id := nuid.Next()
	if key := h.Get(HeaderIdempotencyKey); key != "" {
		id = scopedID(tenant, key)
	}
	// The expected stream goes in with the id, so no send sets it again, and both
	// values share one array (measured: one allocation fewer per Publish).
	added := []string{id, stream}
	h[HeaderIdempotencyKey], h[jetstream.ExpectedStreamHeader] = added[0:1:1], added[1:2:2]
	size, limit := wireSize(h, stream, data), c.nc.MaxPayload()
	if int64(size) > limit {
		return outgoing{}, &sizeError{subject: subject, size: size, limit: limit}
	}
	// An event on a partition must leave room for its park (park_room.go). A redrive
	// (it carries its event's ID) need not: its park may hold a host's headers, and
	// one refused would stay parked for ever, while a park of it cuts its error.
	if stream != c.deadLetters && carried == "" {
		if parked := size + c.parkGrowth(h, tenant, stream); int64(parked) > limit {
			return outgoing{}, &sizeError{subject: subject, size: size, parked: parked, limit: limit}
		}
	}
	return outgoing{subject: subject, stream: stream, header: h, data: data, wire: size}, nil
}

// sizeError is prepare's ErrPayloadTooLarge: an event of size bytes as sent, or of
// parked bytes once parked (0: not the reason), that the server's limit refuses. A
// park reads from it how much to cut.
type sizeError struct {
	subject      string
	size, parked int
	limit        int64
}

func (e *sizeError) Error() string {
	if e.parked > 0 {
		return fmt.Sprintf("%v: %s: %d bytes with headers, %d once parked (the poison policy's headers added), the server accepts %d",
			ErrPayloadTooLarge, e.subject, e.size, e.parked, e.limit)
	}
	return fmt.Sprintf("%v: %s: %d bytes with headers, the server accepts %d", ErrPayloadTooLarge, e.subject, e.size, e.limit)
}

func (e *sizeError) Unwrap() error { return ErrPayloadTooLarge }

// noRetries turns off jetstream's own retries: send retries with its own bound. One
// option value for every publish, so none is built per call.
var noRetries = jetstream.WithRetryAttempts(0)

// scopedID is the message id of the caller's idempotency key key for tenant.
func scopedID(tenant, key string) string { return tenant + "." + key }

// eventID is the event's ID as Message.ID gives it, from its stored message id: the
// caller's key without the tenant scope, or the broker's own id as it is (a nuid,
// which never holds a '.', so never looks scoped).
func eventID(tenant TenantID, msgID string) string {
	return eventIDOr("", tenant, msgID)
}

// eventIDOr is eventID, unless the event carries its ID in HeaderEventID (set).
func eventIDOr(set string, tenant TenantID, msgID string) string {
	if set != "" {
		return set
	}
	// Cut without building tenant+".": Publish counts a park's size (parkGrowth)
	// with this on every call.
	if n := len(tenant); n > 0 && len(msgID) > n && msgID[n] == '.' && msgID[:n] == string(tenant) {
		return msgID[n+1:]
	}
	return msgID
}

// validateHeaders refuses header names the broker reserves ("Nats-", except the
// idempotency key) and any header NATS would not carry exactly as given. nats.go
// refuses to encode a name that is not an HTTP token; it trims blanks (space, tab) at
// either end of a value, and its decoder would skip leading ones anyway; and it
// replaces a line break with a space. Every other byte of a value round-trips
// (measured: control characters, NUL, DEL and bytes beyond ASCII). A value is never
// echoed in the error: it may be anything.
func validateHeaders(h Headers) error {
	for k, vs := range h {
		if !isToken(k) {
			return fmt.Errorf("%w: name %q is not an HTTP token: use letters, digits and %s only", ErrInvalidHeader, k, tokenPunct)
		}
		if reserved(k) && k != HeaderIdempotencyKey {
			return fmt.Errorf("%w: %q: names starting with \"Nats-\" are reserved for the broker", ErrInvalidHeader, k)
		}
		if k == HeaderIdempotencyKey && len(vs) > 1 {
			// Only one could be the key; taking the first would drop the rest silently.
			return fmt.Errorf("%w: %q: %d values, an event has one idempotency key", ErrInvalidHeader, k, len(vs))
		}
		for i, v := range vs {
			switch {
			case strings.ContainsAny(v, "\r\n"):
				return fmt.Errorf("%w: %q: value %d contains a line break", ErrInvalidHeader, k, i)
			case strings.Trim(v, " \t") != v:
				return fmt.Errorf("%w: %q: value %d starts or ends with a blank, which NATS headers do not keep", ErrInvalidHeader, k, i)
			}
		}
	}
	return nil
}

// tokenPunct are the punctuation bytes of an HTTP token (RFC 7230 tchar), exactly the
// ones nats.go encodes in a header name.
const tokenPunct = "!#$%&'*+-.^_`|~"

// isToken reports whether s is a non-empty HTTP token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if !isTokenByte(s[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte(tokenPunct, c) >= 0
}

// wireSize is what nats.go counts against the server's max payload for an event sent
// with headers h through JetStream's publish to stream: the data and the header block
// the client encodes ("NATS/1.0\r\n", one "name: value\r\n" line per value, a closing
// "\r\n"), with the expected stream's line the client adds. h must hold the message id
// already, and its values must be valid (the client trims blanks at their ends).
func wireSize(h Headers, stream string, data []byte) int {
	n := len(data) + len("NATS/1.0\r\n") + len("\r\n") + len(jetstream.ExpectedStreamHeader) + len(": \r\n") + len(stream)
	for k, vs := range h {
		if k == jetstream.ExpectedStreamHeader {
			continue // replaced by the client's
		}
		for _, v := range vs {
			n += headerLineLen(k, len(v))
		}
	}
	return n
}

// reserved reports whether header name k is the broker's own (reservedHeaderPrefix,
// in any case), without building a lower-case copy of k.
func reserved(k string) bool {
	return len(k) >= len(reservedHeaderPrefix) && strings.EqualFold(k[:len(reservedHeaderPrefix)], reservedHeaderPrefix)
}

// eventIDCarrier is the context key of the ID a park or a redrive stores in
// HeaderEventID. prepare sets the header from it alone, and refuses the header from
// the headers or options a send was given: one a host set there, on a Publish or on a
// DeadLetter of a message it built, would give another event that ID.
type eventIDCarrier struct{}

// carryingEventID is ctx with the ID id for prepare to store in HeaderEventID; "" is
// none.
func carryingEventID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, eventIDCarrier{}, id)
}

// userHeaders copies h without the broker's own headers: the "Nats-" bookkeeping ones
// and HeaderEventID.
func userHeaders(h nats.Header) Headers {
	out := make(Headers, len(h))
	for k, v := range h {
		if reserved(k) || k == HeaderEventID {
			continue
		}
		out[k] = v
	}
	return out
}

// send publishes ev and waits for the stream's confirmation. Each attempt is bounded by
// PublishTimeout; an attempt whose answer was lost is sent again, at most twice, with
// the same message id, so the stream stores it once.
func (c *natsCore) send(ctx context.Context, ev outgoing) (*jetstream.PubAck, error) {
	ack, _, err := c.sendRetrying(ctx, ev)
	return ack, err
}

// sendRetrying is send, also reporting whether an attempt before the one answered went
// unanswered: then a Duplicate answer may be this call's own first store.
func (c *natsCore) sendRetrying(ctx context.Context, ev outgoing) (ack *jetstream.PubAck, unanswered bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	// The message id and the expected stream are in the headers (prepare), rather than
	// in jetstream's options on every attempt, which would copy them.
	var lastErr error
	for attempt := 0; attempt <= publishRetries; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, publishRetryWait); err != nil {
				return nil, true, fmt.Errorf("publish %s: %w (after %v)", ev.subject, err, lastErr)
			}
		}
		ack, err := c.request(ctx, &nats.Msg{Subject: ev.subject, Data: ev.data, Header: nats.Header(ev.header)})
		if err == nil {
			return ack, attempt > 0, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, true, fmt.Errorf("publish %s: %w", ev.subject, ctxErr)
		}
		lastErr = err
		if !noAnswer(err) || c.nc.IsClosed() {
			break
		}
	}
	return nil, true, c.mapPublishError(ev, lastErr)
}

// ingestEvent prepares topic's event for its partition, its message id scoped to the
// topic's tenant (see prepare).
func (c *natsCore) ingestEvent(ctx context.Context, topic Topic, data []byte, opts []PublishOpt) (outgoing, error) {
	if err := c.checkOpen(); err != nil {
		return outgoing{}, err
	}
	if ctx == nil {
		return outgoing{}, errNilContext("publish")
	}
	subject, p, err := c.subs.ingestTopic(topic)
	if err != nil {
		return outgoing{}, fmt.Errorf("publish: %w", err)
	}
	ctx, span := c.startSend(ctx, opPublish, toIngest, p, topic.Tenant, 1)
	ev, err := c.prepare(ctx, string(topic.Tenant), subject, c.partitions[p], nil, data, opts)
	if err != nil {
		err = fmt.Errorf("publish: %w", err)
		span.end(err)
		return outgoing{}, err
	}
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingMessageID(eventIDOr(ev.header.Get(HeaderEventID), topic.Tenant, ev.header.Get(HeaderIdempotencyKey))))
	}
	ev.span = span
	return ev, nil
}

// callerKeyed reports whether message id id was made from a caller's idempotency key
// by ingestEvent: those are scoped to the tenant as "<tenant>.<key>", and a tenant has
// no dot, while a generated id (a nuid) never has one.
func callerKeyed(id string) bool { return strings.Contains(id, ".") }

// errNilContext refuses a nil context before anything is sent, reserved or requested:
// every request would panic on it. Every Broker method that takes a ctx refuses one.
func errNilContext(op string) error { return fmt.Errorf("%s: nil context: %w", op, ErrInvalidConfig) }

func cloneHeaders(h Headers) Headers {
	out := make(Headers, len(h))
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// requestOnSlot sends one attempt of a synchronous publish and waits at most
// PublishTimeout for its answer, on a reply slot (publish_reply.go). It is
// natsCore.request, unless a test loses answers in between.
func (c *natsCore) requestOnSlot(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	s, err := c.replies.take()
	if err != nil {
		return nil, err
	}
	if s == nil { // every slot in use
		actx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
		defer cancel()
		return c.js.PublishMsg(actx, msg, noRetries)
	}
	defer c.replies.put(s)
	return s.request(ctx, c.nc, msg, c.topo.PublishTimeout)
}

// noAnswer reports whether err means the answer to a publish never came: the event
// may or may not be stored, so it is sent again with the same id.
func noAnswer(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout)
}

// mapPublishError maps a publish failure onto the contract's sentinels. The server
// names a full stream only in its error text.
func (c *natsCore) mapPublishError(ev outgoing, err error) error {
	var apiErr *jetstream.APIError
	text := err.Error()
	switch {
	case c.closed.Load():
		// Whatever the connection said ("connection closed", or nats.go's own words
		// for an async reply handler it can no longer make): the broker is closed.
		return fmt.Errorf("publish %s: %w: %w", ev.subject, ErrClosed, err)
	case strings.Contains(text, errTextMaxBytes), strings.Contains(text, errTextMaxMsgsPerSubj),
		strings.Contains(text, errTextMaxMsgs), strings.Contains(text, errTextAccountLimits),
		strings.Contains(text, errTextInsufficient):
		return fmt.Errorf("%w: stream %s refused %s: %w", ErrQueueFull, ev.stream, ev.subject, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrMsgTooLargeCode:
		return fmt.Errorf("%w: stream %s refused %s: %w", ErrPayloadTooLarge, ev.stream, ev.subject, err)
	case tooManyBatches(err):
		return fmt.Errorf("%w: stream %s holds too many open batches, retry later: %w", ErrUnavailable, ev.stream, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamNotMatchCode:
		c.lostTopology(ev.stream, err)
		return fmt.Errorf("%w: %s is not stored by stream %s: %w", ErrUnavailable, ev.subject, ev.stream, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse) && c.nc.IsConnected() && c.streamMissing(ev.stream):
		c.lostTopology(ev.stream, err)
		return fmt.Errorf("%w: publish %s: stream %s does not exist: %w", ErrUnavailable, ev.subject, ev.stream, err)
	case noAnswer(err), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: publish %s to stream %s: %w", ErrUnavailable, ev.subject, ev.stream, err)
	}
	return fmt.Errorf("publish %s to stream %s: %w", ev.subject, ev.stream, err)
}

// streamMissing tells a deleted stream from a slow one, bounded by PublishTimeout.
func (c *natsCore) streamMissing(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	_, err := c.js.Stream(ctx, name)
	return errors.Is(err, jetstream.ErrStreamNotFound)
}

// headerCarrier lets the OpenTelemetry propagator read and write Headers with exact
// keys (http.Header would canonicalise them).
type headerCarrier Headers

func (h headerCarrier) Get(key string) string { return Headers(h).Get(key) }
func (h headerCarrier) Set(key, value string) { Headers(h).Set(key, value) }
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
