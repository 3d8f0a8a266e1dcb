// Package mq is the message-queue boundary of a multi-tenant ingest service.
//
// API processes publish events per tenant and table ([Publisher]), keep one live
// subscription each to fan events out to SSE clients ([Subscriber]), and fill an SSE
// client's gap from the stored history ([Replayer]). Ingest workers consume every event
// through one durable consumer ([ConsumerManager], [Consumer]), acknowledge what they
// wrote, and park poison events on the dead-letter queue ([DeadLetterer]).
//
// Two implementations share one JetStream topology (see [NATSTopology]): [EmbeddedNATS]
// runs nats-server in-process and creates the topology itself; ExternalNATS connects to
// an operator-owned cluster and only verifies it. The package mqtest states the contract
// once as a conformance suite that any Broker can run.
//
// Errors are matched with [errors.Is] against the sentinels below, never by text.
package mq

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors. Every error a Broker returns for one of these conditions wraps the
// sentinel, so callers branch with errors.Is and never parse messages.
var (
	// ErrQueueFull: the event was refused because a limit was reached: the tenant's
	// byte budget, a tenant that was never given a budget, or a stream or per-topic
	// limit. It is backpressure: retry after the consumers caught up.
	ErrQueueFull = errors.New("mq: queue full")

	// ErrUnavailable: the broker did not answer in time, the connection is lost, or a
	// stream the topology needs is gone. It is transient: retry later.
	ErrUnavailable = errors.New("mq: unavailable")

	// ErrConsumerNotFound: the named durable consumer does not exist or its name does
	// not map onto one this broker knows.
	ErrConsumerNotFound = errors.New("mq: consumer not found")

	// ErrDeliveryEnded is sent on a Consumer's failed channel when delivery ended on its
	// own (the durable was deleted, the connection closed for good). It wraps the
	// broker's reason when there is one.
	ErrDeliveryEnded = errors.New("mq: consumer delivery ended")

	// ErrNoDeadLetterQueue: DeadLetterCounts was asked about a tenant that has no
	// dead-letter queue. Brokers whose tenants share one queue return zero counts.
	ErrNoDeadLetterQueue = errors.New("mq: dead-letter queue not found")

	// ErrDeadLetterNotFound: an id given to Redrive or DeleteDeadLetters is not a
	// parked event of the tenant (never parked, already redriven or deleted, another
	// tenant's, or not an id DeadLetters returned). Nothing was done.
	ErrDeadLetterNotFound = errors.New("mq: dead letter not found")

	// ErrTopology: the NATS cluster does not have the shape this package needs. The
	// error is a *TopologyError that lists every finding.
	ErrTopology = errors.New("mq: nats topology mismatch")

	// ErrInvalidTopic: a topic without a valid tenant or table, or one whose encoded key
	// is too long. Not something a retry can fix.
	ErrInvalidTopic = errors.New("mq: invalid topic")

	// ErrInvalidTenant: a tenant id outside the [TenantID] grammar. Topic errors caused
	// by the tenant wrap both this and ErrInvalidTopic.
	ErrInvalidTenant = errors.New("mq: invalid tenant id")

	// ErrInvalidHeader: a header the broker reserves for itself, or one it could not
	// deliver exactly as given (see [Headers]). Nothing was sent.
	ErrInvalidHeader = errors.New("mq: invalid header")

	// ErrPayloadTooLarge: the event, its data with every header as sent (the broker's
	// own included), is larger than the broker accepts. Nothing is stored: the NATS
	// brokers refuse it before sending when it exceeds the server's max payload, and
	// the stream refuses it on arrival when only the stream's own limit is lower.
	// The NATS brokers' Publish also refuses an event whose park by the poison policy
	// would exceed the server's max payload, so every event stored can be parked.
	// Every broker accepts data of 256 KiB with a few headers, so a host may size its
	// rows to that without asking (mqtest checks it).
	ErrPayloadTooLarge = errors.New("mq: payload too large")

	// ErrClosed: the broker was closed, or never opened (a nil or zero *EmbeddedNATS
	// or *ExternalNATS: its methods return this rather than panic).
	ErrClosed = errors.New("mq: broker closed")

	// ErrInvalidConfig: a ConsumerConfig or an argument that cannot work, such as a
	// negative duration, count, prefetch or budget, a partition the topology does not
	// have, or a nil context, handler or send function; a broker configuration that
	// cannot work, or credentials the server refuses. Nothing was started or changed.
	ErrInvalidConfig = errors.New("mq: invalid config")
)

