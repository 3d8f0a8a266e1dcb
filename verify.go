package mq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Severity says whether a Finding refuses boot.
type Severity int

const (
	// Required findings refuse boot: the broker cannot work correctly on that cluster.
	Required Severity = iota + 1
	// Recommended findings are logged: the broker works, with a weaker guarantee.
	Recommended
)

func (s Severity) String() string {
	switch s {
	case Required:
		return "required"
	case Recommended:
		return "recommended"
	}
	return "severity(" + strconv.Itoa(int(s)) + ")"
}

// Finding is one difference between the cluster and the topology. Field is named as
// in JetStream's JSON configuration.
type Finding struct {
	Severity Severity
	Object   string // e.g. "stream WH_INGEST_0", "consumer WH_INGEST_0/INGEST"
	Field    string // e.g. "retention", "duplicate_window"
	Problem  string
	// Transient marks a required finding that resolves on its own: a history source
	// not attached yet. Boot waits for it; the periodic re-check ignores it.
	Transient bool
}

func (f Finding) String() string {
	return f.Severity.String() + ": " + f.Object + ": " + f.Field + ": " + f.Problem
}

// TopologyError lists every finding of the last check that refused boot. It unwraps to
// ErrTopology.
type TopologyError struct {
	Findings []Finding
}

func (e *TopologyError) Error() string {
	var b strings.Builder
	b.WriteString("nats topology does not match what mq needs:")
	for _, f := range e.Findings {
		b.WriteString("\n  - ")
		b.WriteString(f.String())
	}
	return b.String()
}

func (e *TopologyError) Unwrap() error { return ErrTopology }

// hasRequired reports whether findings hold a required one (transient included).
func hasRequired(findings []Finding) bool {
	return slices.ContainsFunc(findings, func(f Finding) bool { return f.Severity == Required })
}

// Server versions the verifier accepts and the line the package is tested against.
const (
	minServerMajor, minServerMinor = 2, 10
	testedServerLine               = "2.15."
)

// Boot wait backoff.
const (
	awaitFirstBackoff = 250 * time.Millisecond
	awaitMaxBackoff   = 5 * time.Second
)

// VerifyNATSTopology checks the cluster js is connected to against topo (defaults
// applied) and returns every finding at once, required first. Partitions and the
// dead-letter stream are found by subject, the history by name. An error means the
// check could not run (the server was not reached or refused a request); a missing
// object is a finding.
func VerifyNATSTopology(ctx context.Context, js jetstream.JetStream, topo NATSTopology) ([]Finding, error) {
	if err := verifyArgs("verify nats topology", ctx, js); err != nil {
		return nil, err
	}
	topo = topo.WithDefaults()
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	return newVerifier(js, topo).run(ctx)
}

func newVerifier(js jetstream.JetStream, topo NATSTopology) *verifier {
	v := &verifier{topo: topo, subs: topo.subjects(), js: js}
	v.holders = v.streamsHolding
	return v
}

// run performs one check.
func (v *verifier) run(ctx context.Context) ([]Finding, error) {
	v.checkServer(v.js.Conn().ConnectedServerVersion())
	if err := v.checkPartitions(ctx); err != nil {
		return nil, err
	}
	if err := v.checkHistory(ctx); err != nil {
		return nil, err
	}
	if err := v.checkDeadLetters(ctx); err != nil {
		return nil, err
	}
	slices.SortStableFunc(v.findings, func(a, b Finding) int { return cmp.Compare(a.Severity, b.Severity) })
	return v.findings, nil
}

