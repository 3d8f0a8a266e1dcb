package mq

import (
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSTopologyWithDefaults_FillsTheDocumentedDefaults(t *testing.T) {
	got := NATSTopology{}.WithDefaults()
	want := NATSTopology{
		Prefix:                      "wh",
		Partitions:                  4,
		IngestConsumer:              "INGEST",
		IngestGroup:                 "ingest",
		HistoryStream:               "WH_HISTORY",
		PublishTimeout:              5 * time.Second,
		AckWait:                     60 * time.Second,
		PinnedTTL:                   15 * time.Second,
		MaxAckPending:               10000,
		Prefetch:                    500,
		Replicas:                    3,
		PartitionMaxBytes:           50 << 30,
		MaxMsgsPerSubject:           1000000,
		DuplicateWindow:             2 * time.Minute,
		HistoryMaxAge:               15 * time.Minute,
		HistoryMaxBytes:             20 << 30,
		DeadLetterMaxBytes:          5 << 30,
		DeadLetterMaxMsgsPerSubject: 100000,
	}
	if got != want {
		t.Errorf("WithDefaults() =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	if err := (NATSTopology{}).Validate(); err != nil {
		t.Errorf("the zero topology does not validate: %v", err)
	}
}

func TestNATSTopologyWithDefaults_KeepsEverySetField(t *testing.T) {
	set := NATSTopology{
		Prefix:                      "acme-wh",
		Partitions:                  7,
		IngestConsumer:              "DURABLE-1",
		IngestGroup:                 "g/1_=-A",
		HistoryStream:               "MY_HISTORY",
		PublishTimeout:              time.Second,
		AckWait:                     2 * time.Minute,
		PinnedTTL:                   time.Minute,
		MaxAckPending:               1,
		Prefetch:                    3,
		Replicas:                    1,
		PartitionMaxBytes:           1 << 20,
		MaxMsgsPerSubject:           7,
		DuplicateWindow:             30 * time.Second,
		HistoryMaxAge:               time.Hour,
		HistoryMaxBytes:             2 << 20,
		DeadLetterMaxBytes:          3 << 20,
		DeadLetterMaxMsgsPerSubject: 9,
	}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults() =\n%+v\nwant it unchanged:\n%+v", got, set)
	}
	if err := set.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	// Every field is set above: adding one to NATSTopology without a case here fails.
	v := reflect.ValueOf(set)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("field %s is not set in this test", v.Type().Field(i).Name)
		}
	}
}

func TestNATSTopologyWithDefaults_DerivesTheHistoryStreamFromThePrefix(t *testing.T) {
	for prefix, want := range map[string]string{
		"":        "WH_HISTORY",
		"wh":      "WH_HISTORY",
		"acme-wh": "ACME-WH_HISTORY",
		"a_1":     "A_1_HISTORY",
	} {
		if got := (NATSTopology{Prefix: prefix}).WithDefaults().HistoryStream; got != want {
			t.Errorf("prefix %q: HistoryStream %q, want %q", prefix, got, want)
		}
	}
	if got := (NATSTopology{Prefix: "acme-wh", HistoryStream: "KEEP"}).WithDefaults().HistoryStream; got != "KEEP" {
		t.Errorf("a set HistoryStream became %q", got)
	}
}

func TestNATSTopologyWithDefaults_RaisesTheDuplicateWindowToALongPublish(t *testing.T) {
	top := NATSTopology{PublishTimeout: 60 * time.Second}.WithDefaults()
	if want := 180*time.Second + 500*time.Millisecond; top.DuplicateWindow != want {
		t.Errorf("DuplicateWindow %s, want %s (3 x 60s + 2 x 250ms)", top.DuplicateWindow, want)
	}
	if err := top.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	top = NATSTopology{PublishTimeout: 10 * time.Second}.WithDefaults()
	if top.DuplicateWindow != 2*time.Minute {
		t.Errorf("DuplicateWindow %s, want the 2m default", top.DuplicateWindow)
	}
}