// Topic addresses an event: a tenant's table, optionally narrowed by a scope. Table and
// Scope are raw names (any UTF-8 or even binary string); the broker escapes them. Table
// is required; an empty Scope means "no scope". Topic is comparable, so callers may key
// maps by it.
type Topic struct {
	Tenant TenantID
	Table  string
	Scope  string
}

// Handler handles one delivered message. What a returned error means depends on the
// path: on the worker path (Consume) the message is nak'ed for redelivery, so a handler
// that returns an error must not also settle it; on the hub path (Subscribe) there is
// nothing to redeliver and the error is logged. A handler that panics is treated as
// one that returned an error, on both paths: the broker recovers the panic and logs
// it with the topic and the stack, so one poison event never ends the process.
type Handler func(*Message) error

// Publisher stores events.
type Publisher interface {
	// Publish stores data as one event on topic and returns once the broker confirmed
	// it. Errors wrap ErrQueueFull (back off), ErrUnavailable (retry later),
	// ErrInvalidTopic, ErrInvalidHeader or ErrPayloadTooLarge (nothing was sent),
	// ErrClosed, or are ctx's error.
	Publish(ctx context.Context, topic Topic, data []byte, opts ...PublishOpt) error
}

// Subscriber is the live hub: every event of every tenant from now on.
type Subscriber interface {
	// Subscribe delivers every event published after it returns, of every tenant and
	// topic, each tenant's in publish order, to handler, one at a time. It returns once
	// delivery is live; delivery runs until ctx is done or the broker closes. Whether
	// name identifies anything is the implementation's: the NATS brokers use it only
	// to name the hub in Health and in the log, because every process needs every
	// event.
	Subscribe(ctx context.Context, name string, handler Handler) error
}

// ConsumerConfig configures the durable ingest consumer. Zero fields take the broker's
// defaults.
type ConsumerConfig struct {
	// Durable names the durable consumer. The NATS brokers know one: the topology's
	// ingest consumer, also reachable as "buffer-consumer" (WorkerDurable), the ingest
	// worker's name, and as "".
	Durable string
	// AckWait is how long a delivered, unsettled message waits before redelivery.
	AckWait time.Duration
	// MaxAckPending caps the unsettled messages per delivery unit (a partition). It
	// also bounds what a worker holds in memory for that unit.
	MaxAckPending int

	// Concurrency is how many handler calls one Consume runs at once. A tenant's
	// events are handled one at a time, in order; different tenants run in parallel,
	// also within one delivery unit. Default 16.
	Concurrency int
	// MaxDeliveries is the delivery on which a handler failure makes the broker park
	// the event on the dead-letter queue, with headers saying why (see
	// HeaderDeadReason), and acknowledge it. Only a failure parks: an event that comes
	// back unsettled (held, ack wait run out, a process that died in the handler)
	// is handed to the handler again, whose Message.Attempt says how often it came.
	// Deliveries are counted as the broker counts them: one a stop or a handover gave
	// back before any handler saw it counts too, so after such a hand-back an event
	// may be parked after fewer failures than MaxDeliveries. Default 10; negative
	// never parks.
	MaxDeliveries int
	// RetryDelay is how long a failed event (a handler error or panic) waits before
	// its next delivery; each further failure doubles it, up to MaxRetryDelay (itself
	// capped at the ack wait). Defaults 1s and 1m.
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration
	// StopTimeout bounds how long stop (and Close) waits for running handler calls
	// before it hands back everything the worker still holds. Default 10s.
	StopTimeout time.Duration
	// MemberTimeout is how long a worker that fell silent (killed, cut off) keeps
	// its delivery units before the other workers share them out; a worker that stops
	// hands them over at once. Workers send a heartbeat three times within it. A unit
	// the silent worker still held unsettled events of waits one ack wait more, so its
	// tenants' order holds. Default 3s; the NATS brokers refuse one below 100ms
	// (ErrInvalidConfig).
	MemberTimeout time.Duration
	// Partitions, when set, claims exactly these delivery units (0 to N-1) for this
	// worker, for operators who place workers themselves. Unset, the worker joins the
	// others and takes its share of the units, each unit consumed by one worker at a
	// time. Claim each unit once: the NATS brokers serve a unit claimed twice to one
	// worker at a time, but hand it to the other once the served one pulls nothing for
	// the pinned TTL (its lanes full behind slow handlers, or a stall), and a tenant's
	// events may then run on both.
	Partitions []int
}

