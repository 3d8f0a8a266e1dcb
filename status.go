package mq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// StatusReader reads the topology's live state for an operator (mqctl status). It is
// not part of Broker: the NATS brokers implement it. It only reads: stream and
// consumer info, and the workers' heartbeats.
type StatusReader interface {
	// Status reads one snapshot. A partition or the history that cannot be read is an
	// error; a consumer list the user may not read is reported in ConsumersErr. A ctx
	// that ends before ListenWorkers did is an error too: the workers heard so far
	// would not be all of them.
	Status(ctx context.Context, opts StatusOptions) (TopologyStatus, error)
}

// StatusOptions tunes Status.
type StatusOptions struct {
	// ListenWorkers is how long Status listens for the workers' heartbeats; 0 means
	// 1s, one beat of the default MemberTimeout, and a negative one is ErrInvalidConfig.
	// Workers that beat less often may be missed.
	ListenWorkers time.Duration
}

// TopologyStatus is one snapshot of the topology.
type TopologyStatus struct {
	Partitions []PartitionStatus
	History    HistoryStatus
	// DeadLetters counts the parked events per tenant (a subject this prefix did not
	// write counts under its first token).
	DeadLetters map[TenantID]uint64
	// Consumers are every consumer on the partitions and the history, by stream and
	// name; nil with ConsumersErr when the user may not list them.
	Consumers    []ConsumerStatus
	ConsumersErr error
	// Workers are the ingest workers heard during ListenWorkers, by id.
	Workers []WorkerStatus
}

// PartitionStatus is one partition's stream and its ingest durable.
type PartitionStatus struct {
	Partition int
	Stream    string
	// Messages and Bytes are what the stream holds: the backlog not yet acknowledged,
	// and acknowledged events the history has not copied yet.
	Messages, Bytes uint64
	// The ingest durable: events not yet delivered, delivered and unacknowledged,
	// and redelivered.
	Pending, AckPending, Redelivered uint64
	// PinnedID is the server's id of the pull pinned in the ingest group ("" when
	// none), since PinnedAt.
	PinnedID string
	PinnedAt time.Time
}

// HistoryStatus is the history stream and its sources.
type HistoryStatus struct {
	Stream          string
	Messages, Bytes uint64
	// Oldest is the stored time of the oldest event held (zero when none): a replay
	// reaches back to it. Well after MaxAge it means max_bytes cuts the window short.
	Oldest  time.Time
	MaxAge  time.Duration // the stream's max_age; 0 is none
	Sources []SourceStatus
}

// SourceStatus is one source of the history: how many events it is behind, and how
// long ago it was last in contact (negative: never).
type SourceStatus struct {
	Stream   string
	Lag      uint64
	LastSeen time.Duration
	Error    string
}

// ConsumerStatus is one consumer.
type ConsumerStatus struct {
	Stream, Name                     string
	Durable                          bool
	Pending, AckPending, Redelivered uint64
	Waiting                          int
}

// WorkerStatus is one ingest worker as its heartbeat shows it: its id, its
// connection's name (NATSConfig.Name, "mq-<hostname>" by default; "mq-embedded" on
// EmbeddedNATS), the partitions it holds and its static claim.
type WorkerStatus struct {
	ID, Name string
	Owned    []int
	Claim    []int
	Leaving  bool
	// Unsettled are partitions it gave up with events delivered to it that never
	// arrived: the next owner takes them an ack wait later.
	Unsettled []int
}

// status reads the snapshot; the workers' listen runs alongside the reads.
func (c *natsCore) status(ctx context.Context, opts StatusOptions) (TopologyStatus, error) {
	if ctx == nil {
		return TopologyStatus{}, errNilContext("status")
	}
	if err := c.checkOpen(); err != nil {
		return TopologyStatus{}, err
	}
	if opts.ListenWorkers < 0 {
		return TopologyStatus{}, fmt.Errorf("%w: status: negative ListenWorkers %s", ErrInvalidConfig, opts.ListenWorkers)
	}
	stopListen, err := c.listenWorkers()
	if err != nil {
		return TopologyStatus{}, err
	}
	var s TopologyStatus
	if err := c.readStatus(ctx, &s); err != nil {
		stopListen()
		return TopologyStatus{}, err
	}
	select {
	case <-ctx.Done():
		// Not the snapshot so far: its workers would be only those heard before the
		// end, and an operator's Ctrl-C printed every partition as owned by none.
		stopListen()
		return TopologyStatus{}, fmt.Errorf("status: listening for the workers' heartbeats: %w", ctx.Err())
	case <-time.After(cmp.Or(opts.ListenWorkers, time.Second)):
	}
	s.Workers = stopListen()
	return s, nil
}