func TestNATSTopologyMinDuplicateWindow_IsThreeTimeoutsAndTwoRetryWaits(t *testing.T) {
	cases := []struct {
		timeout time.Duration
		want    time.Duration
	}{
		{0, 15*time.Second + 500*time.Millisecond},
		{5 * time.Second, 15*time.Second + 500*time.Millisecond},
		{time.Second, 3*time.Second + 500*time.Millisecond},
		{10 * time.Second, 30*time.Second + 500*time.Millisecond},
		{100 * time.Millisecond, 800 * time.Millisecond},
	}
	for _, c := range cases {
		if got := (NATSTopology{PublishTimeout: c.timeout}).minDuplicateWindow(); got != c.want {
			t.Errorf("PublishTimeout %s: minDuplicateWindow %s, want %s", c.timeout, got, c.want)
		}
	}
	if got := (NATSTopology{}).WithDefaults().minDuplicateWindow(); got != 15500*time.Millisecond {
		t.Errorf("minDuplicateWindow at defaults = %s, want 15.5s", got)
	}
}

func TestNATSTopologyValidate_RefusesAPrefixThatIsNotOneLowercaseToken(t *testing.T) {
	for _, prefix := range []string{"A", "Wh", "a.b", "a b", "a*", ">", "a/b", "é", "wh\n"} {
		err := NATSTopology{Prefix: prefix}.Validate()
		if err == nil || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("prefix %q: Validate() = %v, want a prefix error", prefix, err)
		}
	}
	// An empty prefix is the zero value: it takes the default rather than failing.
	if err := (NATSTopology{Prefix: ""}).Validate(); err != nil {
		t.Errorf("an empty prefix (default wh) gave %v", err)
	}
	if prefixPattern.MatchString("") {
		t.Errorf("the prefix pattern accepts an empty prefix")
	}
	for _, prefix := range []string{"wh", "acme-wh", "a_1", "0"} {
		if err := (NATSTopology{Prefix: prefix}).Validate(); err != nil {
			t.Errorf("prefix %q: Validate() = %v, want nil", prefix, err)
		}
	}
}