// AwaitNATSTopology repeats VerifyNATSTopology, backing off from 250 ms doubling to
// 5 s, until no required finding is left, and returns the recommended ones. When wait
// runs out it returns a *TopologyError with the last check's findings, or the last
// check's error if it could not run; when ctx ends first, the error wraps ctx's error
// and that same one. Each check's requests are bounded by the wait.
func AwaitNATSTopology(ctx context.Context, js jetstream.JetStream, topo NATSTopology, wait time.Duration) ([]Finding, error) {
	if err := verifyArgs("await nats topology", ctx, js); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	backoff := awaitFirstBackoff
	var lastFindings []Finding
	var lastErr error
	for {
		findings, err := VerifyNATSTopology(wctx, js, topo)
		if err == nil && !hasRequired(findings) {
			return findings, nil
		}
		// A check cut short by the end of the wait says less than the one before it.
		if wctx.Err() == nil || (lastFindings == nil && lastErr == nil) {
			lastFindings, lastErr = findings, err
		}
		if sleepCtx(wctx, backoff) != nil {
			var last error = &TopologyError{Findings: lastFindings}
			if lastErr != nil {
				last = fmt.Errorf("check nats topology: %w", lastErr)
			}
			// A caller's ctx shorter than the wait (NewNATS waits a minute by
			// default) is no reason to lose what the checks found: both show.
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("await nats topology: %w before it verified: %w", err, last)
			}
			return nil, last
		}
		backoff = min(2*backoff, awaitMaxBackoff)
	}
}

type verifier struct {
	topo NATSTopology
	subs subjects
	js   jetstream.JetStream
	// holders lists the streams whose subjects hold a subject.
	holders  func(ctx context.Context, subject string) ([]string, error)
	findings []Finding
	// partitionStreams[p] is the stream found for partition p, "" when none.
	partitionStreams []string
}

// jsonName spells an enum value as JetStream's JSON does ("limits", "explicit",
// "pinned_client"), the spelling of the field names and of an operator's manifests;
// the Go names differ from it and from each other ("Limits", "DiscardOld", "AckAll").
func jsonName(v json.Marshaler) string {
	var name string
	if b, err := v.MarshalJSON(); err == nil && json.Unmarshal(b, &name) == nil {
		return name
	}
	return fmt.Sprint(v)
}

func (v *verifier) add(sev Severity, object, field, format string, args ...any) {
	v.findings = append(v.findings, Finding{Severity: sev, Object: object, Field: field, Problem: fmt.Sprintf(format, args...)})
}

// checkServer needs 2.10 (stream metadata, subject-filtered stream info,
// discard_new_per_subject) and recommends the tested line.
func (v *verifier) checkServer(version string) {
	major, minor, _, ok := parseServerVersion(version)
	switch {
	case !ok:
		v.add(Required, "server", "version", "cannot read server version %q", version)
	case major < minServerMajor || (major == minServerMajor && minor < minServerMinor):
		v.add(Required, "server", "version", "%s is older than %d.%d.0 (stream metadata, subject-filtered stream info and discard_new_per_subject)",
			version, minServerMajor, minServerMinor)
	case !strings.HasPrefix(strings.TrimPrefix(version, "v"), testedServerLine):
		v.add(Recommended, "server", "version", "%s: mq is tested against %sx", version, testedServerLine)
	}
}

// parseServerVersion reads major.minor.patch, tolerating a leading "v" and a suffix
// such as "-beta".
func parseServerVersion(s string) (major, minor, patch int, ok bool) {
	parts := strings.SplitN(strings.TrimPrefix(s, "v"), ".", 3)
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	nums := make([]int, 3)
	for i, p := range parts {
		end := 0
		for end < len(p) && '0' <= p[end] && p[end] <= '9' {
			end++
		}
		n, err := strconv.Atoi(p[:end])
		if err != nil {
			return 0, 0, 0, false
		}
		nums[i] = n
	}
	return nums[0], nums[1], nums[2], true
}

// streamsHolding lists the streams whose subjects hold subject.
func (v *verifier) streamsHolding(ctx context.Context, subject string) ([]string, error) {
	lister := v.js.StreamNames(ctx, jetstream.WithStreamListSubject(subject))
	var names []string
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list streams holding %s: %w", subject, err)
	}
	slices.Sort(names)
	return names, nil
}

// streamInfo returns a stream's info, or nil when it does not exist.
func (v *verifier) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	s, err := v.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s.CachedInfo(), nil
}

