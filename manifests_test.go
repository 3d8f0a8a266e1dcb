package mq

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const shippedManifests = "deployments/nats/jetstream.yaml"

// shippedTopology is what deployments/nats/jetstream.yaml is generated from.
var shippedTopology = NATSTopology{Partitions: 4, Replicas: 3}

func generate(t *testing.T, topo NATSTopology) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, WriteNATSManifests(&buf, topo))
	return buf.Bytes()
}

// TestWriteNATSManifests_TheShippedFileIsTheGeneratorsOutput pins the shipped file.
// Regenerate it with: go run ./cmd/mqctl manifests -partitions 4 -replicas 3 > deployments/nats/jetstream.yaml
func TestWriteNATSManifests_TheShippedFileIsTheGeneratorsOutput(t *testing.T) {
	shipped, err := os.ReadFile(shippedManifests)
	require.NoError(t, err)
	assert.Equal(t, string(generate(t, shippedTopology)), string(shipped),
		"%s differs from the generator's output; regenerate it with %s", shippedManifests, ManifestsCommand(shippedTopology))
}

func TestWriteNATSManifests_HeaderNamesTheCommandThatRegeneratesIt(t *testing.T) {
	out := string(generate(t, NATSTopology{Prefix: "acme-wh", Partitions: 3, Replicas: 1}))
	assert.True(t, strings.HasPrefix(out, "# NACK (jetstream.nats.io/v1beta2) resources"))
	assert.Contains(t, out, "#   go run ./cmd/mqctl manifests -partitions 3 -replicas 1 -prefix acme-wh\n")
	assert.Contains(t, out, "maxAge")
}

func TestWriteNATSManifests_RefusesAnInvalidTopology(t *testing.T) {
	require.Error(t, WriteNATSManifests(io.Discard, NATSTopology{Prefix: "A.B"}))
	require.Error(t, WriteNATSManifests(io.Discard, NATSTopology{Partitions: -1}))
}