func TestNATSTopologyValidate_RefusesWhatCannotWork(t *testing.T) {
	cases := []struct {
		name string
		top  NATSTopology
		want string
	}{
		{"negative partitions", NATSTopology{Partitions: -1}, "partitions -1"},
		{"one partition more than the maximum", NATSTopology{Partitions: MaxPartitions + 1}, "partitions 1025 is more than 1024"},
		{"a terabyte of partitions", NATSTopology{Partitions: 1 << 40}, "partitions 1099511627776 is more than 1024"},
		{"dotted consumer", NATSTopology{IngestConsumer: "wh.ingest"}, "ingest consumer"},
		{"consumer with a space", NATSTopology{IngestConsumer: "wh ingest"}, "ingest consumer"},
		{"consumer recovered after the server's own", NATSTopology{IngestConsumer: "wh-ingest"}, `must sort before "JS_"`},
		{"consumer named like the server's own", NATSTopology{IngestConsumer: "JS_SRC_X"}, `must sort before "JS_"`},
		{"wildcard history", NATSTopology{HistoryStream: "H*"}, "history stream"},
		{"history with a slash", NATSTopology{HistoryStream: "H/1"}, "history stream"},
		{"a prefix making a bad history name", NATSTopology{Prefix: "a>"}, "prefix"},
		{"negative publish timeout", NATSTopology{PublishTimeout: -time.Second}, "negative"},
		{"negative ack wait", NATSTopology{AckWait: -time.Second}, "negative"},
		{"negative pinned TTL", NATSTopology{PinnedTTL: -time.Second}, "negative"},
		{"pinned TTL below twice the pull expiry", NATSTopology{PinnedTTL: 10*time.Second - 1}, "unpins partitions from live workers"},
		{"pinned TTL of one pull expiry", NATSTopology{PinnedTTL: 5 * time.Second}, "pinned TTL 5s is below 10s"},
		{"ingest group longer than 16", NATSTopology{IngestGroup: "abcdefghijklmnopq"}, "ingest group"},
		{"ingest group with a dot", NATSTopology{IngestGroup: "in.gest"}, "ingest group"},
		{"ingest group with a space", NATSTopology{IngestGroup: "in gest"}, "ingest group"},
		{"ingest group with a wildcard", NATSTopology{IngestGroup: "*"}, "ingest group"},
		{"negative duplicate window", NATSTopology{DuplicateWindow: -time.Second}, "negative"},
		{"negative history max age", NATSTopology{HistoryMaxAge: -time.Nanosecond}, "negative"},
		{"a history max age every server refuses", NATSTopology{HistoryMaxAge: time.Nanosecond}, "history max age 1ns is below 100ms"},
		{"a history max age just below the server's least", NATSTopology{HistoryMaxAge: 100*time.Millisecond - 1}, "below 100ms"},
		{"negative max ack pending", NATSTopology{MaxAckPending: -1}, "negative"},
		{"negative prefetch", NATSTopology{Prefetch: -1}, "negative"},
		{"negative replicas", NATSTopology{Replicas: -1}, "negative"},
		{"duplicate window below the default minimum", NATSTopology{DuplicateWindow: 15 * time.Second}, "duplicate window"},
		{"duplicate window just below the minimum", NATSTopology{DuplicateWindow: 15500*time.Millisecond - 1}, "duplicate window"},
		{"duplicate window below a long publish", NATSTopology{PublishTimeout: 10 * time.Second, DuplicateWindow: 30 * time.Second}, "duplicate window"},
		{"a publish timeout whose retries overflow", NATSTopology{PublishTimeout: 4e18}, "publish timeout"},
		{"a publish timeout above an hour", NATSTopology{PublishTimeout: time.Hour + 1}, "publish timeout 1h0m0.000000001s is above 1h0m0s"},
		{"consumer longer than JetStream takes", NATSTopology{IngestConsumer: "A" + strings.Repeat("b", maxNameLen)}, "ingest consumer"},
		{"consumer with a form feed", NATSTopology{IngestConsumer: "A\fB"}, "ingest consumer"},
		{"consumer with a NUL", NATSTopology{IngestConsumer: "A\x00B"}, "ingest consumer"},
		{"history longer than JetStream takes", NATSTopology{HistoryStream: strings.Repeat("H", maxNameLen+1)}, "history stream"},
		{"history of invalid UTF-8", NATSTopology{HistoryStream: "HIST\xff\xfe"}, "history stream"},
		{"history with DEL", NATSTopology{HistoryStream: "H\x7f"}, "history stream"},
		{"a prefix making stream names too long", NATSTopology{Prefix: strings.Repeat("p", 250)}, "255"},
		{"a prefix making partition names too long", NATSTopology{Prefix: strings.Repeat("p", 248), HistoryStream: "H"}, "longer than JetStream's 255"},
		{"negative partition max bytes", NATSTopology{PartitionMaxBytes: -1}, "must not be negative"},
		{"negative max msgs per subject", NATSTopology{MaxMsgsPerSubject: -1}, "must not be negative"},
		{"negative dead-letter max bytes", NATSTopology{DeadLetterMaxBytes: -1}, "must not be negative"},
		{"history max bytes below no limit", NATSTopology{HistoryMaxBytes: -2}, "must be -1 (no limit) or more"},
		{"dead-letter max msgs per subject below no limit", NATSTopology{DeadLetterMaxMsgsPerSubject: -5}, "must be -1 (no limit) or more"},
		{"a prefix making the budget bucket's name too long", NATSTopology{Prefix: strings.Repeat("p", 245), HistoryStream: "H"}, "longer than JetStream's 255"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.top.Validate()
			if err == nil {
				t.Fatalf("Validate() = nil, want an error naming %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate() = %q, want it to name %q", err, c.want)
			}
		})
	}
}

func TestNATSTopologyValidate_AcceptsADuplicateWindowOfExactlyTheMinimum(t *testing.T) {
	for _, top := range []NATSTopology{
		{DuplicateWindow: 15500 * time.Millisecond},
		{PublishTimeout: 10 * time.Second, DuplicateWindow: 30500 * time.Millisecond},
		{Partitions: 1, PublishTimeout: time.Second, DuplicateWindow: 3500 * time.Millisecond},
	} {
		if err := top.Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v", top, err)
		}
	}
}

