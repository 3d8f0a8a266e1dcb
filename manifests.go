package mq

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
)

// nackAPIVersion is the NACK (JetStream controller for Kubernetes) API the manifests
// are written for.
const nackAPIVersion = "jetstream.nats.io/v1beta2"

// WriteNATSManifests writes the topology as one multi-document YAML stream of NACK
// resources: the Account NACK connects with, then for each partition its stream and
// durable, then the history and the dead-letter stream, each naming the Account. Every field the verifier checks is written out,
// because NACK's defaults differ from JetStream's (memory storage, a 1 ns ack wait).
func WriteNATSManifests(w io.Writer, topo NATSTopology) error {
	topo = topo.WithDefaults()
	if err := topo.Validate(); err != nil {
		return err
	}
	if err := topo.checkManifestNames(); err != nil {
		return err
	}
	var buf bytes.Buffer
	buf.WriteString(manifestHeader(topo))
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(nackAccountResource()); err != nil {
		return err
	}
	for p := range topo.Partitions {
		cfg := topo.partitionConfig(p)
		if err := enc.Encode(nackStreamResource(cfg)); err != nil {
			return err
		}
		if err := enc.Encode(nackConsumerResource(cfg.Name, topo.ingestConsumerConfig(p))); err != nil {
			return err
		}
	}
	for _, cfg := range []jetstream.StreamConfig{topo.historyConfig(), topo.deadLetterConfig()} {
		if err := enc.Encode(nackStreamResource(cfg)); err != nil {
			return err
		}
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// ManifestsCommand is the command line that regenerates the manifests of topo.
func ManifestsCommand(topo NATSTopology) string {
	topo = topo.WithDefaults()
	cmd := fmt.Sprintf("go run ./cmd/mqctl manifests -partitions %d -replicas %d", topo.Partitions, topo.Replicas)
	if topo.Prefix != defaultPrefix {
		cmd += " -prefix " + topo.Prefix
	}
	def := NATSTopology{Prefix: topo.Prefix}.WithDefaults()
	for _, f := range []struct{ flag, got, def string }{
		{"history", topo.HistoryStream, def.HistoryStream},
		{"ingest-consumer", topo.IngestConsumer, def.IngestConsumer},
		{"ingest-group", topo.IngestGroup, def.IngestGroup},
	} {
		if f.got != f.def {
			cmd += " -" + f.flag + " " + f.got
		}
	}
	if topo.HistoryMaxAge != def.HistoryMaxAge {
		cmd += " -history-max-age " + topo.HistoryMaxAge.String()
	}
	return cmd
}

func manifestHeader(topo NATSTopology) string {
	lines := []string{
		"NACK (jetstream.nats.io/v1beta2) resources for the mq NATS topology.",
		fmt.Sprintf("%d ingest partitions %s_INGEST_0..%d, each with its durable %s; the history %s sourcing them; the dead-letter stream %s.",
			topo.Partitions, strings.ToUpper(topo.Prefix), topo.Partitions-1, topo.IngestConsumer, topo.HistoryStream, topo.DeadLetterStream()),
		"Generated; do not edit. Regenerate with:",
		"  " + ManifestsCommand(topo),
		"Sizes (maxBytes) are starting points: tune them to the volume each stream may reserve.",
		"Set the history's maxAge to at least the longest SSE gap window served.",
		"Apply order is free: mq publishes nothing until all of it exists. But a partition must never",
		"take publishes without its durable: an interest stream stores a publish nowhere when no",
		"consumer covers it.",
		fmt.Sprintf("Keep the durable's name %s sorting before \"JS_\" (byte order): a single nats-server", topo.IngestConsumer),
		"(2.14 to at least 2.15.3) recovers a partition's consumers in name order, and recovering the",
		"history's source consumer JS_SRC_* first removes every event the history copied that the worker",
		"had not yet acknowledged. A cluster with a durable of another name (wh-ingest, the earlier",
		"default) needs this one created first; then delete the old one, and its unacknowledged",
		"events come to this one.",
		fmt.Sprintf("The durable pins each partition to one worker at a time (priorityPolicy pinned_client, group %s,", topo.IngestGroup),
		fmt.Sprintf("pinnedTtl %s), so workers sharing the partitions never interleave a tenant's events. A durable", formatDuration(topo.PinnedTTL)),
		"created without it by an earlier version is updated in place when this is applied: the server",
		"keeps its ack floor and unacknowledged events.",
		fmt.Sprintf("NACK connects through the Account %s, which every resource names (account:), to", nackAccount),
		fmt.Sprintf("%s as the chart's user nack (values.yaml), reading its name and password from", nackServers),
		fmt.Sprintf("the Secret %s, keys %s and %s (beside wavehouse, which values.yaml reads):", nackUsersSecret, nackUserKey, nackPasswordKey),
		fmt.Sprintf("  kubectl create secret generic %s --from-literal=%s=nack --from-literal=%s=... --from-literal=wavehouse=...",
			nackUsersSecret, nackUserKey, nackPasswordKey),
		"Without the Account, NACK's own connection takes only creds, an nkey or TLS: not this password user.",
		fmt.Sprintf("The history's io.nats.monitor.* metadata makes `nats server check stream --stream %s`", topo.HistoryStream),
		fmt.Sprintf("alert when it has other than %d sources, or one is %d events behind or silent for %s.", topo.Partitions,
			historyLagCritical, historySeenCritical),
		"Nothing here is redundant; every field below is checked by the mq verifier at boot:",
		"  maxAge: 0s on a partition: NACK's default for a missing maxAge is one year, and an unwritten",
		"    event must never expire;",
		"  denyDelete, denyPurge and preventDelete on a partition: they hold events no worker has written;",
		"  maxDeliver: -1 on the durable: the worker parks a poison event itself (with why) and acks it;",
		"    a server-side limit would stop redelivering without parking, leaving the event stuck.",
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

// The Account the resources name: NACK connects as the Helm values' nack user, whose
// name and password the Secret holds (NACK's Account reads a user's name and password
// from the keys it is given).
const (
	nackAccount     = "wavehouse"
	nackServers     = "nats://nats:4222" // the chart's client Service, release "nats"
	nackUsersSecret = "nats-users"
	nackUserKey     = "nack-user"
	nackPasswordKey = "nack"
)

// nackAccountSpec holds the Account fields the manifests write.
type nackAccountSpec struct {
	Name    string          `yaml:"name"`
	Servers []string        `yaml:"servers"`
	User    nackAccountUser `yaml:"user"`
}

type nackAccountUser struct {
	Secret   nackMeta `yaml:"secret"`
	User     string   `yaml:"user"`
	Password string   `yaml:"password"`
}

func nackAccountResource() nackResource[nackAccountSpec] {
	return nackResource[nackAccountSpec]{APIVersion: nackAPIVersion, Kind: "Account", Metadata: nackMeta{nackAccount},
		Spec: nackAccountSpec{Name: nackAccount, Servers: []string{nackServers},
			User: nackAccountUser{Secret: nackMeta{nackUsersSecret}, User: nackUserKey, Password: nackPasswordKey}}}
}

type nackMeta struct {
	Name string `yaml:"name"`
}

type nackResource[S any] struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   nackMeta `yaml:"metadata"`
	Spec       S        `yaml:"spec"`
}

// nackStreamSpec holds the Stream fields the manifests write, named as in NACK's CRD.
type nackStreamSpec struct {
	Account           string            `yaml:"account"`
	Name              string            `yaml:"name"`
	Subjects          []string          `yaml:"subjects,omitempty"`
	Sources           []nackSource      `yaml:"sources,omitempty"`
	Retention         string            `yaml:"retention"`
	Discard           string            `yaml:"discard"`
	DiscardPerSubject bool              `yaml:"discardPerSubject"`
	MaxMsgsPerSubject int64             `yaml:"maxMsgsPerSubject"`
	MaxMsgs           int64             `yaml:"maxMsgs"`
	MaxBytes          int64             `yaml:"maxBytes"`
	MaxAge            string            `yaml:"maxAge"`
	MaxMsgSize        int32             `yaml:"maxMsgSize"`
	Storage           string            `yaml:"storage"`
	Replicas          int               `yaml:"replicas"`
	DuplicateWindow   string            `yaml:"duplicateWindow,omitempty"`
	NoAck             bool              `yaml:"noAck"`
	Sealed            bool              `yaml:"sealed"`
	DenyDelete        bool              `yaml:"denyDelete"`
	DenyPurge         bool              `yaml:"denyPurge"`
	AllowAtomic       bool              `yaml:"allowAtomicPublish,omitempty"`
	Metadata          map[string]string `yaml:"metadata,omitempty"`
	PreventDelete     bool              `yaml:"preventDelete"`
}

type nackSource struct {
	Name          string `yaml:"name"`
	FilterSubject string `yaml:"filterSubject,omitempty"`
}

// nackConsumerSpec holds the Consumer fields the manifests write.
type nackConsumerSpec struct {
	Account           string   `yaml:"account"`
	StreamName        string   `yaml:"streamName"`
	DurableName       string   `yaml:"durableName"`
	DeliverPolicy     string   `yaml:"deliverPolicy"`
	AckPolicy         string   `yaml:"ackPolicy"`
	AckWait           string   `yaml:"ackWait"`
	MaxDeliver        int      `yaml:"maxDeliver"`
	MaxAckPending     int      `yaml:"maxAckPending"`
	FilterSubject     string   `yaml:"filterSubject"`
	ReplayPolicy      string   `yaml:"replayPolicy"`
	HeadersOnly       bool     `yaml:"headersOnly"`
	MaxRequestBatch   int      `yaml:"maxRequestBatch"`
	InactiveThreshold string   `yaml:"inactiveThreshold,omitempty"`
	PriorityPolicy    string   `yaml:"priorityPolicy,omitempty"`
	PriorityGroups    []string `yaml:"priorityGroups,omitempty"`
	PinnedTTL         string   `yaml:"pinnedTtl,omitempty"`
	PreventDelete     bool     `yaml:"preventDelete"`
}

// crName is a Kubernetes resource name for a stream name: lowercase, '_' as '-'.
func crName(name string) string { return strings.ReplaceAll(strings.ToLower(name), "_", "-") }

// checkManifestNames refuses a topology whose streams the manifests cannot name: each
// manifested stream's resource name, crName of its own, must be a Kubernetes name, and
// no two may fold to one (WH_DLQ and wh-dlq would be one resource, one replacing the
// other when applied). The brokers themselves take such names.
func (t NATSTopology) checkManifestNames() error {
	seen := map[string]namedStream{}
	for _, s := range t.namedStreams() {
		if !s.manifested {
			continue
		}
		folded := crName(s.name)
		if len(folded) > maxKubernetesName || !kubernetesNamePattern.MatchString(folded) {
			return fmt.Errorf("%w: nats manifests: %s %q makes the Kubernetes resource name %q, which is not one (RFC 1123: at "+
				"most %d of [a-z0-9-.], starting and ending with a letter or digit; a stream is named in lower case with '_' as '-')",
				ErrInvalidConfig, s.what, s.name, folded, maxKubernetesName)
		}
		if other, taken := seen[folded]; taken {
			return fmt.Errorf("%w: nats manifests: %s %q and %s %q differ only in case or in '_' against '-': both would be the "+
				"resource %q", ErrInvalidConfig, other.what, other.name, s.what, s.name, folded)
		}
		seen[folded] = s
	}
	return nil
}

// kubernetesNamePattern is an RFC 1123 subdomain, the name Kubernetes requires of a
// custom resource such as NACK's Stream (IsDNS1123Subdomain in k8s.io/apimachinery);
// maxKubernetesName is its longest.
var kubernetesNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

const maxKubernetesName = 253

func nackStreamResource(cfg jetstream.StreamConfig) nackResource[nackStreamSpec] {
	spec := nackStreamSpec{
		Account:           nackAccount,
		Name:              cfg.Name,
		Subjects:          cfg.Subjects,
		Retention:         retentionName(cfg.Retention),
		Discard:           discardName(cfg.Discard),
		DiscardPerSubject: cfg.DiscardNewPerSubject,
		MaxMsgsPerSubject: cfg.MaxMsgsPerSubject,
		MaxMsgs:           cfg.MaxMsgs,
		MaxBytes:          cfg.MaxBytes,
		MaxAge:            formatDuration(cfg.MaxAge),
		MaxMsgSize:        cfg.MaxMsgSize,
		Storage:           storageName(cfg.Storage),
		Replicas:          cfg.Replicas,
		NoAck:             cfg.NoAck,
		Sealed:            cfg.Sealed,
		DenyDelete:        cfg.DenyDelete,
		DenyPurge:         cfg.DenyPurge,
		AllowAtomic:       cfg.AllowAtomicPublish,
		Metadata:          cfg.Metadata,
		PreventDelete:     true,
	}
	if cfg.Duplicates > 0 {
		spec.DuplicateWindow = formatDuration(cfg.Duplicates)
	}
	for _, s := range cfg.Sources {
		spec.Sources = append(spec.Sources, nackSource{Name: s.Name, FilterSubject: s.FilterSubject})
	}
	return nackResource[nackStreamSpec]{APIVersion: nackAPIVersion, Kind: "Stream", Metadata: nackMeta{crName(cfg.Name)}, Spec: spec}
}

func nackConsumerResource(stream string, cfg jetstream.ConsumerConfig) nackResource[nackConsumerSpec] {
	spec := nackConsumerSpec{
		Account:         nackAccount,
		StreamName:      stream,
		DurableName:     cfg.Durable,
		DeliverPolicy:   deliverPolicyName(cfg.DeliverPolicy),
		AckPolicy:       ackPolicyName(cfg.AckPolicy),
		AckWait:         formatDuration(cfg.AckWait),
		MaxDeliver:      cfg.MaxDeliver,
		MaxAckPending:   cfg.MaxAckPending,
		FilterSubject:   cfg.FilterSubject,
		ReplayPolicy:    replayPolicyName(cfg.ReplayPolicy),
		HeadersOnly:     cfg.HeadersOnly,
		MaxRequestBatch: cfg.MaxRequestBatch,
		PreventDelete:   true,
	}
	if cfg.InactiveThreshold > 0 {
		spec.InactiveThreshold = formatDuration(cfg.InactiveThreshold)
	}
	if cfg.PriorityPolicy != jetstream.PriorityPolicyNone {
		// NACK takes JetStream's JSON name, and pins for 5m when pinnedTtl is left out.
		spec.PriorityPolicy = jsonName(cfg.PriorityPolicy)
		spec.PriorityGroups = cfg.PriorityGroups
		if cfg.PinnedTTL > 0 {
			spec.PinnedTTL = formatDuration(cfg.PinnedTTL)
		}
	}
	return nackResource[nackConsumerSpec]{APIVersion: nackAPIVersion, Kind: "Consumer", Metadata: nackMeta{crName(stream)}, Spec: spec}
}

// The names below are the values of NACK's enums, which are JetStream's JSON names.

func retentionName(r jetstream.RetentionPolicy) string {
	switch r {
	case jetstream.InterestPolicy:
		return "interest"
	case jetstream.WorkQueuePolicy:
		return "workqueue"
	}
	return "limits"
}

func storageName(s jetstream.StorageType) string {
	if s == jetstream.MemoryStorage {
		return "memory"
	}
	return "file"
}

func ackPolicyName(a jetstream.AckPolicy) string {
	switch a {
	case jetstream.AckExplicitPolicy:
		return "explicit"
	case jetstream.AckAllPolicy:
		return "all"
	}
	return "none"
}

func replayPolicyName(r jetstream.ReplayPolicy) string {
	if r == jetstream.ReplayOriginalPolicy {
		return "original"
	}
	return "instant"
}

func discardName(d jetstream.DiscardPolicy) string {
	if d == jetstream.DiscardNew {
		return "new"
	}
	return "old"
}

func deliverPolicyName(d jetstream.DeliverPolicy) string {
	switch d {
	case jetstream.DeliverLastPolicy:
		return "last"
	case jetstream.DeliverNewPolicy:
		return "new"
	case jetstream.DeliverLastPerSubjectPolicy:
		return "lastPerSubject"
	}
	return "all"
}

// formatDuration writes d in its largest whole unit ("2h", "1m", "15m", "90s"),
// falling back to Go's form.
func formatDuration(d time.Duration) string {
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d != 0 && d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.name
		}
	}
	if d == 0 {
		return "0s"
	}
	return d.String()
}