// ConsumerManager creates the durable ingest consumer.
type ConsumerManager interface {
	// CreateConsumer returns the durable consumer cfg names. Whether it creates the
	// durable or only finds and checks one is the implementation's; a name it cannot
	// map is ErrConsumerNotFound. Every delivered Message.Ctx is ctx; ctx does not stop
	// delivery.
	CreateConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error)
}

// Consumer delivers every stored event at least once.
type Consumer interface {
	// Consume starts delivery to handler: every event at least once, in order per
	// tenant. About prefetch messages are fetched ahead in total, split across the
	// delivery units (at least one each); 0 takes the broker's default.
	//
	// A tenant's next event reaches the handler only once the call for its previous
	// one returned. A handler error or panic, or a Nak made before it returned, holds
	// that tenant alone: the event is delivered again after the retry delay (or at
	// once after a plain Nak) and handled before any later event of the tenant, while
	// other tenants go on. After MaxDeliveries the broker parks the event and the
	// tenant moves on. Settling a message after its call returned holds nothing.
	//
	// stop ends delivery: no handler call begins once it was called; it waits up to
	// StopTimeout for the calls in flight, then hands back, unsettled and in order,
	// every event the worker holds that no handler was given (queued behind a held
	// tenant, or waiting for its retry), so the next worker gets them at once. What a
	// handler returned without settling stays the caller's to settle; Close hands it
	// back. It is safe to call more than once. Called from a handler, it waits for that
	// very call until StopTimeout: a handler that must end delivery calls go stop().
	// failed carries exactly one error wrapping ErrDeliveryEnded if delivery ends on
	// its own, and nothing once stop was called.
	Consume(handler Handler, prefetch int) (stop func(), failed <-chan error, err error)
}

// DeadLetterCounts are one tenant's parked events. Every scope of a table counts under
// the table itself.
type DeadLetterCounts struct {
	// Tables maps a table name to its parked count; narrowed by the table filter.
	Tables map[string]uint64
	// Total is the tenant's whole parked count, whatever the filter.
	Total uint64
}

// DeadLetterer parks poison events.
type DeadLetterer interface {
	// DeadLetter stores msg's data and headers on the dead-letter queue under msg's own
	// topic, with the option headers added. It does not settle msg: the caller acks it
	// once the park is confirmed, so a failed park leaves it to be redelivered. msg's
	// own idempotency key is not reused; one set by an option is scoped to msg's
	// tenant, as on Publish. A "Nats-" header among msg's own headers (a message the
	// host built; a delivered one has none) is refused with ErrInvalidHeader.
	DeadLetter(ctx context.Context, msg *Message, opts ...PublishOpt) error
	// DeadLetterCounts counts tenant's parked events per table. A non-empty table
	// narrows Tables to that table and all its scopes; Total is never narrowed. A read
	// failure is an error, never an empty count.
	DeadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error)
}