func TestNATSTopologyValidate_AcceptsExactlyMaxPartitions(t *testing.T) {
	if err := (NATSTopology{Partitions: MaxPartitions}).Validate(); err != nil {
		t.Errorf("Partitions %d: Validate() = %v", MaxPartitions, err)
	}
}

// TestNATSTopology_EveryEntryPointRefusesMoreThanMaxPartitionsAsInvalidConfig: each of
// them builds a table per partition, and 1<<40 used to pass and then kill the process
// out of memory; now each refuses the count before building anything.
func TestNATSTopology_EveryEntryPointRefusesMoreThanMaxPartitionsAsInvalidConfig(t *testing.T) {
	t.Parallel()
	e := openEmbedded(t, "")
	for _, n := range []int{MaxPartitions + 1, 1 << 40} {
		topo := NATSTopology{Partitions: n}
		cfg := NATSConfig{NATSTopology: topo, URLs: []string{"nats://127.0.0.1:1"}, Logger: quietLog}
		for name, call := range map[string]func() error{
			"NATSTopology.Validate": topo.Validate,
			"NATSConfig.Validate":   cfg.Validate,
			"NewEmbedded": func() error {
				_, err := NewEmbedded(t.Context(), EmbeddedOptions{Topology: topo, Logger: quietLog})
				return err
			},
			"NewNATS":     func() error { _, err := NewNATS(t.Context(), cfg); return err },
			"CheckNATS":   func() error { _, err := CheckNATS(t.Context(), cfg); return err },
			"ConnectNATS": func() error { _, err := ConnectNATS(t.Context(), cfg); return err },
			"VerifyNATSTopology": func() error {
				_, err := VerifyNATSTopology(t.Context(), e.js, topo)
				return err
			},
			"WriteNATSManifests":   func() error { return WriteNATSManifests(io.Discard, topo) },
			"WriteNATSPermissions": func() error { return WriteNATSPermissions(io.Discard, topo) },
		} {
			err := call()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "is more than "+strconv.Itoa(MaxPartitions)) {
				t.Errorf("%s with %d partitions: %v, want ErrInvalidConfig naming the maximum", name, n, err)
			}
		}
	}
}

// TestNATSTopologyValidate_RefusesTwoStreamsOfOneNameNamingBoth: a history named as
// the dead-letter stream opened without error and then delivered nothing to the hub or
// a replay; named as a partition or the budgets bucket it failed later with the
// server's error.
func TestNATSTopologyValidate_RefusesTwoStreamsOfOneNameNamingBoth(t *testing.T) {
	for _, c := range []struct {
		top  NATSTopology
		want string
	}{
		{NATSTopology{HistoryStream: "WH_DLQ"}, "the history stream and the dead-letter stream are both named \"WH_DLQ\""},
		{NATSTopology{HistoryStream: "WH_INGEST_0"}, "ingest partition 0's stream and the history stream are both named \"WH_INGEST_0\""},
		{NATSTopology{Partitions: 8, HistoryStream: "WH_INGEST_7"}, "ingest partition 7's stream and the history stream"},
		{NATSTopology{HistoryStream: "KV_WH_BUDGETS"}, "the history stream and the budgets bucket's stream are both named"},
		{NATSTopology{Prefix: "acme-wh", HistoryStream: "ACME-WH_DLQ"}, "both named \"ACME-WH_DLQ\""},
	} {
		err := c.top.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("history %q: Validate() = %v, want ErrInvalidConfig saying %q", c.top.HistoryStream, err, c.want)
		}
		// The broker refuses it before it opens anything.
		_, err = NewEmbedded(t.Context(), EmbeddedOptions{Topology: c.top, Logger: quietLog})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("history %q: NewEmbedded = %v, want ErrInvalidConfig", c.top.HistoryStream, err)
		}
	}
}