// TestWriteNATSManifests_EveryResourceHasAKubernetesNameOfItsOwn: Kubernetes keeps one
// resource of a kind and name, so two Streams of one metadata.name would be one, and it
// refuses a name that is not an RFC 1123 subdomain. A history named as the dead-letter
// stream, or as it in lower case, used to make two Streams wh-dlq.
func TestWriteNATSManifests_EveryResourceHasAKubernetesNameOfItsOwn(t *testing.T) {
	for _, topo := range []NATSTopology{
		shippedTopology,
		{Prefix: "acme-wh", Partitions: 12, HistoryStream: "wh-history"},
		{Prefix: "wh_", Partitions: MaxPartitions, HistoryStream: "ARCHIVE"},
	} {
		seen := map[string]bool{}
		for _, d := range parseManifests(t, generate(t, topo)) {
			key := d.Kind + " " + d.Metadata.Name
			assert.False(t, seen[key], "%+v: two resources %s", topo, key)
			seen[key] = true
			// Stream names hold no '.', so the subdomain is one label here.
			assert.Regexp(t, `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, d.Metadata.Name, "%+v: %s", topo, d.Kind)
			assert.LessOrEqual(t, len(d.Metadata.Name), 253, "%+v: %s", topo, d.Kind)
		}
	}
	for _, c := range []struct {
		topo NATSTopology
		want string
	}{
		{NATSTopology{HistoryStream: "WH_DLQ"}, `both named "WH_DLQ"`},
		{NATSTopology{HistoryStream: "WH_INGEST_1"}, `both named "WH_INGEST_1"`},
		{NATSTopology{HistoryStream: "wh-dlq"}, `the history stream "wh-dlq" and the dead-letter stream "WH_DLQ" differ only in case`},
		{NATSTopology{HistoryStream: "Wh-Ingest-2"}, `ingest partition 2's stream "WH_INGEST_2" and the history stream "Wh-Ingest-2"`},
		{NATSTopology{HistoryStream: "Hïst#1"}, `the history stream "Hïst#1" makes the Kubernetes resource name "hïst#1"`},
		{NATSTopology{HistoryStream: "_HISTORY"}, `"-history"`},
		{NATSTopology{HistoryStream: "HISTORY-"}, `"history-"`},
		{NATSTopology{HistoryStream: "H+1"}, `"h+1"`},
		{NATSTopology{HistoryStream: strings.Repeat("H", maxKubernetesName+1)}, "at most 253"},
		{NATSTopology{Prefix: "-wh"}, `ingest partition 0's stream "-WH_INGEST_0" makes the Kubernetes resource name "-wh-ingest-0"`},
	} {
		err := WriteNATSManifests(io.Discard, c.topo)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", c.topo)
		assert.ErrorContains(t, err, c.want, "%+v", c.topo)
	}
	for _, topo := range []NATSTopology{
		{HistoryStream: strings.Repeat("H", maxKubernetesName)},
		{HistoryStream: "ARCHIVE_2-B"},
		{Prefix: "0"},
	} {
		assert.NoError(t, WriteNATSManifests(io.Discard, topo), "%+v", topo)
	}
}

func TestWriteNATSManifests_EveryDurablePinsItsPartitionInTheIngestGroup(t *testing.T) {
	for _, c := range []struct {
		topo       NATSTopology
		group, ttl string
	}{
		{shippedTopology, "ingest", "15s"},
		{NATSTopology{Partitions: 2, IngestGroup: "workers", PinnedTTL: 90 * time.Second}, "workers", "90s"},
	} {
		consumers := 0
		for _, d := range parseManifests(t, generate(t, c.topo)) {
			if d.Kind != "Consumer" {
				continue
			}
			consumers++
			assert.Equal(t, "pinned_client", d.Spec["priorityPolicy"], "%s", d.Spec["streamName"])
			assert.Equal(t, []any{c.group}, d.Spec["priorityGroups"], "%s", d.Spec["streamName"])
			assert.Equal(t, c.ttl, d.Spec["pinnedTtl"], "%s", d.Spec["streamName"])
		}
		assert.Equal(t, c.topo.WithDefaults().Partitions, consumers)
	}
}

func TestFormatDuration_WritesTheLargestWholeUnit(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2 * time.Hour: "2h", time.Minute: "1m", 15 * time.Minute: "15m", 90 * time.Second: "90s",
		1500 * time.Millisecond: "1500ms", 0: "0s", time.Microsecond: "1µs",
	} {
		assert.Equal(t, want, formatDuration(d), d.String())
	}
}

// manifestDoc is one decoded resource.
type manifestDoc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec map[string]any `yaml:"spec"`
}

func parseManifests(t testing.TB, data []byte) []manifestDoc {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []manifestDoc
	for {
		var d manifestDoc
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err)
		docs = append(docs, d)
	}
}

// TestWriteNATSManifests_WritesOnlyFieldsNACKsSchemaAccepts: Kubernetes silently drops
// a field the CRD does not know, and refuses a wrong type or enum value, so every field
// written must be in NACK's schema (testdata/nack-schema.json) as written.
func TestWriteNATSManifests_WritesOnlyFieldsNACKsSchemaAccepts(t *testing.T) {
	schema := loadNACKSchema(t)
	kinds := map[string]int{}
	for _, d := range parseManifests(t, generate(t, shippedTopology)) {
		kinds[d.Kind]++
		fields, ok := schema[d.Kind]
		require.True(t, ok, "kind %s", d.Kind)
		assert.Empty(t, specProblems(d.Kind, d.Spec, fields))
	}
	assert.Equal(t, map[string]int{"Account": 1, "Stream": 6, "Consumer": 4}, kinds)
}

