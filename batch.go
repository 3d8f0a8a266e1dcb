package mq

import (
	"context"
	"fmt"
)

// BatchEvent is one event of a [Batch]: a table and scope of the batch's tenant, the
// event's data, and its options (headers, idempotency key), as Publish takes them.
type BatchEvent struct {
	Table   string
	Scope   string
	Data    []byte
	Options []PublishOpt
}

// Batch is many events of one tenant, published together by PublishBatch.
type Batch struct {
	Tenant TenantID
	Events []BatchEvent
	// Atomic stores every event or none. Without it, each event is stored on its own
	// and a failure leaves the others stored (see [BatchError]). A broker without
	// atomic batches refuses an atomic one whole, storing nothing, with an error
	// wrapping errors.ErrUnsupported. The NATS brokers have them, on partitions with
	// allow_atomic; on a partition without it the batch is refused with ErrTopology.
	// There each event also carries the batch's headers (up to 88 bytes), which the
	// room Publish keeps for a park holds, so an atomic batch takes Publish's largest
	// event, unless a partition's name is much longer than the dead-letter stream's;
	// a larger one refuses the batch with ErrPayloadTooLarge, nothing sent.
	Atomic bool
}

// BatchError says which events of a batch were not confirmed. It wraps the first
// failure's error, so errors.Is matches its sentinel.
type BatchError struct {
	// Failed holds the indexes into Batch.Events of the events not confirmed, in
	// order. The others are stored. For an atomic batch it holds every index.
	Failed []int
	// Err is the first failure.
	Err error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("mq: %d of the batch's events not confirmed: %v", len(e.Failed), e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// BatchPublisher stores many events of one tenant in one call.
type BatchPublisher interface {
	// PublishBatch stores b's events and returns once the broker confirmed every one.
	// A tenant's events keep their order in the batch. The tenant's budget is
	// reserved for the whole batch first: a batch that does not fit is refused whole
	// with ErrQueueFull. Events are checked before anything is sent: an invalid
	// table, scope or header, or an event too large, refuses the batch with nothing
	// sent. A failure after sending is a *BatchError naming the events not confirmed;
	// retrying the batch with idempotency keys on its events stores each event once.
	// An atomic batch larger than the broker accepts in one unit wraps
	// ErrPayloadTooLarge. An atomic batch the server refuses because it holds too many
	// open batches (on the NATS brokers: max_batch_inflight_per_stream, 50 a partition
	// by default, or max_batch_inflight_total) wraps ErrUnavailable: retry later. An
	// atomic batch whose ctx ended while it was sent holds its slot until the server's
	// batch timeout (10 s by default). An empty batch of a valid tenant is a no-op; an
	// invalid tenant is refused, events or none. Errors wrap the sentinels Publish's
	// do, or are ctx's error.
	PublishBatch(ctx context.Context, b Batch) error
}