// TestNATSTopologyValidate_TakesNamesOnlyTheManifestsCannotCarry: names the server
// keeps apart, but which fold to one Kubernetes name or to none, are the manifests'
// concern (TestWriteNATSManifests_EveryResourceHasAKubernetesNameOfItsOwn); a store or
// cluster already using them keeps opening.
func TestNATSTopologyValidate_TakesNamesOnlyTheManifestsCannotCarry(t *testing.T) {
	for _, top := range []NATSTopology{
		{HistoryStream: "wh-dlq"}, {HistoryStream: "wh_dlq"}, {HistoryStream: "Wh-Ingest-2"},
		{HistoryStream: "Hïst#1"}, {HistoryStream: "events:history"}, {HistoryStream: "HISTORY_"},
		{Prefix: "_wh"}, {Prefix: "-wh"},
	} {
		if err := top.Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v", top, err)
		}
		if err := WriteNATSManifests(io.Discard, top); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: WriteNATSManifests = %v, want ErrInvalidConfig", top, err)
		}
	}
}

// TestNewEmbedded_RefusesAHistoryNamedAsAPartitionOfALargerCount: EmbeddedNATS takes
// such a stream for a partition an earlier count left behind, and a store whose
// history held events could not be opened again. Only a partition's own spelling of
// its index is one.
func TestNewEmbedded_RefusesAHistoryNamedAsAPartitionOfALargerCount(t *testing.T) {
	for _, history := range []string{"WH_INGEST_4", "WH_INGEST_255", "WH_INGEST_99999"} {
		_, err := NewEmbedded(t.Context(), EmbeddedOptions{Topology: NATSTopology{HistoryStream: history}, Logger: quietLog})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "of a larger count") {
			t.Errorf("history %q: NewEmbedded = %v, want ErrInvalidConfig naming the partition", history, err)
		}
	}
	topo := NATSTopology{}.WithDefaults()
	for _, history := range []string{"WH_INGEST_04", "WH_INGEST_X", "WH_INGEST_-1", "WH_INGESTS_4", "ACME_INGEST_4", "wh-ingest-4"} {
		if p, ok := topo.partitionOfStream(history); ok {
			t.Errorf("history %q read as partition %d", history, p)
		}
	}
}

func TestNATSTopologyValidate_AcceptsAPinnedTTLOfTwiceThePullExpiry(t *testing.T) {
	if err := (NATSTopology{PinnedTTL: 2 * pullExpiry}).Validate(); err != nil {
		t.Errorf("PinnedTTL %s: Validate() = %v", 2*pullExpiry, err)
	}
}

// TestNATSTopologyValidate_AcceptsExactlyTheGroupNamesTheServerDoes creates a pinned
// durable in each group on a real server: Validate accepts a name if and only if the
// server does.
func TestNATSTopologyValidate_AcceptsExactlyTheGroupNamesTheServerDoes(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	ctx := testCtx(t)
	_, err := f.admin.CreateStream(ctx, jetstream.StreamConfig{Name: "G", Subjects: []string{"g.>"}})
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"ingest", "a", "abcdefghijklmnop", "A-Z_0/9=x", "abcdefghijklmnopq", "in.gest", "in gest", "*", ">", "grüße", "a+b", "a\\b"}
	accepted := 0
	for i, group := range groups {
		_, serverErr := f.admin.CreateConsumer(ctx, "G", jetstream.ConsumerConfig{
			Durable: "D" + strconv.Itoa(i), AckPolicy: jetstream.AckExplicitPolicy,
			PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{group}, PinnedTTL: time.Minute,
		})
		validateErr := NATSTopology{IngestGroup: group}.Validate()
		if (serverErr == nil) != (validateErr == nil) {
			t.Errorf("group %q: the server says %v, Validate says %v", group, serverErr, validateErr)
		}
		if serverErr == nil {
			accepted++
		}
	}
	if accepted != 4 {
		t.Errorf("the server accepted %d of the groups, want the first 4", accepted)
	}
}

func TestNATSTopologyWorkerSubject_IsThePrefixWorkersAndTheDurable(t *testing.T) {
	for _, c := range []struct {
		top  NATSTopology
		want string
	}{
		{NATSTopology{}, "wh.workers.INGEST"},
		{NATSTopology{Prefix: "acme-wh", IngestConsumer: "DURABLE-1"}, "acme-wh.workers.DURABLE-1"},
	} {
		top := c.top.WithDefaults()
		if got := top.workerSubject(); got != c.want {
			t.Errorf("workerSubject() = %q, want %q", got, c.want)
		}
		for _, other := range []string{top.subjects().ingestAll(), top.subjects().deadLetterAll()} {
			if server.SubjectMatchesFilter(top.workerSubject(), other) {
				t.Errorf("the worker subject %q is under %q", top.workerSubject(), other)
			}
		}
	}
}