func (v *verifier) checkPartitions(ctx context.Context) error {
	v.partitionStreams = make([]string, v.topo.Partitions)
	owner := map[string]int{}
	for p := range v.topo.Partitions {
		probe := v.subs.ingest(p, "x")
		names, err := v.holders(ctx, probe)
		if err != nil {
			return err
		}
		object := "ingest partition " + strconv.Itoa(p)
		switch {
		case len(names) == 0:
			v.add(Required, object, "subjects", "no stream holds %s (create %s with subjects %s)",
				v.subs.partitionFilter(p), v.topo.PartitionStream(p), v.subs.partitionFilter(p))
			continue
		case len(names) > 1:
			v.add(Required, object, "subjects", "streams %s all hold %s: exactly one may", strings.Join(names, ", "), probe)
			continue
		}
		name := names[0]
		if q, taken := owner[name]; taken {
			v.add(Required, "stream "+name, "subjects", "holds partitions %d and %d: each partition needs a stream of its own", q, p)
			continue
		}
		owner[name] = p
		info, err := v.streamInfo(ctx, name)
		if err != nil {
			return err
		}
		if info == nil {
			v.add(Required, "stream "+name, "name", "found by subject but not by name")
			continue
		}
		v.partitionStreams[p] = name
		v.checkPartition(p, info.Config)
		if err := v.checkDurable(ctx, p, name); err != nil {
			return err
		}
	}
	return v.checkExtraPartitions(ctx, owner)
}

func (v *verifier) checkPartition(p int, cfg jetstream.StreamConfig) {
	obj := "stream " + cfg.Name
	filter := v.subs.partitionFilter(p)
	if !slices.Contains(cfg.Subjects, filter) {
		v.add(Required, obj, "subjects", "%v must include %s", cfg.Subjects, filter)
	}
	if cfg.Retention != jetstream.InterestPolicy {
		v.add(Required, obj, "retention", "is %s, must be interest: an acknowledged event must leave the partition", jsonName(cfg.Retention))
	}
	if cfg.Discard != jetstream.DiscardNew {
		v.add(Required, obj, "discard", "is %s, must be new: a full partition must refuse, not drop unwritten events", jsonName(cfg.Discard))
	}
	if cfg.MaxBytes <= 0 {
		v.add(Required, obj, "max_bytes", "is unlimited, must be set: it bounds the disk and signals backpressure")
	}
	if cfg.MaxAge != 0 {
		v.add(Required, obj, "max_age", "is %s, must be 0: an age limit drops events nobody has written yet", cfg.MaxAge)
	}
	if cfg.Storage != jetstream.FileStorage {
		v.add(Required, obj, "storage", "is %s, must be file", jsonName(cfg.Storage))
	}
	if floor := v.topo.minDuplicateWindow(); cfg.Duplicates < floor {
		v.add(Required, obj, "duplicate_window", "is %s, must be at least %s: a publish's retries span (%d+1) x %s + %d x %s",
			cfg.Duplicates, floor, publishRetries, v.topo.PublishTimeout, publishRetries, publishRetryWait)
	}
	if cfg.NoAck {
		v.add(Required, obj, "no_ack", "is set: publishes would not be confirmed")
	}
	if cfg.Sealed {
		v.add(Required, obj, "sealed", "is set: a sealed stream takes no publishes")
	}
	if cfg.Mirror != nil {
		v.add(Required, obj, "mirror", "is set: a partition must not mirror another stream")
	}
	if cfg.MaxMsgsPerSubject > 0 && !cfg.DiscardNewPerSubject {
		v.add(Required, obj, "discard_new_per_subject", "must be set with max_msgs_per_subject %d, or the server evicts a topic's oldest unwritten events",
			cfg.MaxMsgsPerSubject)
	}
	if cfg.MaxMsgsPerSubject <= 0 {
		v.add(Recommended, obj, "max_msgs_per_subject", "is unlimited: set it (with discard_new_per_subject) to bound one topic's backlog")
	}
	if !cfg.DenyPurge || !cfg.DenyDelete {
		v.add(Recommended, obj, "deny_purge", "set deny_purge and deny_delete, so unwritten events cannot be removed by hand")
	}
	if !cfg.AllowAtomicPublish {
		v.add(Recommended, obj, "allow_atomic", "is not set: atomic batches (Batch.Atomic) are refused with ErrTopology; pipelined batches work")
	}
	if cfg.Replicas < 3 {
		v.add(Recommended, obj, "num_replicas", "is %d: use 3 so a node loss keeps every acknowledged event", cfg.Replicas)
	}
	gotP, okP := cfg.Metadata[metaPartition]
	gotN, okN := cfg.Metadata[metaPartitions]
	switch {
	case !okP || !okN:
		v.add(Recommended, obj, "metadata", "set %s and %s, so a wrong partition count is caught", metaPartition, metaPartitions)
	case gotP != strconv.Itoa(p) || gotN != strconv.Itoa(v.topo.Partitions):
		v.add(Required, obj, "metadata", "says partition %s of %s, this process runs partition %d of %d: check the partitions setting",
			gotP, gotN, p, v.topo.Partitions)
	}
}