// DeadLetterQuery pages one tenant's parked events.
type DeadLetterQuery struct {
	// Table narrows the page to one table, every scope of it included.
	Table string
	// Limit is the page's size; 0 means 100.
	Limit int
	// Cursor is where the page starts: "" for the oldest, else the next cursor a
	// previous call returned. It is opaque.
	Cursor string
}

// DeadLetterSelector picks parked events of one tenant: All of them, one Table's
// (every scope), or the IDs DeadLetters returned. Exactly one way must be given:
// none, or two at once, wraps ErrInvalidConfig and nothing is done.
type DeadLetterSelector struct {
	All   bool
	Table string
	IDs   []string
}

// DeadLetterManager reads, redrives and removes parked events. It is not part of
// Broker: the NATS brokers implement it. For them a parked event's Message.ID is its
// sequence on the dead-letter stream, in decimal, and its Timestamp when it was parked.
type DeadLetterManager interface {
	// DeadLetters returns a page of tenant's parked events, oldest first, with their
	// data and headers (the Mq-Dead-* ones the worker's poison policy set included,
	// no "Nats-" one), and the cursor of the next page: "" when no parked event of the
	// tenant (and table) followed the page as it was read. An invalid tenant wraps
	// ErrInvalidTenant; a bad cursor or limit ErrInvalidConfig.
	DeadLetters(ctx context.Context, tenant TenantID, q DeadLetterQuery) (page []*Message, next string, err error)
	// Redrive publishes the selected parked events again, oldest first, each to its
	// own topic with its own headers but not the Mq-Dead-* ones, and with the
	// Message.ID it had before its park (see HeaderEventID), as Publish does
	// (budgets included: ErrQueueFull stops it, and the rest stays parked). Each is
	// published with an idempotency key made from its park, so a redrive retried after
	// a failure stores it once (within the partitions' duplicate window), and removed
	// from the dead-letter queue only once stored. It returns how many it redrove, also
	// on an error. An event parked again while it runs waits for the next Redrive. An
	// id that is not tenant's parked event wraps ErrDeadLetterNotFound, and then
	// nothing is redriven; an id given twice is one event. A park another call removed
	// meanwhile (two redrives at once) is no error and is counted by that call.
	Redrive(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error)
	// DeleteDeadLetters removes the selected parked events and returns how many, with
	// the errors of Redrive.
	DeleteDeadLetters(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error)
}

// Purger reclaims what is both written and no longer needed for replay.
type Purger interface {
	// PurgeAcked removes, for each tenant, events that are both acknowledged through
	// the named consumer and stored before the tenant's cutoff in olderThan; a tenant
	// absent from the map keeps nothing it acknowledged. Results are monotone in the
	// cutoff for any time.Time: a cutoff earlier than any stored time (for the NATS
	// brokers, before 1677-09-21, the start of an int64 of nanoseconds) removes nothing
	// of that tenant, and one later than any (after 2262-04-11) is "now or later": it
	// removes everything the tenant acknowledged. It reports whether anything was
	// removed. A consumer name the broker cannot map is ErrConsumerNotFound; a key of
	// olderThan that is not a valid TenantID is ErrInvalidTenant, and nothing is
	// removed (a misspelt tenant would otherwise leave the real one absent, keeping
	// nothing). A broker whose retention belongs to the operator removes nothing and
	// reports false.
	PurgeAcked(ctx context.Context, consumer string, olderThan map[TenantID]time.Time) (bool, error)
}