func TestNATSTopologyDurableFor_MapsTheWorkerNameTheConfiguredNameAndTheDefaultOntoTheDurable(t *testing.T) {
	def := NATSTopology{}.WithDefaults()
	custom := NATSTopology{IngestConsumer: "DURABLE-1"}.WithDefaults()
	cases := []struct {
		top  NATSTopology
		name string
		want string
	}{
		{def, "buffer-consumer", "INGEST"},
		{def, WorkerDurable, "INGEST"},
		{def, "INGEST", "INGEST"},
		{custom, "buffer-consumer", "DURABLE-1"},
		{custom, "DURABLE-1", "DURABLE-1"},
		{def, "", "INGEST"},
		{def, "wh-ingest", "INGEST"},
		{custom, "", "DURABLE-1"},
	}
	for _, c := range cases {
		got, err := c.top.durableFor(c.name)
		if err != nil || got != c.want {
			t.Errorf("IngestConsumer %q: durableFor(%q) = %q, %v; want %q", c.top.IngestConsumer, c.name, got, err, c.want)
		}
	}
}

func TestNATSTopologyDurableFor_AnyOtherNameIsErrConsumerNotFound(t *testing.T) {
	def := NATSTopology{}.WithDefaults()
	custom := NATSTopology{IngestConsumer: "DURABLE-1"}.WithDefaults()
	for _, c := range []struct {
		top  NATSTopology
		name string
	}{
		{def, "other"},
		{def, "Buffer-Consumer"},
		{def, "INGEST-0"},
		{custom, "INGEST"},
	} {
		got, err := c.top.durableFor(c.name)
		if !errors.Is(err, ErrConsumerNotFound) {
			t.Errorf("IngestConsumer %q: durableFor(%q) = %q, %v; want ErrConsumerNotFound", c.top.IngestConsumer, c.name, got, err)
		}
		if got != "" {
			t.Errorf("durableFor(%q) refused but named %q", c.name, got)
		}
		if err != nil && (!strings.Contains(err.Error(), WorkerDurable) || !strings.Contains(err.Error(), c.top.IngestConsumer)) {
			t.Errorf("error %q does not list the known names", err)
		}
	}
}

func TestNATSTopology_StreamNamesDeriveFromThePrefix(t *testing.T) {
	for _, c := range []struct {
		prefix, p0, p3, dlq string
	}{
		{"wh", "WH_INGEST_0", "WH_INGEST_3", "WH_DLQ"},
		{"acme-wh", "ACME-WH_INGEST_0", "ACME-WH_INGEST_3", "ACME-WH_DLQ"},
	} {
		top := NATSTopology{Prefix: c.prefix}.WithDefaults()
		if got := top.PartitionStream(0); got != c.p0 {
			t.Errorf("PartitionStream(0) = %q, want %q", got, c.p0)
		}
		if got := top.PartitionStream(3); got != c.p3 {
			t.Errorf("PartitionStream(3) = %q, want %q", got, c.p3)
		}
		if got := top.DeadLetterStream(); got != c.dlq {
			t.Errorf("DeadLetterStream() = %q, want %q", got, c.dlq)
		}
		if s := top.subjects(); s.prefix != c.prefix || s.n != 4 {
			t.Errorf("subjects() = %+v, want prefix %q and 4 partitions", s, c.prefix)
		}
	}
}

