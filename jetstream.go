package mq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel"
)

// natsCore is the JetStream data path both NATS brokers share, over the topology of
// NATSTopology: publishing to the tenant's partition with the expected stream and
// idempotent retries, the hub, bounded replay, the worker's pull per partition, and
// dead letters. The brokers differ in who owns the topology and in budgets.
type natsCore struct {
	topo NATSTopology
	subs subjects
	nc   *nats.Conn
	js   jetstream.JetStream
	log  *slog.Logger

	// partitions[p] and deadLetters name the streams found for partition p and for
	// dead letters: the topology's names in EmbeddedNATS, the operator's in ExternalNATS.
	partitions  []string
	deadLetters string

	// settler wraps each message the worker receives, so a broker can observe its
	// settlement (EmbeddedNATS releases the tenant's budget on ack).
	settler func(m jetstream.Msg) Settler
	// lostTopology is told when a publish finds its stream gone or its subject held
	// by another stream.
	lostTopology func(stream string, err error)

	closed   atomic.Bool
	mu       sync.Mutex
	nextID   int
	stoppers map[int]func()
}

// Publish and replay bounds.
const (
	replayBatch = 256
	// pullExpiry and pullHeartbeat bound how long a worker's pull can stall: nats.go
	// v1.55.0 skips a top-up pull while one is in flight, and only the heartbeat
	// monitor (twice the heartbeat) restarts it. Measured: with the defaults (30 s,
	// 15 s) a loaded machine stalled delivery ~30 s in about 1 of 30 runs; with these,
	// 0 of 45.
	pullExpiry              = 5 * time.Second
	pullHeartbeat           = time.Second
	replayPullWait          = 2 * time.Second
	ephemeralInactive       = time.Minute
	consumerDeleteTimeout   = time.Second
	headerOverheadEstimate  = 64 // "NATS/1.0\r\n", the message id and the expected stream
	reservedHeaderPrefix    = "nats-"
	errTextMaxBytes         = "maximum bytes exceeded"
	errTextMaxMsgsPerSubj   = "maximum messages per subject exceeded"
	errTextMaxMsgs          = "maximum messages exceeded"
	errTextAccountLimits    = "resource limits exceeded for account"
	errTextInsufficient     = "insufficient resources"
	jsErrStreamNotMatchCode = 10060
	jsErrMsgTooLargeCode    = 10054
)

func newNATSCore(topo NATSTopology, nc *nats.Conn, js jetstream.JetStream, log *slog.Logger) *natsCore {
	c := &natsCore{
		topo: topo, subs: topo.subjects(), nc: nc, js: js, log: log,
		deadLetters:  topo.DeadLetterStream(),
		settler:      func(m jetstream.Msg) Settler { return m },
		lostTopology: func(string, error) {},
		stoppers:     make(map[int]func()),
	}
	for p := range topo.Partitions {
		c.partitions = append(c.partitions, topo.PartitionStream(p))
	}
	return c
}

// track registers stop to run at Close. It reports false once the broker is closing.
func (c *natsCore) track(stop func()) (id int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return 0, false
	}
	c.nextID++
	c.stoppers[c.nextID] = stop
	return c.nextID, true
}

func (c *natsCore) untrack(id int) {
	c.mu.Lock()
	delete(c.stoppers, id)
	c.mu.Unlock()
}

// stopAll marks the broker closed and stops every consumer and subscription, so none
// reports failed when the connection goes. It reports false if it already ran.
func (c *natsCore) stopAll() bool {
	c.mu.Lock()
	if c.closed.Swap(true) {
		c.mu.Unlock()
		return false
	}
	stoppers := c.stoppers
	c.stoppers = nil
	c.mu.Unlock()
	for _, stop := range stoppers {
		stop()
	}
	return true
}

func (c *natsCore) checkOpen() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// outgoing is an event ready to send: its subject, the stream that must store it, its
// headers and data.
type outgoing struct {
	subject, stream string
	header          Headers
	data            []byte
}

// prepare builds the headers of an event from the options and ctx's trace context
// and checks everything that can be checked before a send.
func (c *natsCore) prepare(ctx context.Context, subject, stream string, base Headers, data []byte, opts []PublishOpt) (outgoing, error) {
	h := make(Headers, len(base)+2)
	for k, v := range base {
		h[k] = append([]string(nil), v...)
	}
	for _, opt := range opts {
		opt(h)
	}
	if err := validateHeaders(h); err != nil {
		return outgoing{}, err
	}
	otel.GetTextMapPropagator().Inject(ctx, headerCarrier(h))
	if size, limit := len(data)+headerSize(h)+headerOverheadEstimate, c.nc.MaxPayload(); int64(size) > limit {
		return outgoing{}, fmt.Errorf("%w: %s: %d bytes with headers, the server accepts %d",
			ErrPayloadTooLarge, subject, size, limit)
	}
	return outgoing{subject: subject, stream: stream, header: h, data: data}, nil
}