// Replayer fills a gap from the stored history.
type Replayer interface {
	// ReplaySince sends every stored event of exactly topic (other scopes excluded)
	// stored at or after since, in order, up to what was stored when the replay
	// started: it never chases the live tail, which the caller's subscription already
	// sees. It stops when send returns false. Running out is a nil end; a failure
	// before that is an error, never an early nil: ErrUnavailable when the broker
	// stops answering (within its own bound on each request, for the NATS brokers
	// PublishTimeout, whatever ctx allows), ErrInvalidTopic, ErrClosed (also for a
	// replay that Close ended, whatever its request met); a done ctx returns ctx's
	// error.
	// since is compared with the Timestamp the replayed messages carry (for the NATS
	// brokers the history's stored time, a little after Publish returned), so take it
	// from a delivered Message rather than from the caller's clock. Results are
	// monotone in since for any time.Time, so a since taken from a client can never
	// replay the whole history by overflowing: one earlier than any stored time (the
	// zero Time, or for the NATS brokers anything before 1677-09-21, the start of an
	// int64 of nanoseconds) replays from the beginning, one later than any (after
	// 2262-04-11) replays nothing. A nil send is refused with ErrInvalidConfig before
	// anything is read.
	ReplaySince(ctx context.Context, topic Topic, since time.Time, send func(*Message) bool) error
}

// HistoryHorizon is implemented by brokers whose history drops its oldest events (by
// age or by size), so that a replay since a time it no longer holds comes back short
// with a nil error. It is not part of Broker: a broker that keeps every event has no
// horizon.
type HistoryHorizon interface {
	// OldestSequence returns the Sequence of the oldest event the history still holds
	// (as Subscribe and ReplaySince carry it), or the one the next event will take
	// when it holds none. A client that saw every event up to Sequence s missed
	// nothing when s+1 >= the result; ask after the replay, not before, since the
	// oldest only moves forward. ErrUnavailable when the broker does not answer,
	// ErrClosed after Close, ctx's error when ctx ends first.
	OldestSequence(ctx context.Context) (uint64, error)
}

// Budgeter holds per-tenant byte budgets.
type Budgeter interface {
	// SetMaxBytes sets tenant's byte budget. Where budgets are enforced, a tenant never
	// given one, or given 0, is refused with ErrQueueFull. A negative budget
	// (ErrInvalidConfig) or an invalid tenant is an error, and the budget stays as it was.
	SetMaxBytes(ctx context.Context, tenant TenantID, maxBytes int64) error
	// MaxBytes returns the budget last set in full, or 0.
	MaxBytes(tenant TenantID) int64
}

// Stats are counters for operators' gauges.
type Stats struct {
	// Connections counts the broker's live client connections (at least 1 while it is
	// connected).
	Connections int64
	// InMsgs and InBytes count what the broker's server (or client) received.
	InMsgs, InBytes int64
	// OutMsgs and OutBytes count what it sent.
	OutMsgs, OutBytes int64
}

// HealthChecker is implemented by brokers that can answer a readiness or liveness
// probe (see [HealthHandler]). It is not part of Broker: a broker may have nothing to
// check.
type HealthChecker interface {
	// Health returns nil when the broker works, or an error naming every part that
	// does not: ErrClosed after Close; ErrUnavailable when the broker is not connected,
	// the server does not answer within ctx, a stream the topology needs is gone, or a
	// hub (Subscribe) was interrupted and has not resumed; ErrDeliveryEnded when a
	// Consume's delivery ended on its own (until its caller stops it); ErrTopology
	// when the broker's last check of the topology found a required problem; ctx's
	// error when ctx was cancelled. It is cheap and meant to be called every few
	// seconds: at most one request to the server, bounded by ctx. A Consume stopped
	// by its caller, or a hub whose ctx ended, no longer counts.
	Health(ctx context.Context) error
}

// Broker is the whole message-queue boundary.
type Broker interface {
	Publisher
	BatchPublisher
	Subscriber
	ConsumerManager
	DeadLetterer
	Purger
	Replayer
	Budgeter
	// Stats returns the broker's counters.
	Stats() (Stats, error)
	// Close stops every consumer and subscription (none reports failed), then releases
	// the broker. It is idempotent. No handler call starts after it returned; one in
	// flight may still finish. Afterwards every method, Consumer.Consume, Stats and
	// the settle methods of a message Consume delivered included, returns an error
	// wrapping ErrClosed.
	Close() error
}