func TestNATSTopologyPartitionConfig_IsAnInterestPartitionThatPushesBack(t *testing.T) {
	top := NATSTopology{Prefix: "acme-wh", Partitions: 8, Replicas: 1, DuplicateWindow: 3 * time.Minute}.WithDefaults()
	for _, p := range []int{0, 5} {
		got := top.partitionConfig(p)
		want := jetstream.StreamConfig{
			Name:                 top.PartitionStream(p),
			Subjects:             []string{"acme-wh.ingest." + string(rune('0'+p)) + ".>"},
			Retention:            jetstream.InterestPolicy,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			MaxMsgsPerSubject:    1000000,
			MaxBytes:             50 << 30,
			MaxMsgs:              -1,
			MaxAge:               0,
			MaxMsgSize:           -1,
			Storage:              jetstream.FileStorage,
			Replicas:             1,
			Duplicates:           3 * time.Minute,
			DenyPurge:            true,
			DenyDelete:           true,
			AllowAtomicPublish:   true,
			Metadata: map[string]string{
				"wavehouse.dev/partition":  string(rune('0' + p)),
				"wavehouse.dev/partitions": "8",
			},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("partitionConfig(%d) =\n%+v\nwant\n%+v", p, got, want)
		}
		if got.Duplicates < top.minDuplicateWindow() {
			t.Errorf("partition duplicate window %s is below the minimum %s", got.Duplicates, top.minDuplicateWindow())
		}
	}
	// A subject tenantIngest selects lies under its partition's filter.
	filter := strings.TrimSuffix(top.partitionConfig(Partition("acme", 8)).Subjects[0], ">")
	if tenant := top.subjects().tenantIngest("acme"); !strings.HasPrefix(tenant, filter) {
		t.Errorf("tenant filter %q is outside partition filter %q", tenant, filter)
	}
}

func TestNATSTopologyIngestConsumerConfig_IsAnExplicitAckDurableOnThePartitionPinnedToOneWorker(t *testing.T) {
	top := NATSTopology{Partitions: 2, AckWait: 90 * time.Second, MaxAckPending: 77, IngestGroup: "g1", PinnedTTL: 20 * time.Second}.WithDefaults()
	got := top.ingestConsumerConfig(1)
	want := jetstream.ConsumerConfig{
		Durable:        "INGEST",
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        90 * time.Second,
		MaxDeliver:     -1,
		MaxAckPending:  77,
		FilterSubject:  "wh.ingest.1.>",
		ReplayPolicy:   jetstream.ReplayInstantPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{"g1"},
		PinnedTTL:      20 * time.Second,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ingestConsumerConfig(1) =\n%+v\nwant\n%+v", got, want)
	}
	if got.InactiveThreshold != 0 {
		t.Errorf("the durable expires after %s", got.InactiveThreshold)
	}
	if got.FilterSubject != top.partitionConfig(1).Subjects[0] {
		t.Errorf("consumer filter %q is not partition 1's subjects %v", got.FilterSubject, top.partitionConfig(1).Subjects)
	}
	def := NATSTopology{}.WithDefaults().ingestConsumerConfig(0)
	if def.AckWait != 60*time.Second || def.MaxAckPending != 10000 || def.FilterSubject != "wh.ingest.0.>" {
		t.Errorf("default ingest consumer: ack wait %s, max ack pending %d, filter %q", def.AckWait, def.MaxAckPending, def.FilterSubject)
	}
	if !slices.Equal(def.PriorityGroups, []string{"ingest"}) || def.PinnedTTL != 15*time.Second {
		t.Errorf("default ingest consumer: priority groups %v, pinned TTL %s", def.PriorityGroups, def.PinnedTTL)
	}
}