// validateHeaders refuses header names the broker reserves ("Nats-", except the
// idempotency key) and names or values that cannot be written on the wire.
func validateHeaders(h Headers) error {
	for k, vs := range h {
		if k == "" || strings.ContainsAny(k, ": \t\r\n") {
			return fmt.Errorf("%w: name %q", ErrInvalidHeader, k)
		}
		if strings.HasPrefix(strings.ToLower(k), reservedHeaderPrefix) && k != HeaderIdempotencyKey {
			return fmt.Errorf("%w: %q: names starting with \"Nats-\" are reserved for the broker", ErrInvalidHeader, k)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") {
				return fmt.Errorf("%w: %q: value contains a line break", ErrInvalidHeader, k)
			}
		}
	}
	return nil
}

func headerSize(h Headers) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // ": " and CRLF
		}
	}
	return n
}

// userHeaders copies h without the broker's own "Nats-" bookkeeping headers.
func userHeaders(h nats.Header) Headers {
	out := make(Headers, len(h))
	for k, v := range h {
		if strings.HasPrefix(strings.ToLower(k), reservedHeaderPrefix) {
			continue
		}
		out[k] = v
	}
	return out
}

// send publishes ev and waits for the stream's confirmation. Each attempt is bounded by
// PublishTimeout; an attempt whose answer was lost is sent again, at most twice, with
// the same message id, so the stream stores it once.
// It also reports whether it sent more than once, so a Duplicate answer can be told
// from a repeat of the caller's own earlier publish.
func (c *natsCore) send(ctx context.Context, ev outgoing) (ack *jetstream.PubAck, retried bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	id := ev.header.Get(HeaderIdempotencyKey)
	if id == "" {
		id = nuid.Next()
	}
	var lastErr error
	for attempt := 0; attempt <= publishRetries; attempt++ {
		if attempt > 0 {
			retried = true
			if err := sleepCtx(ctx, publishRetryWait); err != nil {
				return nil, retried, fmt.Errorf("publish %s: %w (after %v)", ev.subject, err, lastErr)
			}
		}
		msg := &nats.Msg{Subject: ev.subject, Data: ev.data, Header: nats.Header(cloneHeaders(ev.header))}
		actx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
		ack, err := c.js.PublishMsg(actx, msg,
			jetstream.WithMsgID(id), jetstream.WithExpectStream(ev.stream), jetstream.WithRetryAttempts(0))
		cancel()
		if err == nil {
			return ack, retried, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, retried, fmt.Errorf("publish %s: %w", ev.subject, ctxErr)
		}
		lastErr = err
		if !noAnswer(err) || c.nc.IsClosed() {
			break
		}
	}
	return nil, retried, c.mapPublishError(ev, lastErr)
}

// ingestEvent prepares topic's event for its partition, with a message id: a fresh
// one, or the caller's idempotency key scoped to the tenant, so two tenants' keys
// never collide on a shared partition.
func (c *natsCore) ingestEvent(ctx context.Context, topic Topic, data []byte, opts []PublishOpt) (outgoing, error) {
	if err := c.checkOpen(); err != nil {
		return outgoing{}, err
	}
	subject, p, err := c.subs.ingestTopic(topic)
	if err != nil {
		return outgoing{}, fmt.Errorf("publish: %w", err)
	}
	ev, err := c.prepare(ctx, subject, c.partitions[p], nil, data, opts)
	if err != nil {
		return outgoing{}, fmt.Errorf("publish: %w", err)
	}
	if key := ev.header.Get(HeaderIdempotencyKey); key != "" {
		ev.header.Set(HeaderIdempotencyKey, string(topic.Tenant)+"."+key)
	} else {
		ev.header.Set(HeaderIdempotencyKey, nuid.Next())
	}
	return ev, nil
}