// TestWriteNATSManifests_EveryResourceNamesTheAccountNACKConnectsWith: without account:
// NACK uses its own connection, which cannot log in as the shipped password user.
func TestWriteNATSManifests_EveryResourceNamesTheAccountNACKConnectsWith(t *testing.T) {
	var account map[string]any
	for _, d := range parseManifests(t, generate(t, shippedTopology)) {
		if d.Kind == "Account" {
			account = d.Spec
			continue
		}
		assert.Equal(t, nackAccount, d.Spec["account"], "%s %v", d.Kind, d.Spec["name"])
	}
	require.NotNil(t, account)
	assert.Equal(t, nackAccount, account["name"])
	user, _ := account["user"].(map[string]any)
	secret, _ := user["secret"].(map[string]any)
	assert.Equal(t, nackUsersSecret, secret["name"])
	values, err := os.ReadFile("deployments/nats/values.yaml")
	require.NoError(t, err)
	assert.Contains(t, string(values), "- user: nack\n", "the Account logs in as values.yaml's nack user")
	assert.Contains(t, string(values), "name: "+nackUsersSecret+"\n          key: "+nackPasswordKey+"\n",
		"values.yaml reads nack's password from the key the Account reads")
	assert.Contains(t, string(values), "--from-literal="+nackUserKey+"=nack", "values.yaml tells how to create the Secret with the user's name")
}

// nackDefaults are the CRD defaults NACK applies to a field a manifest leaves out:
// unlike JetStream's, storage is memory and an ack wait is 1ns.
var nackDefaults = map[string]map[string]any{
	"Stream": {"retention": "limits", "maxMsgs": -1, "maxBytes": -1, "discard": "old", "discardPerSubject": false,
		"maxMsgsPerSubject": 0, "maxMsgSize": -1, "storage": "memory", "replicas": 1, "maxAge": ""},
	"Consumer": {"deliverPolicy": "all", "ackPolicy": "none", "ackWait": "1ns", "replayPolicy": "instant"},
}

func withDefaults(kind string, spec map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range nackDefaults[kind] {
		out[k] = v
	}
	for k, v := range spec {
		out[k] = v
	}
	return out
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }
func num(m map[string]any, k string) int64  { n, _ := m[k].(int); return int64(n) }
func flag(m map[string]any, k string) bool  { b, _ := m[k].(bool); return b }
func dur(t testing.TB, m map[string]any, k string) time.Duration {
	s := str(m, k)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	require.NoError(t, err, k)
	return d
}

// nackStream maps a Stream resource onto the JetStream configuration NACK would apply.
func nackStream(t testing.TB, spec map[string]any) jetstream.StreamConfig {
	s := withDefaults("Stream", spec)
	cfg := jetstream.StreamConfig{
		Name: str(s, "name"), MaxMsgs: num(s, "maxMsgs"), MaxBytes: num(s, "maxBytes"),
		MaxMsgsPerSubject: num(s, "maxMsgsPerSubject"), MaxMsgSize: int32(num(s, "maxMsgSize")),
		MaxAge: dur(t, s, "maxAge"), Duplicates: dur(t, s, "duplicateWindow"), Replicas: int(num(s, "replicas")),
		NoAck: flag(s, "noAck"), Sealed: flag(s, "sealed"), DenyDelete: flag(s, "denyDelete"), DenyPurge: flag(s, "denyPurge"),
		AllowAtomicPublish:   flag(s, "allowAtomicPublish"),
		DiscardNewPerSubject: flag(s, "discardPerSubject"),
	}
	for _, v := range asList(s["subjects"]) {
		cfg.Subjects = append(cfg.Subjects, v.(string))
	}
	for _, v := range asList(s["sources"]) {
		m := v.(map[string]any)
		cfg.Sources = append(cfg.Sources, &jetstream.StreamSource{Name: str(m, "name"), FilterSubject: str(m, "filterSubject")})
	}
	if md, ok := s["metadata"].(map[string]any); ok {
		cfg.Metadata = map[string]string{}
		for k, v := range md {
			cfg.Metadata[k] = v.(string)
		}
	}
	require.NoError(t, cfg.Retention.UnmarshalJSON([]byte(`"`+str(s, "retention")+`"`)))
	require.NoError(t, cfg.Discard.UnmarshalJSON([]byte(`"`+str(s, "discard")+`"`)))
	require.NoError(t, cfg.Storage.UnmarshalJSON([]byte(`"`+str(s, "storage")+`"`)))
	return cfg
}