// readStatus fills everything but the workers.
func (c *natsCore) readStatus(ctx context.Context, s *TopologyStatus) error {
	for p, name := range c.partitions {
		ps := PartitionStatus{Partition: p, Stream: name}
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			return c.mapRequestError("status: partition stream "+name, err)
		}
		info := st.CachedInfo()
		ps.Messages, ps.Bytes = info.State.Msgs, info.State.Bytes
		ci, err := c.js.Consumer(ctx, name, c.topo.IngestConsumer)
		if err != nil {
			return c.mapRequestError("status: durable "+c.topo.IngestConsumer+" on "+name, err)
		}
		in := ci.CachedInfo()
		ps.Pending, ps.AckPending, ps.Redelivered = in.NumPending, uint64(in.NumAckPending), uint64(in.NumRedelivered)
		for _, g := range in.PriorityGroups {
			if g.Group == c.topo.IngestGroup {
				ps.PinnedID, ps.PinnedAt = g.PinnedClientID, g.PinnedTS
			}
		}
		s.Partitions = append(s.Partitions, ps)
	}
	hist, err := c.js.Stream(ctx, c.topo.HistoryStream)
	if err != nil {
		return c.mapRequestError("status: history stream "+c.topo.HistoryStream, err)
	}
	hi := hist.CachedInfo()
	s.History = HistoryStatus{Stream: hi.Config.Name, Messages: hi.State.Msgs, Bytes: hi.State.Bytes, MaxAge: hi.Config.MaxAge}
	if hi.State.Msgs > 0 {
		s.History.Oldest = hi.State.FirstTime
	}
	for _, src := range hi.Sources {
		ss := SourceStatus{Stream: src.Name, Lag: src.Lag, LastSeen: src.Active}
		if src.Error != nil {
			ss.Error = src.Error.Error()
		}
		s.History.Sources = append(s.History.Sources, ss)
	}
	slices.SortFunc(s.History.Sources, func(a, b SourceStatus) int { return strings.Compare(a.Stream, b.Stream) })
	perSubject, err := c.subjectCounts(ctx, c.deadLetters, c.subs.deadLetterAll())
	if err != nil {
		return c.mapRequestError("status: dead letters on "+c.deadLetters, err)
	}
	s.DeadLetters = map[TenantID]uint64{}
	for subject, n := range perSubject {
		tenant, _, _ := strings.Cut(c.subs.keyOrSubject(subject), ".")
		s.DeadLetters[TenantID(tenant)] += n
	}
	s.Consumers, s.ConsumersErr = c.listConsumers(ctx, append(slices.Clone(c.partitions), c.topo.HistoryStream))
	return nil
}

// listConsumers lists every consumer of streams; the restricted user may not
// (CONSUMER.LIST is not in PermissionsFor), which is the error. The server answers a
// refused request with nothing (measured: the list waited out the caller's whole
// minute), so each stream's list is bounded by PublishTimeout, and a refusal is
// remembered for refusalKept: a live status view waits for it once a minute, not at
// every refresh, and sees a permission granted since within a minute.
func (c *natsCore) listConsumers(ctx context.Context, streams []string) ([]ConsumerStatus, error) {
	if r := c.consumersDenied.Load(); r != nil && time.Since(r.at) < refusalKept {
		return nil, r.err
	}
	var out []ConsumerStatus
	for _, name := range streams {
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			return nil, c.mapRequestError("status: stream "+name, err)
		}
		lctx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
		list := st.ListConsumers(lctx)
		for in := range list.Info() {
			out = append(out, ConsumerStatus{
				Stream: name, Name: in.Name, Durable: in.Config.Durable != "",
				Pending: in.NumPending, AckPending: uint64(in.NumAckPending), Redelivered: uint64(in.NumRedelivered),
				Waiting: in.NumWaiting,
			})
		}
		err = list.Err()
		cancel()
		if err != nil {
			if last := c.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), ".CONSUMER.LIST.") {
				err = fmt.Errorf("status: list the consumers of %s: %w", name, last)
				c.consumersDenied.Store(&refusal{err: err, at: time.Now()})
				return nil, err
			}
			return nil, c.mapRequestError("status: list the consumers of "+name, err)
		}
	}
	return out, nil
}

// refusal is a request the server refused, and when.
type refusal struct {
	err error
	at  time.Time
}

// refusalKept is how long Status trusts a refusal of the consumer list.
const refusalKept = time.Minute

// listenWorkers hears the workers' heartbeats until stop, which returns the last
// beat of each, by id. It only listens: a beat sent here would make the workers count
// it as a member.
func (c *natsCore) listenWorkers() (stop func() []WorkerStatus, err error) {
	var mu sync.Mutex
	heard := map[string]WorkerStatus{}
	sub, err := c.nc.Subscribe(c.topo.workerSubject(), func(m *nats.Msg) {
		var b beat
		if json.Unmarshal(m.Data, &b) != nil || b.ID == "" {
			return
		}
		mu.Lock()
		heard[b.ID] = WorkerStatus(b) // same fields; a change to beat that breaks this fails to compile
		mu.Unlock()
	})
	if err != nil {
		return nil, c.mapRequestError("status: listen on "+c.topo.workerSubject(), err)
	}
	return func() []WorkerStatus {
		_ = sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		out := make([]WorkerStatus, 0, len(heard))
		for _, w := range heard {
			out = append(out, w)
		}
		slices.SortFunc(out, func(a, b WorkerStatus) int { return strings.Compare(a.ID, b.ID) })
		return out
	}, nil
}

var (
	_ StatusReader = (*ExternalNATS)(nil)
	_ StatusReader = (*EmbeddedNATS)(nil)
)

// Status reads the topology's state on the operator's streams; see [StatusReader].
func (e *ExternalNATS) Status(ctx context.Context, opts StatusOptions) (TopologyStatus, error) {
	if err := e.opened(); err != nil {
		return TopologyStatus{}, err
	}
	return e.core.status(ctx, opts)
}

// Status reads the topology's state; see [StatusReader].
func (e *EmbeddedNATS) Status(ctx context.Context, opts StatusOptions) (TopologyStatus, error) {
	if err := e.opened(); err != nil {
		return TopologyStatus{}, err
	}
	return e.core.status(ctx, opts)
}
