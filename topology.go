package mq

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

// NATSTopology names and sizes the JetStream objects both NATS brokers use: N
// interest-retention ingest partitions, a history stream that sources them, one
// dead-letter stream, and the ingest durable on every partition. Zero fields take the
// defaults documented on each.
type NATSTopology struct {
	// Prefix is the first subject token, one token of [a-z0-9_-]. Default "wh".
	Prefix string
	// Partitions is N, the number of ingest partitions. Default 4, at most
	// MaxPartitions.
	Partitions int
	// IngestConsumer is the durable on every partition. Default "INGEST". It must sort
	// (byte-wise) before "JS_", the prefix of the server's own source consumers: see
	// ingestConsumerSortsFirst.
	IngestConsumer string
	// IngestGroup is the priority group every worker pulls the durable in. Default
	// "ingest". The durable pins each partition to one worker at a time
	// (pinned_client), so a tenant's events are never handled by two workers at
	// once. It must be a valid priority group name: 1 to 16 of [a-zA-Z0-9/_=-].
	IngestGroup string
	// HistoryStream names the history. Default "<PREFIX>_HISTORY".
	HistoryStream string

	// PublishTimeout bounds each publish attempt, and each request of a replay
	// (with the wait for its next event). Default 5s, at most 1h.
	PublishTimeout time.Duration
	// AckWait is the worker's ack wait; the durable's must be at least this. Default 60s.
	AckWait time.Duration
	// PinnedTTL is how long a partition stays pinned to a worker that stopped pulling
	// before the server pins it to another. Default 15s. At least twice the worker's
	// pull expiry: see minPinnedTTL.
	PinnedTTL time.Duration
	// MaxAckPending is the durable's cap on unsettled messages per partition. Default
	// 10,000.
	MaxAckPending int
	// Prefetch is the worker's total prefetch, split across partitions. Default 500.
	Prefetch int

	// Replicas of every stream. Default 3; EmbeddedNATS always uses 1.
	Replicas int
	// PartitionMaxBytes bounds each partition's backlog of unwritten events. Default
	// 50 GiB.
	PartitionMaxBytes int64
	// MaxMsgsPerSubject caps one topic's backlog on a partition. Default 1,000,000.
	MaxMsgsPerSubject int64
	// DuplicateWindow of the partitions. Default 2m, and never below the time a
	// publish with its retries can take.
	DuplicateWindow time.Duration
	// HistoryMaxAge is how long the history keeps events: at least the longest gap
	// window served. Default 15m.
	HistoryMaxAge time.Duration
	// HistoryMaxBytes bounds the history. Default 20 GiB; -1 is no limit (max_age
	// alone bounds it).
	HistoryMaxBytes int64
	// DeadLetterMaxBytes bounds the dead-letter stream. Default 5 GiB.
	DeadLetterMaxBytes int64
	// DeadLetterMaxMsgsPerSubject caps one topic's parked events, so a flood from one
	// topic evicts only its own. Default 100,000; -1 is no limit.
	DeadLetterMaxMsgsPerSubject int64
}

// Topology defaults.
const (
	defaultPrefix            = "wh"
	defaultPartitions        = 4
	defaultIngestConsumer    = "INGEST"
	defaultIngestGroup       = "ingest"
	defaultPinnedTTL         = 15 * time.Second
	defaultPublishTimeout    = 5 * time.Second
	defaultAckWait           = 60 * time.Second
	defaultMaxAckPending     = 10_000
	defaultPrefetch          = 500
	defaultReplicas          = 3
	maxReplicas              = 5 // JetStream refuses a stream of more
	gib                      = int64(1) << 30
	defaultPartitionMaxBytes = 50 * gib
	defaultMaxMsgsPerSubject = 1_000_000
	defaultDuplicateWindow   = 2 * time.Minute
	defaultHistoryMaxAge     = 15 * time.Minute
	// minMaxAge is the least max age nats-server accepts on a stream (v2.15.3,
	// "max age needs to be >= 100ms").
	minMaxAge               = 100 * time.Millisecond
	defaultHistoryMaxBytes  = 20 * gib
	defaultDLQMaxBytes      = 5 * gib
	defaultDLQMaxPerSubject = 100_000

	// WorkerDurable is the ingest worker's own name for the ingest durable; both it and
	// NATSTopology.IngestConsumer map onto the same durable.
	WorkerDurable = "buffer-consumer"

	// publishRetries is how often a publish whose answer was lost is sent again, with
	// the same message id, publishRetryWait apart.
	publishRetries   = 2
	publishRetryWait = 250 * time.Millisecond

	// legacyIngestConsumer is the durable's default before it had to sort first;
	// EmbeddedNATS removes it from a store written then (see migrateIngestConsumer).
	legacyIngestConsumer = "wh-ingest"
	// serverConsumerPrefix starts the names of the consumers the server creates for
	// itself, JS_SRC_<hash> for a source (nats-server 2.14 and later).
	serverConsumerPrefix = "JS_"

	metaPartition  = "wavehouse.dev/partition"
	metaPartitions = "wavehouse.dev/partitions"
)