// nackConsumer maps a Consumer resource onto the JetStream configuration NACK would
// apply, returning its stream.
func nackConsumer(t testing.TB, spec map[string]any) (string, jetstream.ConsumerConfig) {
	c := withDefaults("Consumer", spec)
	cfg := jetstream.ConsumerConfig{
		Durable: str(c, "durableName"), AckWait: dur(t, c, "ackWait"), MaxDeliver: int(num(c, "maxDeliver")),
		MaxAckPending: int(num(c, "maxAckPending")), FilterSubject: str(c, "filterSubject"),
		HeadersOnly: flag(c, "headersOnly"), MaxRequestBatch: int(num(c, "maxRequestBatch")),
		InactiveThreshold: dur(t, c, "inactiveThreshold"),
	}
	policies := map[string]jetstream.DeliverPolicy{"all": jetstream.DeliverAllPolicy, "new": jetstream.DeliverNewPolicy, "last": jetstream.DeliverLastPolicy}
	cfg.DeliverPolicy = policies[str(c, "deliverPolicy")]
	require.NoError(t, cfg.AckPolicy.UnmarshalJSON([]byte(`"`+str(c, "ackPolicy")+`"`)))
	require.NoError(t, cfg.ReplayPolicy.UnmarshalJSON([]byte(`"`+str(c, "replayPolicy")+`"`)))
	// NACK takes "none" or nothing for no policy, "pinned_client" (or "pinned") with the
	// groups and a pinnedTtl of 5m when it is left out.
	switch str(c, "priorityPolicy") {
	case "", "none":
	case "pinned_client", "pinned":
		cfg.PriorityPolicy, cfg.PinnedTTL = jetstream.PriorityPolicyPinned, cmp.Or(dur(t, c, "pinnedTtl"), 5*time.Minute)
	default:
		require.NoError(t, cfg.PriorityPolicy.UnmarshalJSON([]byte(`"`+str(c, "priorityPolicy")+`"`)))
	}
	for _, v := range asList(c["priorityGroups"]) {
		cfg.PriorityGroups = append(cfg.PriorityGroups, v.(string))
	}
	return str(c, "streamName"), cfg
}

func asList(v any) []any { l, _ := v.([]any); return l }

// shapeFromManifests turns manifests into the shape NACK would create, at one replica.
func shapeFromManifests(t testing.TB, topo NATSTopology, data []byte) *shape {
	topo = topo.WithDefaults()
	s := &shape{topo: topo, consumers: map[string][]jetstream.ConsumerConfig{}}
	for _, d := range parseManifests(t, data) {
		switch d.Kind {
		case "Stream":
			cfg := nackStream(t, d.Spec)
			cfg.Replicas = 1
			s.streams = append(s.streams, cfg)
		case "Consumer":
			stream, cfg := nackConsumer(t, d.Spec)
			s.consumers[stream] = append(s.consumers[stream], cfg)
		case "Account": // how NACK connects: nothing on the server
		default:
			t.Fatalf("unexpected kind %s", d.Kind)
		}
	}
	// Streams before the history that sources them, as NACK reconciles eventually.
	slices.SortStableFunc(s.streams, func(a, b jetstream.StreamConfig) int {
		return boolInt(len(a.Sources) > 0) - boolInt(len(b.Sources) > 0)
	})
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestNATSManifests_AppliedAsNACKWouldTheyVerify applies the shipped manifests, and
// ones generated for another prefix and N, the way NACK maps them, and expects the
// verifier to report nothing but the one-replica recommendation.
func TestNATSManifests_AppliedAsNACKWouldTheyVerify(t *testing.T) {
	shipped, err := os.ReadFile(shippedManifests)
	require.NoError(t, err)
	other := NATSTopology{Prefix: "acme-wh", Partitions: 3, Replicas: 1}
	for name, tc := range map[string]struct {
		topo NATSTopology
		data []byte
	}{"shipped": {shippedTopology, shipped}, "acme-wh N=3": {other, generate(t, other)}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := shapeFromManifests(t, tc.topo, tc.data)
			findings := verifyShape(t, s)
			assert.Empty(t, beyondBaseline(s.topo, findings))
			for _, f := range findings {
				assert.Equal(t, "num_replicas", f.Field)
			}
		})
	}
}