func (v *verifier) checkDurable(ctx context.Context, p int, stream string) error {
	if err := v.checkLegacyDurable(ctx, stream); err != nil {
		return err
	}
	obj := "consumer " + stream + "/" + v.topo.IngestConsumer
	cons, err := v.js.Consumer(ctx, stream, v.topo.IngestConsumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		v.add(Required, obj, "durable_name", "does not exist: a partition must never take publishes without its durable")
		return nil
	}
	var cfg jetstream.ConsumerConfig
	switch {
	case errors.Is(err, jetstream.ErrNotPullConsumer):
		push, err := v.js.PushConsumer(ctx, stream, v.topo.IngestConsumer)
		if err != nil {
			return fmt.Errorf("%s: %w", obj, err)
		}
		cfg = push.CachedInfo().Config
	case err != nil:
		return fmt.Errorf("%s: %w", obj, err)
	default:
		cfg = cons.CachedInfo().Config
	}
	filter := v.subs.partitionFilter(p)
	if cfg.DeliverSubject != "" {
		v.add(Required, obj, "deliver_subject", "is %q: the durable must be a pull consumer", cfg.DeliverSubject)
	}
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		v.add(Required, obj, "ack_policy", "is %s, must be explicit", jsonName(cfg.AckPolicy))
	}
	if cfg.AckWait < v.topo.AckWait {
		v.add(Required, obj, "ack_wait", "is %s, must be at least the worker's %s", cfg.AckWait, v.topo.AckWait)
	}
	if cfg.MaxDeliver != -1 {
		v.add(Required, obj, "max_deliver", "is %d, must be -1: an event that keeps failing would stay undelivered for good", cfg.MaxDeliver)
	}
	switch {
	case cfg.MaxAckPending <= 0:
		v.add(Required, obj, "max_ack_pending", "is %d, must be set", cfg.MaxAckPending)
	case cfg.MaxAckPending < defaultMaxAckPending:
		v.add(Recommended, obj, "max_ack_pending", "is %d, below %d: the worker's batches stall early", cfg.MaxAckPending, defaultMaxAckPending)
	}
	if cfg.DeliverPolicy != jetstream.DeliverAllPolicy {
		v.add(Required, obj, "deliver_policy", "is %s, must be all", jsonName(cfg.DeliverPolicy))
	}
	filters := slices.Clone(cfg.FilterSubjects)
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) > 1 || (len(filters) == 1 && filters[0] != filter) {
		v.add(Required, obj, "filter_subject", "is %v, must be empty or %s", filters, filter)
	}
	if cfg.HeadersOnly {
		v.add(Required, obj, "headers_only", "is set: acknowledging an empty body would delete the event")
	}
	if cfg.ReplayPolicy != jetstream.ReplayInstantPolicy {
		v.add(Required, obj, "replay_policy", "is %s, must be instant", jsonName(cfg.ReplayPolicy))
	}
	if cfg.InactiveThreshold != 0 {
		v.add(Required, obj, "inactive_threshold", "is %s, must be 0: the durable must never expire", cfg.InactiveThreshold)
	}
	if share := max(1, v.topo.Prefetch/v.topo.Partitions); cfg.MaxRequestBatch != 0 && cfg.MaxRequestBatch < share {
		v.add(Required, obj, "max_request_batch", "is %d, must be 0 or at least the worker's share of the prefetch, %d", cfg.MaxRequestBatch, share)
	}
	if cfg.MaxRequestExpires > 0 && cfg.MaxRequestExpires < pullExpiry {
		v.add(Required, obj, "max_request_expires", "is %s, must be 0 or at least the worker's pull expiry %s: every pull would be refused",
			cfg.MaxRequestExpires, pullExpiry)
	}
	v.checkPinning(obj, cfg)
	return nil
}