func TestNATSTopologyHistoryConfig_SourcesEveryPartitionByNameAndDiscardsOld(t *testing.T) {
	top := NATSTopology{Prefix: "acme-wh", Partitions: 3, Replicas: 1, HistoryMaxAge: time.Hour, HistoryMaxBytes: 1 << 30}.WithDefaults()
	got := top.historyConfig()
	if got.Name != "ACME-WH_HISTORY" {
		t.Errorf("Name %q, want ACME-WH_HISTORY", got.Name)
	}
	if len(got.Subjects) != 0 {
		t.Errorf("the history has subjects of its own: %v", got.Subjects)
	}
	var names []string
	for _, s := range got.Sources {
		if s == nil {
			t.Fatal("a nil source")
		}
		names = append(names, s.Name)
		if s.FilterSubject != "" || len(s.SubjectTransforms) != 0 || s.OptStartSeq != 0 || s.OptStartTime != nil || s.External != nil {
			t.Errorf("source %q narrows or moves what it copies: %+v", s.Name, *s)
		}
	}
	if want := []string{"ACME-WH_INGEST_0", "ACME-WH_INGEST_1", "ACME-WH_INGEST_2"}; !slices.Equal(names, want) {
		t.Errorf("sources %v, want %v", names, want)
	}
	if got.Retention != jetstream.LimitsPolicy || got.Discard != jetstream.DiscardOld {
		t.Errorf("retention %v discard %v, want limits and discard old", got.Retention, got.Discard)
	}
	if got.MaxAge != time.Hour || got.MaxBytes != 1<<30 || got.MaxMsgs != -1 || got.MaxMsgSize != -1 {
		t.Errorf("max age %s bytes %d msgs %d msg size %d", got.MaxAge, got.MaxBytes, got.MaxMsgs, got.MaxMsgSize)
	}
	if got.Storage != jetstream.FileStorage || got.Replicas != 1 {
		t.Errorf("storage %v replicas %d", got.Storage, got.Replicas)
	}
	if got.DenyPurge || got.DenyDelete {
		t.Errorf("the history denies purge or delete")
	}

	def := NATSTopology{}.WithDefaults().historyConfig()
	if def.Name != "WH_HISTORY" || len(def.Sources) != 4 || def.MaxAge != 15*time.Minute || def.MaxBytes != 20<<30 || def.Replicas != 3 {
		t.Errorf("default history: name %q, %d sources, max age %s, max bytes %d, replicas %d",
			def.Name, len(def.Sources), def.MaxAge, def.MaxBytes, def.Replicas)
	}
}

func TestNATSTopologyDeadLetterConfig_CapsEachTopicAndDiscardsOld(t *testing.T) {
	top := NATSTopology{Prefix: "acme-wh", Replicas: 1, DeadLetterMaxBytes: 1 << 20, DeadLetterMaxMsgsPerSubject: 10}.WithDefaults()
	got := top.deadLetterConfig()
	want := jetstream.StreamConfig{
		Name:              "ACME-WH_DLQ",
		Subjects:          []string{"acme-wh.dlq.>"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxBytes:          1 << 20,
		MaxMsgsPerSubject: 10,
		MaxMsgs:           -1,
		MaxMsgSize:        -1,
		Storage:           jetstream.FileStorage,
		Replicas:          1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("deadLetterConfig() =\n%+v\nwant\n%+v", got, want)
	}
	def := NATSTopology{}.WithDefaults().deadLetterConfig()
	if def.Name != "WH_DLQ" || !slices.Equal(def.Subjects, []string{"wh.dlq.>"}) ||
		def.MaxBytes != 5<<30 || def.MaxMsgsPerSubject != 100000 || def.Replicas != 3 {
		t.Errorf("default dead-letter stream: %+v", def)
	}
	// Every dead-letter subject lies under the stream's subjects.
	sub := top.subjects().deadLetter("acme.t.s")
	if !strings.HasPrefix(sub, strings.TrimSuffix(got.Subjects[0], ">")) {
		t.Errorf("dead-letter subject %q is outside %v", sub, got.Subjects)
	}
}

func TestNATSTopologyPartitionConfig_MetadataNamesEveryPartitionOfN(t *testing.T) {
	top := NATSTopology{Partitions: 12}.WithDefaults()
	seen := make(map[string]bool)
	for p := range 12 {
		md := top.partitionConfig(p).Metadata
		if md[metaPartitions] != "12" {
			t.Errorf("partition %d: N metadata %q", p, md[metaPartitions])
		}
		seen[md[metaPartition]] = true
	}
	keys := slices.Sorted(maps.Keys(seen))
	want := []string{"0", "1", "10", "11", "2", "3", "4", "5", "6", "7", "8", "9"}
	if !slices.Equal(keys, want) {
		t.Errorf("partition metadata %v, want %v", keys, want)
	}
}

func TestNATSTopologyValidate_AcceptsNoLimitWhereTheVerifierOnlyAdvisesOne(t *testing.T) {
	for name, top := range map[string]NATSTopology{
		"history bounded by age alone":           {HistoryMaxBytes: -1},
		"dead-letter topics without a count cap": {DeadLetterMaxMsgsPerSubject: -1},
	} {
		if err := top.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v", name, err)
		}
	}
}