// MaxPartitions is the most ingest partitions a topology may have: a count beyond it
// is refused before any per-partition table is built (a mistyped 1<<40 ran the process
// out of memory). It is far above what a deployment needs, since a partition is what
// one worker holds at a time, not what a tenant's throughput needs (tenants run in
// parallel within a partition), but a count cannot be lowered while a partition holds
// events, so a store written under hundreds must keep opening. Each partition costs
// the cluster a stream, its durable and the history's source consumer (three Raft
// groups each at R3): measured on nats-server 2.15.3 (2 cores), an embedded server of
// 256 partitions shuts down in about 5 s, of 1024 in about 22 s.
const MaxPartitions = 1024

var prefixPattern = regexp.MustCompile(`^[a-z0-9_-]+$`)

// groupNamePattern is nats-server's rule for a priority group name (validGroupName
// in server/consumer.go, v2.15.2): the server refuses a durable with any other.
var groupNamePattern = regexp.MustCompile(`^[a-zA-Z0-9/_=-]{1,16}$`)

// WithDefaults returns t with every zero field set to its default.
func (t NATSTopology) WithDefaults() NATSTopology {
	setDefault(&t.Prefix, defaultPrefix)
	setDefault(&t.Partitions, defaultPartitions)
	setDefault(&t.IngestConsumer, defaultIngestConsumer)
	setDefault(&t.IngestGroup, defaultIngestGroup)
	setDefault(&t.HistoryStream, strings.ToUpper(t.Prefix)+"_HISTORY")
	setDefault(&t.PublishTimeout, defaultPublishTimeout)
	setDefault(&t.AckWait, defaultAckWait)
	setDefault(&t.PinnedTTL, defaultPinnedTTL)
	setDefault(&t.MaxAckPending, defaultMaxAckPending)
	setDefault(&t.Prefetch, defaultPrefetch)
	setDefault(&t.Replicas, defaultReplicas)
	setDefault(&t.PartitionMaxBytes, defaultPartitionMaxBytes)
	setDefault(&t.MaxMsgsPerSubject, defaultMaxMsgsPerSubject)
	setDefault(&t.DuplicateWindow, max(defaultDuplicateWindow, t.minDuplicateWindow()))
	setDefault(&t.HistoryMaxAge, defaultHistoryMaxAge)
	setDefault(&t.HistoryMaxBytes, defaultHistoryMaxBytes)
	setDefault(&t.DeadLetterMaxBytes, defaultDLQMaxBytes)
	setDefault(&t.DeadLetterMaxMsgsPerSubject, defaultDLQMaxPerSubject)
	return t
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate reports the first field of t (after defaults) that cannot work.
func (t NATSTopology) Validate() error {
	if err := t.WithDefaults().check(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (t NATSTopology) check() error {
	switch {
	case !prefixPattern.MatchString(t.Prefix):
		return fmt.Errorf("nats topology: prefix %q must be one token of [a-z0-9_-]", t.Prefix)
	case t.Partitions < 1:
		return fmt.Errorf("nats topology: partitions %d must be at least 1", t.Partitions)
	case t.Partitions > MaxPartitions:
		return fmt.Errorf("nats topology: partitions %d is more than %d (MaxPartitions)", t.Partitions, MaxPartitions)
	case !validName(t.IngestConsumer):
		return fmt.Errorf("nats topology: ingest consumer %q is not a valid consumer name (1 to %d bytes of UTF-8, no control character, blank, '.', '*', '>', '/' or '\\')", t.IngestConsumer, maxNameLen)
	case !ingestConsumerSortsFirst(t.IngestConsumer):
		return fmt.Errorf("nats topology: ingest consumer %q must sort before %q in byte order (as INGEST does; a name starting with a lower-case letter never does): "+
			"a single nats-server recovers a partition's consumers in name order, and recovering the history's source "+
			"consumer first removes every event the history copied that the ingest durable has not acknowledged",
			t.IngestConsumer, serverConsumerPrefix)
	case !groupNamePattern.MatchString(t.IngestGroup):
		return fmt.Errorf("nats topology: ingest group %q is not a valid priority group name (1 to 16 of [a-zA-Z0-9/_=-])", t.IngestGroup)
	case !validName(t.HistoryStream):
		return fmt.Errorf("nats topology: history stream %q is not a valid stream name (1 to %d bytes of UTF-8, no control character, blank, '.', '*', '>', '/' or '\\')", t.HistoryStream, maxNameLen)
	case len(t.PartitionStream(t.Partitions-1)) > maxNameLen, len(t.DeadLetterStream()) > maxNameLen,
		len("KV_"+t.budgetBucket()) > maxNameLen:
		return fmt.Errorf("nats topology: prefix %q makes stream names longer than JetStream's %d bytes", t.Prefix, maxNameLen)
	case t.PublishTimeout < 0, t.AckWait < 0, t.PinnedTTL < 0, t.DuplicateWindow < 0, t.HistoryMaxAge < 0:
		return fmt.Errorf("nats topology: durations must not be negative")
	case t.HistoryMaxAge < minMaxAge:
		// Else the manifests carried a max age every server refuses on apply, and
		// EmbeddedNATS failed only as it created the history.
		return fmt.Errorf("nats topology: history max age %s is below %s, the least a stream's max age may be", t.HistoryMaxAge, minMaxAge)
	case t.PublishTimeout > maxPublishTimeout:
		return fmt.Errorf("nats topology: publish timeout %s is above %s: the partitions would keep every event's id for three times as long", t.PublishTimeout, maxPublishTimeout)
	case t.MaxAckPending < 0, t.Prefetch < 0, t.Replicas < 0:
		return fmt.Errorf("nats topology: counts must not be negative")
	case t.PartitionMaxBytes < 0, t.MaxMsgsPerSubject < 0, t.DeadLetterMaxBytes < 0:
		// JetStream reads -1 as "no limit": the partitions' limits are what refuses a
		// publish with ErrQueueFull before the disk fills, the partitions discard new
		// per subject only under a cap, and a dead-letter stream without a byte bound
		// fills the disk with one flood.
		return fmt.Errorf("nats topology: partition max bytes %d, max msgs per subject %d and dead-letter max bytes %d must not be negative",
			t.PartitionMaxBytes, t.MaxMsgsPerSubject, t.DeadLetterMaxBytes)
	case t.HistoryMaxBytes < -1, t.DeadLetterMaxMsgsPerSubject < -1:
		return fmt.Errorf("nats topology: history max bytes %d and dead-letter max msgs per subject %d must be -1 (no limit) or more",
			t.HistoryMaxBytes, t.DeadLetterMaxMsgsPerSubject)
	case t.Replicas > maxReplicas:
		return fmt.Errorf("nats topology: replicas %d is more than JetStream's %d", t.Replicas, maxReplicas)
	case t.DuplicateWindow < t.minDuplicateWindow():
		return fmt.Errorf("nats topology: duplicate window %s is shorter than a publish with its retries (%s)",
			t.DuplicateWindow, t.minDuplicateWindow())
	case t.PinnedTTL < minPinnedTTL:
		return fmt.Errorf("nats topology: pinned TTL %s is below %s (twice the worker's pull expiry %s): an idle worker "+
			"pulls again only once its pull expires, so a shorter TTL unpins partitions from live workers", t.PinnedTTL, minPinnedTTL, pullExpiry)
	}
	return t.checkStreamNames()
}

// checkStreamNames refuses two streams of one name. A history named as the
// dead-letter stream opened that stream as the history, whose hub and replays then saw
// none of the events; named as a partition or the budgets bucket's stream, it failed
// later with the server's error where the configurations clash. Names that differ only
// in case are distinct streams to the server; the manifests, which cannot tell them
// apart, refuse them there (checkManifestNames).
func (t NATSTopology) checkStreamNames() error {
	streams := t.namedStreams()
	seen := make(map[string]int, len(streams))
	for i, s := range streams {
		if j, taken := seen[s.name]; taken {
			return fmt.Errorf("nats topology: %s and %s are both named %q: each stream needs a name of its own", streams[j].what, s.what, s.name)
		}
		seen[s.name] = i
	}
	return nil
}

// namedStream is one stream the topology names, with what it is for errors.
type namedStream struct {
	name, what string
	manifested bool // in the NACK manifests (the budgets bucket is EmbeddedNATS's alone)
}

// namedStreams lists the streams the topology names: the partitions, the history, the
// dead-letter stream and EmbeddedNATS's budgets bucket's stream (KV_<PREFIX>_BUDGETS).
func (t NATSTopology) namedStreams() []namedStream {
	streams := make([]namedStream, 0, t.Partitions+3)
	for p := range t.Partitions {
		streams = append(streams, namedStream{t.PartitionStream(p), "ingest partition " + strconv.Itoa(p) + "'s stream", true})
	}
	return append(streams,
		namedStream{t.HistoryStream, "the history stream", true},
		namedStream{t.DeadLetterStream(), "the dead-letter stream", true},
		namedStream{"KV_" + t.budgetBucket(), "the budgets bucket's stream", false})
}

// partitionOfStream reports which partition's stream name is, whatever the count: a
// store may hold partitions of an earlier, larger count.
func (t NATSTopology) partitionOfStream(name string) (int, bool) {
	suffix, ok := strings.CutPrefix(name, strings.TrimSuffix(t.PartitionStream(0), "0"))
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(suffix)
	return p, err == nil && p >= 0 && t.PartitionStream(p) == name
}

// minPinnedTTL is the shortest PinnedTTL that keeps a live worker's pins: the server
// keeps a pin while the pinned worker's pulls keep coming, and an idle worker sends
// its next pull only when the last one expires (pullExpiry), so half the TTL is left
// for a slow pull to arrive.
const minPinnedTTL = 2 * pullExpiry

// ingestConsumerSortsFirst reports whether a durable of this name is recovered before
// the server's own consumers. Measured on nats-server 2.14.10 to 2.15.3, and read in
// its source (upstream_recovery_test.go pins it): a standalone server recovers a
// stream's consumers in directory order, and resets a source consumer to its ack
// floor as it recovers it; on an interest stream that reset removes every event at or
// below the floor in which no consumer recovered so far is interested. The ingest
// durable must be among those, or a restart loses every event the history copied and
// the worker had not yet acknowledged. A clustered server recovers through its meta
// layer, but the rule costs nothing there and keeps one topology for both.
func ingestConsumerSortsFirst(name string) bool { return name < serverConsumerPrefix }

// validName reports whether s is a usable stream or consumer name.
func validName(s string) bool {
	return s != "" && len(s) <= maxNameLen && utf8.ValidString(s) &&
		!strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || strings.ContainsRune(".*> /\\", r) })
}

// maxPublishTimeout bounds PublishTimeout, which the duplicate window must cover three
// times over (see minDuplicateWindow).
const maxPublishTimeout = time.Hour

// maxNameLen is the longest stream or consumer name JetStream takes (its JSMaxNameLen).
const maxNameLen = 255

// minDuplicateWindow is the time from a publish's first attempt to the end of its last
// retry: (retries+1) x PublishTimeout + retries x retry wait. A duplicate window below
// it lets a retried publish be stored twice.
func (t NATSTopology) minDuplicateWindow() time.Duration {
	timeout := t.PublishTimeout
	if timeout == 0 {
		timeout = defaultPublishTimeout
	}
	// Saturating: a timeout of centuries must not wrap round to a negative minimum
	// that any window passes.
	if timeout > (math.MaxInt64-publishRetries*publishRetryWait)/(publishRetries+1) {
		return math.MaxInt64
	}
	return (publishRetries+1)*timeout + publishRetries*publishRetryWait
}

// budgetBucket names the key-value bucket of EmbeddedNATS's budgets.
func (t NATSTopology) budgetBucket() string { return strings.ToUpper(t.Prefix) + "_BUDGETS" }

func (t NATSTopology) subjects() subjects { return subjects{prefix: t.Prefix, n: t.Partitions} }

// workerSubject is the core NATS subject the ingest workers sharing the durable
// exchange their presence on: "<prefix>.workers.<IngestConsumer>".
func (t NATSTopology) workerSubject() string { return t.Prefix + ".workers." + t.IngestConsumer }

// PartitionStream names partition p's stream: "<PREFIX>_INGEST_<p>".
func (t NATSTopology) PartitionStream(p int) string {
	return strings.ToUpper(t.Prefix) + "_INGEST_" + strconv.Itoa(p)
}

// DeadLetterStream names the dead-letter stream: "<PREFIX>_DLQ".
func (t NATSTopology) DeadLetterStream() string { return strings.ToUpper(t.Prefix) + "_DLQ" }

// partitionConfig is partition p's stream: interest retention so an acknowledged event
// leaves, discard new so a full partition pushes back, no max age so nothing unwritten
// expires, purge and delete denied, and atomic batches allowed (Batch.Atomic).
func (t NATSTopology) partitionConfig(p int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 t.PartitionStream(p),
		Subjects:             []string{t.subjects().partitionFilter(p)},
		Retention:            jetstream.InterestPolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    t.MaxMsgsPerSubject,
		MaxBytes:             t.PartitionMaxBytes,
		MaxMsgs:              -1,
		MaxAge:               0,
		MaxMsgSize:           -1,
		Storage:              jetstream.FileStorage,
		Replicas:             t.Replicas,
		Duplicates:           t.DuplicateWindow,
		DenyPurge:            true,
		DenyDelete:           true,
		AllowAtomicPublish:   true,
		Metadata: map[string]string{
			metaPartition:  strconv.Itoa(p),
			metaPartitions: strconv.Itoa(t.Partitions),
		},
	}
}