// checkPinning checks that the durable pins each partition to one worker at a time, in
// the group the workers pull in, for long enough that a live worker keeps its pin.
func (v *verifier) checkPinning(obj string, cfg jetstream.ConsumerConfig) {
	if cfg.PriorityPolicy != jetstream.PriorityPolicyPinned {
		v.add(Required, obj, "priority_policy", "is %s, must be pinned_client: otherwise several workers pull the partition at once and interleave a tenant's events",
			cmp.Or(jsonName(cfg.PriorityPolicy), "none"))
		return // groups and a TTL pin nothing without the policy
	}
	if !slices.Contains(cfg.PriorityGroups, v.topo.IngestGroup) {
		v.add(Required, obj, "priority_groups", "is %v, must include %q: the workers pull in that group, and the server refuses a pull in any other",
			cfg.PriorityGroups, v.topo.IngestGroup)
	}
	switch {
	case cfg.PinnedTTL < minPinnedTTL:
		v.add(Required, obj, "priority_timeout", "is %s, must be at least %s (the pinned TTL; twice the worker's pull expiry %s): an idle worker pulls again only once its pull expires, so live workers would lose their pin",
			cfg.PinnedTTL, minPinnedTTL, pullExpiry)
	case cfg.PinnedTTL > cfg.AckWait:
		v.add(Recommended, obj, "priority_timeout", "is %s, above the ack wait %s (the pinned TTL): a dead worker's partitions wait longer for another worker than its unsettled events wait for redelivery",
			cfg.PinnedTTL, cfg.AckWait)
	}
}

// checkExtraPartitions reports streams holding ingest subjects that are not one of the
// N partitions: left behind by a lower N, or made by hand.
func (v *verifier) checkExtraPartitions(ctx context.Context, owner map[string]int) error {
	names, err := v.holders(ctx, v.subs.ingestAll())
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, ok := owner[name]; ok {
			continue
		}
		_, err := v.js.Consumer(ctx, name, v.topo.IngestConsumer)
		switch {
		case err == nil:
			v.add(Recommended, "stream "+name, "subjects", "holds ingest subjects but is not one of the %d partitions: only a process still running the old partition count drains it through %s; delete it once empty",
				v.topo.Partitions, v.topo.IngestConsumer)
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			v.add(Recommended, "stream "+name, "subjects", "holds ingest subjects but is not one of the %d partitions and has no %s: nothing drains it; delete it",
				v.topo.Partitions, v.topo.IngestConsumer)
		default:
			return fmt.Errorf("consumer %s/%s: %w", name, v.topo.IngestConsumer, err)
		}
	}
	return nil
}

// checkLegacyDurable reports the durable's earlier default name still on a partition:
// nothing acknowledges it any more, so it holds every event until it is deleted, and
// the partition fills. Deleting it once the current durable exists loses nothing.
func (v *verifier) checkLegacyDurable(ctx context.Context, stream string) error {
	_, err := v.js.Consumer(ctx, stream, legacyIngestConsumer)
	switch {
	case err == nil, errors.Is(err, jetstream.ErrNotPullConsumer):
		v.add(Recommended, "consumer "+stream+"/"+legacyIngestConsumer, "durable_name",
			"is the ingest durable's earlier name: nothing acknowledges it, so it holds every event on the partition until deleted; "+
				"delete it once %s exists (a single server loses unacknowledged events on restart under a name that sorts after \"JS_\")",
			v.topo.IngestConsumer)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	default:
		return fmt.Errorf("consumer %s/%s: %w", stream, legacyIngestConsumer, err)
	}
	return nil
}

// verifyArgs refuses what would otherwise panic inside nats.go, in a goroutine of its
// own where a caller's recover cannot reach it.
func verifyArgs(op string, ctx context.Context, js jetstream.JetStream) error {
	if ctx == nil {
		return errNilContext(op)
	}
	if js == nil {
		return fmt.Errorf("%s: nil JetStream: %w", op, ErrInvalidConfig)
	}
	return nil
}