func cloneHeaders(h Headers) Headers {
	out := make(Headers, len(h))
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// noAnswer reports whether err means the answer to a publish never came: the event
// may or may not be stored, so it is sent again with the same id.
func noAnswer(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// mapPublishError maps a publish failure onto the contract's sentinels. The server
// names a full stream only in its error text.
func (c *natsCore) mapPublishError(ev outgoing, err error) error {
	var apiErr *jetstream.APIError
	text := err.Error()
	switch {
	case strings.Contains(text, errTextMaxBytes), strings.Contains(text, errTextMaxMsgsPerSubj),
		strings.Contains(text, errTextMaxMsgs), strings.Contains(text, errTextAccountLimits),
		strings.Contains(text, errTextInsufficient):
		return fmt.Errorf("%w: stream %s refused %s: %w", ErrQueueFull, ev.stream, ev.subject, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrMsgTooLargeCode:
		return fmt.Errorf("%w: stream %s refused %s: %w", ErrPayloadTooLarge, ev.stream, ev.subject, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamNotMatchCode:
		c.lostTopology(ev.stream, err)
		return fmt.Errorf("%w: %s is not stored by stream %s: %w", ErrUnavailable, ev.subject, ev.stream, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse) && c.nc.IsConnected() && c.streamMissing(ev.stream):
		c.lostTopology(ev.stream, err)
		return fmt.Errorf("%w: publish %s: stream %s does not exist: %w", ErrUnavailable, ev.subject, ev.stream, err)
	case noAnswer(err), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrStreamNotFound):
		if c.closed.Load() {
			return fmt.Errorf("publish %s: %w: %w", ev.subject, ErrClosed, err)
		}
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

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
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

// message builds the Message for a delivered JetStream message.
func (c *natsCore) message(ctx context.Context, m jetstream.Msg, settler Settler) *Message {
	var ts time.Time
	if meta, err := m.Metadata(); err == nil {
		ts = meta.Timestamp
	}
	return newKeyedMessage(ctx, c.subs.keyOrSubject(m.Subject()), m.Data(),
		WithTimestamp(ts), WithMessageHeaders(userHeaders(m.Headers())), WithSettler(settler))
}

// subscribe runs the hub: an ordered, ack-less consumer on the history from the next
// event on, one per call, so every process sees every event.
func (c *natsCore) subscribe(ctx context.Context, handler Handler) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if handler == nil {
		return errors.New("subscribe: nil handler")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// From the sequence after the last one stored, not "new": an ordered consumer that
	// resets after a reconnect before its first event would start "new" again and skip
	// what was stored meanwhile.
	last, err := c.historyLastSeq(ctx)
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	cons, err := c.js.OrderedConsumer(ctx, c.topo.HistoryStream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{c.subs.ingestAll()},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       last + 1,
		InactiveThreshold: ephemeralInactive,
	})
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	var stopped atomic.Bool
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if stopped.Load() {
			return
		}
		msg := c.message(ctx, m, nil)
		msg.Ctx = otel.GetTextMapPropagator().Extract(ctx, headerCarrier(msg.Headers))
		if err := handler(msg); err != nil {
			c.log.Warn("mq: hub handler failed; the hub has no redelivery", "topic", msg.key, "error", err)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !stopped.Load() {
			c.log.Debug("mq: hub consumer reported", "error", err)
		}
	}))
	if err != nil {
		return c.mapRequestError("subscribe: history "+c.topo.HistoryStream, err)
	}
	done := make(chan struct{})
	stop := sync.OnceFunc(func() {
		stopped.Store(true) // no handler call starts after this
		// An ordered consumer's Stop waits for its lock, which a reset retry (history
		// unreachable) holds for up to ~20 s; Close must not wait for that. Once the
		// connection closes the retry fails at once and this returns.
		go cc.Stop()
		close(done)
	})
	id, ok := c.track(stop)
	if !ok {
		stop()
		return ErrClosed
	}
	go func() {
		select {
		case <-ctx.Done():
			stop()
			c.untrack(id)
		case <-done:
		}
	}()
	return nil
}

// mapRequestError wraps a failed JetStream API request: ErrClosed after Close,
// ErrUnavailable when no answer came or the connection is gone.
func (c *natsCore) mapRequestError(what string, err error) error {
	switch {
	case c.closed.Load():
		return fmt.Errorf("%s: %w: %w", what, ErrClosed, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", what, err)
	case noAnswer(err), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// replay sends every event of topic in the history stored at or after since, up to
// the history's last sequence when the replay began: the count the server reported
// bounds the batches, and the sequence bound keeps an event that aged out meanwhile
// from being replaced by one from the live tail.
func (c *natsCore) replay(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	subject, _, err := c.subs.ingestTopic(topic)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	last, err := c.historyLastSeq(ctx)
	if err != nil {
		return c.mapRequestError("replay "+subject, err)
	}
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     subject,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: ephemeralInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if !since.IsZero() {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &since
	}
	cons, err := c.js.CreateConsumer(ctx, c.topo.HistoryStream, cfg)
	if err != nil {
		return c.mapRequestError("replay "+subject, err)
	}
	defer c.deleteConsumer(c.topo.HistoryStream, cons.CachedInfo().Name)
	remaining := cons.CachedInfo().NumPending
	for remaining > 0 {
		batch, err := cons.Fetch(int(min(remaining, replayBatch)), jetstream.FetchMaxWait(replayPullWait))
		if err != nil {
			return c.mapRequestError("replay "+subject, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			remaining--
			if meta, err := m.Metadata(); err == nil && meta.Sequence.Stream > last {
				return nil // stored after the replay began: the live subscription has it
			}
			if !send(c.message(ctx, m, nil)) {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if c.closed.Load() {
				return fmt.Errorf("replay %s: %w", subject, ErrClosed)
			}
			if remaining == 0 {
				break
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return c.mapRequestError("replay "+subject, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if got == 0 {
			if !c.nc.IsConnected() {
				return fmt.Errorf("%w: replay %s: not connected", ErrUnavailable, subject)
			}
			// Nothing came: done if the history aged out what was left, else a pull
			// was lost (a quick reconnect) and the next one asks again.
			info, err := cons.Info(ctx)
			if err != nil {
				return c.mapRequestError("replay "+subject, err)
			}
			if info.NumPending == 0 {
				return nil
			}
			remaining = min(remaining, info.NumPending)
		}
	}
	return nil
}

// historyLastSeq is the history's last sequence now.
func (c *natsCore) historyLastSeq(ctx context.Context) (uint64, error) {
	s, err := c.js.Stream(ctx, c.topo.HistoryStream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}

// deleteConsumer removes an ephemeral consumer, best effort: its inactive threshold
// removes it anyway.
func (c *natsCore) deleteConsumer(stream, name string) {
	if !c.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumerDeleteTimeout)
	defer cancel()
	_ = c.js.DeleteConsumer(ctx, stream, name)
}

// deadLetter parks msg's data and headers under its own topic key on the dead-letter
// stream, with a fresh message id.
func (c *natsCore) deadLetter(ctx context.Context, msg *Message, opts []PublishOpt) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if msg == nil || msg.key == "" {
		return fmt.Errorf("%w: dead letter: the message has no topic key", ErrInvalidTopic)
	}
	base := make(Headers, len(msg.Headers))
	for k, v := range msg.Headers {
		if !strings.HasPrefix(strings.ToLower(k), reservedHeaderPrefix) {
			base[k] = v
		}
	}
	ev, err := c.prepare(ctx, c.subs.deadLetter(msg.key), c.deadLetters, base, msg.Data, opts)
	if err != nil {
		return err
	}
	// The message's own id was left out with its Nats- headers: an id here is the
	// caller's idempotency key, and without one the park gets a fresh id.
	_, _, err = c.send(ctx, ev)
	return err
}

// deadLetterCounts reads tenant's parked counts with one subject-filtered info call.
func (c *natsCore) deadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	if err := c.checkOpen(); err != nil {
		return DeadLetterCounts{}, err
	}
	if err := tenant.Validate(); err != nil {
		return DeadLetterCounts{}, fmt.Errorf("dead-letter counts: %w", err)
	}
	stream, err := c.js.Stream(ctx, c.deadLetters)
	if err != nil {
		return DeadLetterCounts{}, c.mapRequestError("dead-letter counts: stream "+c.deadLetters, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.subs.tenantDeadLetters(tenant)))
	if err != nil {
		return DeadLetterCounts{}, c.mapRequestError("dead-letter counts: stream "+c.deadLetters, err)
	}
	counts := DeadLetterCounts{Tables: deadLetterTables(info.State.Subjects, c.subs, table)}
	for _, n := range info.State.Subjects {
		counts.Total += n
	}
	return counts, nil
}

// durable maps a consumer name onto the ingest durable, on an open broker.
func (c *natsCore) durable(name string) (string, error) {
	if err := c.checkOpen(); err != nil {
		return "", err
	}
	durable, err := c.topo.durableFor(name)
	if err != nil {
		return "", fmt.Errorf("create consumer: %w", err)
	}
	return durable, nil
}

// worker is the ingest durable on every partition.
type worker struct {
	core    *natsCore
	ctx     context.Context
	durable string
}

// Consume runs one pull per partition, splitting prefetch between them.
func (w *worker) Consume(handler Handler, prefetch int) (func(), <-chan error, error) {
	c := w.core
	if err := c.checkOpen(); err != nil {
		return nil, nil, err
	}
	if handler == nil {
		return nil, nil, errors.New("consume: nil handler")
	}
	if prefetch < 0 {
		return nil, nil, fmt.Errorf("consume: negative prefetch %d", prefetch)
	}
	if prefetch == 0 {
		prefetch = c.topo.Prefetch
	}
	share := max(1, prefetch/len(c.partitions))
	d := &delivery{failed: make(chan error, 1)}
	for _, stream := range c.partitions {
		if err := d.start(c, w.ctx, stream, w.durable, handler, share); err != nil {
			d.stop()
			return nil, nil, err
		}
	}
	id, ok := c.track(d.stop)
	if !ok {
		d.stop()
		return nil, nil, ErrClosed
	}
	return func() { d.stop(); c.untrack(id) }, d.failed, nil
}

// delivery is one Consume: a pull per partition and the one report of its end.
type delivery struct {
	mu       sync.Mutex
	stopped  bool
	reported bool
	ccs      []jetstream.ConsumeContext
	failed   chan error
}

func (d *delivery) start(c *natsCore, ctx context.Context, stream, durable string, handler Handler, share int) error {
	lctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(lctx, stream, durable)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("consume: %w: %s on stream %s", ErrConsumerNotFound, durable, stream)
		}
		return c.mapRequestError("consume: "+durable+" on stream "+stream, err)
	}
	return d.consume(c, ctx, cons, stream, durable, handler, share)
}

// consume pulls from cons until stop, or until delivery ends on its own.
func (d *delivery) consume(c *natsCore, ctx context.Context, cons jetstream.Consumer, stream, durable string, handler Handler, share int) error {
	// The client reports errors of several concrete types; atomic.Value would panic
	// on the second type, so keep a pointer.
	var lastErr atomic.Pointer[error]
	var checking atomic.Bool
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if d.isStopped() {
			// Delivered after stop (the drain lets these through): hand it back at
			// once rather than leave it to the ack wait.
			_ = m.Nak()
			return
		}
		if err := handler(c.message(ctx, m, c.settler(m))); err != nil {
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(share), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
			lastErr.Store(&err)
			if d.isStopped() {
				return
			}
			c.log.Warn("mq: ingest consumer reported an error", "stream", stream, "consumer", durable, "error", err)
			// A durable deleted while no pull was outstanding is never reported as
			// deleted: measured, the client retries "no responders" and "no
			// heartbeat" every 2 s for good. Look the durable up, once at a time.
			if (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat)) && checking.CompareAndSwap(false, true) {
				go func() {
					defer checking.Store(false)
					if gone := c.durableGone(stream, durable); gone != nil {
						lastErr.Store(&gone)
						cc.Stop()
					}
				}()
			}
		}))
	if err != nil {
		return c.mapRequestError("consume: "+durable+" on stream "+stream, err)
	}
	d.mu.Lock()
	d.ccs = append(d.ccs, cc)
	d.mu.Unlock()
	go func() {
		<-cc.Closed()
		err := fmt.Errorf("%w: stream %s consumer %s", ErrDeliveryEnded, stream, durable)
		if reason := lastErr.Load(); reason != nil {
			err = fmt.Errorf("%w: %w", err, *reason)
		}
		d.ended(err)
	}()
	return nil
}

// durableGone returns an error wrapping jetstream.ErrConsumerDeleted when the durable
// no longer exists, and nil when it does or the lookup could not tell.
func (c *natsCore) durableGone(stream, durable string) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	_, err := c.js.Consumer(ctx, stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("%w: %w", jetstream.ErrConsumerDeleted, err)
	}
	return nil
}

func (d *delivery) isStopped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopped
}

// ended reports the end of delivery once, and never after stop.
func (d *delivery) ended(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.reported {
		return
	}
	d.reported = true
	d.failed <- err // buffered for exactly this one report
	// The whole delivery ends with one partition's: a caller that starts a new Consume
	// must not end up with two pulls on the other partitions.
	for _, cc := range d.ccs {
		cc.Stop()
	}
}

func (d *delivery) stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	ccs := d.ccs
	d.mu.Unlock()
	// Drain, not Stop: a pull request the server holds keeps delivering until the
	// unsubscribe reaches it, and a stopped subscription would drop those events into
	// the void for a whole ack wait (measured: 60 s on the operator's durable). A
	// drain passes them to the handler, which naks them.
	for _, cc := range ccs {
		cc.Drain()
	}
}