// ingestConsumerConfig is the durable on partition p: pull, explicit ack, never
// expiring, redelivering without limit from the first event, and pinned to one
// worker at a time in the group IngestGroup, so workers sharing the partitions never
// interleave a tenant's events. The server updates these fields of an existing
// durable in place, keeping its ack floor and pending events (checkNewConsumerConfig
// in nats-server v2.15.2 allows it).
func (t NATSTopology) ingestConsumerConfig(p int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        t.IngestConsumer,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        t.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  t.MaxAckPending,
		FilterSubject:  t.subjects().partitionFilter(p),
		ReplayPolicy:   jetstream.ReplayInstantPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{t.IngestGroup},
		PinnedTTL:      t.PinnedTTL,
	}
}

// historyConfig is the history: no subjects of its own, a source per partition, and
// limits retention with discard old, so a full history never holds rows on the
// partitions; its metadata sets the alerts of `nats server check stream`.
func (t NATSTopology) historyConfig() jetstream.StreamConfig {
	sources := make([]*jetstream.StreamSource, t.Partitions)
	for p := range sources {
		sources[p] = &jetstream.StreamSource{Name: t.PartitionStream(p)}
	}
	return jetstream.StreamConfig{
		Name:       t.HistoryStream,
		Sources:    sources,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardOld,
		MaxAge:     t.HistoryMaxAge,
		MaxBytes:   t.HistoryMaxBytes,
		MaxMsgs:    -1,
		MaxMsgSize: -1,
		Storage:    jetstream.FileStorage,
		Replicas:   t.Replicas,
		Metadata:   t.historyMonitorMetadata(),
	}
}

// deadLetterConfig is the dead-letter stream: limits retention, discard old, and a
// per-topic cap so one flooding topic evicts only its own parked events.
func (t NATSTopology) deadLetterConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              t.DeadLetterStream(),
		Subjects:          []string{t.subjects().deadLetterAll()},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxBytes:          t.DeadLetterMaxBytes,
		MaxMsgsPerSubject: t.DeadLetterMaxMsgsPerSubject,
		MaxMsgs:           -1,
		MaxMsgSize:        -1,
		Storage:           jetstream.FileStorage,
		Replicas:          t.Replicas,
	}
}

// durableFor maps a consumer name onto the ingest durable: the worker's own name, the
// configured one, the durable's previous default "wh-ingest" (so a host written
// against it keeps working) and "" (the default) do; anything else is
// ErrConsumerNotFound.
func (t NATSTopology) durableFor(name string) (string, error) {
	if name == "" || name == WorkerDurable || name == t.IngestConsumer || name == legacyIngestConsumer {
		return t.IngestConsumer, nil
	}
	return "", fmt.Errorf("%w: %q (known: %q, %q)", ErrConsumerNotFound, name, WorkerDurable, t.IngestConsumer)
}
