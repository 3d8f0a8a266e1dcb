package mq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// finding is what a rule's test expects: the rest of a Finding is prose.
type finding struct {
	sev           Severity
	object, field string
}

func (f finding) String() string { return fmt.Sprintf("%s: %s: %s", f.sev, f.object, f.field) }

func keyOf(f Finding) finding { return finding{f.Severity, f.Object, f.Field} }

// baseline is what a correct shape at one replica reports: each partition's replica
// recommendation, nothing else.
func baseline(topo NATSTopology) map[finding]bool {
	topo = topo.WithDefaults()
	out := map[finding]bool{}
	for p := range topo.Partitions {
		out[finding{Recommended, "stream " + topo.PartitionStream(p), "num_replicas"}] = true
	}
	return out
}

// beyondBaseline returns the findings a check reported that a correct shape does not.
func beyondBaseline(topo NATSTopology, findings []Finding) []finding {
	base := baseline(topo)
	var out []finding
	for _, f := range findings {
		if !base[keyOf(f)] {
			out = append(out, keyOf(f))
		}
	}
	return out
}

func verifyShape(t *testing.T, s *shape) []Finding {
	t.Helper()
	f := newNATSFixture(t)
	f.apply(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	findings, err := VerifyNATSTopology(ctx, f.admin, s.topo)
	require.NoError(t, err)
	return findings
}

func TestVerifyNATSTopology_ACorrectShapeHasOnlyTheReplicaRecommendation(t *testing.T) {
	t.Parallel()
	for _, topo := range []NATSTopology{{}, {Prefix: "acme-wh", Partitions: 3}} {
		s := shapeOf(topo)
		findings := verifyShape(t, s)
		assert.Empty(t, beyondBaseline(s.topo, findings))
		assert.Len(t, findings, s.topo.Partitions, "one num_replicas recommendation per partition")
	}
}

// TestVerifyNATSTopology_EachRuleBrokenAloneGivesExactlyItsFinding breaks one rule at a
// time on a real server and expects exactly that rule's finding.
func TestVerifyNATSTopology_EachRuleBrokenAloneGivesExactlyItsFinding(t *testing.T) {
	t.Parallel()
	const p0, p1, p2, p3 = "WH_INGEST_0", "WH_INGEST_1", "WH_INGEST_2", "WH_INGEST_3"
	hist, dlq := "WH_HISTORY", "WH_DLQ"
	req := func(object, field string) finding { return finding{Required, object, field} }
	rec := func(object, field string) finding { return finding{Recommended, object, field} }
	stream, durable := func(n string) string { return "stream " + n }, func(n string) string { return "consumer " + n + "/INGEST" }
	cases := []struct {
		rule   string
		break_ func(t *testing.T, s *shape)
		want   finding
		// also lists the findings a server forces along with want.
		also []finding
	}{
		{"a partition without a stream", func(t *testing.T, s *shape) {
			s.drop(p2)
			h := s.stream(t, hist)
			h.Sources = h.Sources[:2]
			h.Sources = append(h.Sources, &jetstream.StreamSource{Name: p3})
		}, req("ingest partition 2", "subjects"), nil},
		{"one stream holding two partitions", func(t *testing.T, s *shape) {
			s.drop(p1)
			st := s.stream(t, p0)
			st.Subjects = append(st.Subjects, "wh.ingest.1.>")
			h := s.stream(t, hist)
			h.Sources = []*jetstream.StreamSource{{Name: p0}, {Name: p2}, {Name: p3}}
		}, req(stream(p0), "subjects"), nil},
		{"partition subjects missing the partition filter", func(t *testing.T, s *shape) {
			s.stream(t, p1).Subjects = []string{"wh.ingest.1.x"}
			s.consumer(t, p1).FilterSubject = ""
		}, req(stream(p1), "subjects"), nil},
		{"partition retention", func(t *testing.T, s *shape) { s.stream(t, p0).Retention = jetstream.LimitsPolicy }, req(stream(p0), "retention"), nil},
		{"partition discard", func(t *testing.T, s *shape) {
			st := s.stream(t, p0)
			// discard_new_per_subject needs discard new, and without it a per-subject cap
			// evicts: the server forces the cap off too.
			st.Discard, st.DiscardNewPerSubject, st.MaxMsgsPerSubject = jetstream.DiscardOld, false, -1
		}, req(stream(p0), "discard"), []finding{rec(stream(p0), "max_msgs_per_subject")}},
		{"partition max_bytes", func(t *testing.T, s *shape) { s.stream(t, p0).MaxBytes = -1 }, req(stream(p0), "max_bytes"), nil},
		{"partition max_age", func(t *testing.T, s *shape) { s.stream(t, p0).MaxAge = time.Hour }, req(stream(p0), "max_age"), nil},
		{"partition storage", func(t *testing.T, s *shape) { s.stream(t, p0).Storage = jetstream.MemoryStorage }, req(stream(p0), "storage"), nil},
		{"partition duplicate window of 2 x publish timeout", func(t *testing.T, s *shape) {
			s.stream(t, p3).Duplicates = 2 * s.topo.PublishTimeout
		}, req(stream(p3), "duplicate_window"), nil},
		{"partition no_ack", func(t *testing.T, s *shape) { s.stream(t, p0).NoAck = true }, req(stream(p0), "no_ack"), nil},
		{"partition max_msgs_per_subject without discard_new_per_subject", func(t *testing.T, s *shape) {
			s.stream(t, p0).DiscardNewPerSubject = false
		}, req(stream(p0), "discard_new_per_subject"), nil},
		{"partition max_msgs_per_subject unset", func(t *testing.T, s *shape) {
			s.stream(t, p0).MaxMsgsPerSubject = -1
			s.stream(t, p0).DiscardNewPerSubject = false
		}, rec(stream(p0), "max_msgs_per_subject"), nil},
		{"partition deny_purge", func(t *testing.T, s *shape) { s.stream(t, p0).DenyPurge = false }, rec(stream(p0), "deny_purge"), nil},
		{"partition metadata missing", func(t *testing.T, s *shape) { s.stream(t, p0).Metadata = nil }, rec(stream(p0), "metadata"), nil},
		{"partition metadata from another partition count", func(t *testing.T, s *shape) {
			s.stream(t, p2).Metadata[metaPartitions] = "8"
		}, req(stream(p2), "metadata"), nil},
		{"durable missing", func(t *testing.T, s *shape) { delete(s.consumers, p1) }, req(durable(p1), "durable_name"), nil},
		{"durable is a push consumer", func(t *testing.T, s *shape) {
			c := s.consumer(t, p0)
			c.DeliverSubject = "push.here"
			// A push consumer cannot have priority groups.
			c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = jetstream.PriorityPolicyNone, nil, 0
		}, req(durable(p0), "deliver_subject"), []finding{req(durable(p0), "priority_policy")}},
		{"durable ack_policy", func(t *testing.T, s *shape) {
			c := s.consumer(t, p0)
			c.AckPolicy, c.MaxAckPending = jetstream.AckAllPolicy, defaultMaxAckPending
		}, req(durable(p0), "ack_policy"), nil},
		{"durable ack_wait below the worker's", func(t *testing.T, s *shape) { s.consumer(t, p0).AckWait = 30 * time.Second }, req(durable(p0), "ack_wait"), nil},
		{"durable max_deliver", func(t *testing.T, s *shape) { s.consumer(t, p0).MaxDeliver = 5 }, req(durable(p0), "max_deliver"), nil},
		{"durable max_ack_pending unlimited", func(t *testing.T, s *shape) { s.consumer(t, p0).MaxAckPending = -1 }, req(durable(p0), "max_ack_pending"), nil},
		{"durable max_ack_pending low", func(t *testing.T, s *shape) { s.consumer(t, p0).MaxAckPending = 100 }, rec(durable(p0), "max_ack_pending"), nil},
		{"durable deliver_policy", func(t *testing.T, s *shape) { s.consumer(t, p0).DeliverPolicy = jetstream.DeliverNewPolicy }, req(durable(p0), "deliver_policy"), nil},
		{"durable filter_subject", func(t *testing.T, s *shape) { s.consumer(t, p0).FilterSubject = "wh.ingest.0.acme.>" }, req(durable(p0), "filter_subject"), nil},
		{"durable headers_only", func(t *testing.T, s *shape) { s.consumer(t, p0).HeadersOnly = true }, req(durable(p0), "headers_only"), nil},
		{"durable replay_policy", func(t *testing.T, s *shape) { s.consumer(t, p0).ReplayPolicy = jetstream.ReplayOriginalPolicy }, req(durable(p0), "replay_policy"), nil},
		{"durable inactive_threshold", func(t *testing.T, s *shape) { s.consumer(t, p0).InactiveThreshold = time.Hour }, req(durable(p0), "inactive_threshold"), nil},
		{"durable max_request_batch below the prefetch share", func(t *testing.T, s *shape) { s.consumer(t, p0).MaxRequestBatch = 10 }, req(durable(p0), "max_request_batch"), nil},
		{"durable max_request_expires below the pull expiry", func(t *testing.T, s *shape) { s.consumer(t, p0).MaxRequestExpires = time.Second }, req(durable(p0), "max_request_expires"), nil},
		{"durable priority_policy none", func(t *testing.T, s *shape) {
			c := s.consumer(t, p0)
			c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = jetstream.PriorityPolicyNone, nil, 0
		}, req(durable(p0), "priority_policy"), nil},
		{"durable priority_policy overflow", func(t *testing.T, s *shape) {
			c := s.consumer(t, p0)
			c.PriorityPolicy, c.PinnedTTL = jetstream.PriorityPolicyOverflow, 0
		}, req(durable(p0), "priority_policy"), nil},
		{"durable priority_groups without the workers' group", func(t *testing.T, s *shape) {
			s.consumer(t, p0).PriorityGroups = []string{"other"}
		}, req(durable(p0), "priority_groups"), nil},
		{"durable priority_timeout below twice the pull expiry", func(t *testing.T, s *shape) {
			s.consumer(t, p0).PinnedTTL = 2*pullExpiry - time.Second
		}, req(durable(p0), "priority_timeout"), nil},
		{"durable priority_timeout above the ack wait", func(t *testing.T, s *shape) {
			c := s.consumer(t, p0)
			c.PinnedTTL = c.AckWait + time.Second
		}, rec(durable(p0), "priority_timeout"), nil},
		{"an extra stream the worker drains", func(t *testing.T, s *shape) {
			s.streams = append(s.streams, jetstream.StreamConfig{Name: "OLD", Subjects: []string{"wh.ingest.9.>"}, Retention: jetstream.InterestPolicy})
			s.consumers["OLD"] = []jetstream.ConsumerConfig{{Durable: "INGEST", AckPolicy: jetstream.AckExplicitPolicy}}
		}, rec(stream("OLD"), "subjects"), nil},
		{"the durable's earlier name left on a partition", func(t *testing.T, s *shape) {
			legacy := *s.consumer(t, p1)
			legacy.Durable = "wh-ingest"
			s.consumers[p1] = append(s.consumers[p1], legacy)
		}, rec("consumer "+p1+"/wh-ingest", "durable_name"), nil},
		{"an extra stream nothing drains", func(t *testing.T, s *shape) {
			s.streams = append(s.streams, jetstream.StreamConfig{Name: "STRAY", Subjects: []string{"wh.ingest.stray"}})
		}, rec(stream("STRAY"), "subjects"), nil},
		{"history missing", func(t *testing.T, s *shape) { s.drop(hist) }, req(stream(hist), "name"), nil},
		{"history with subjects of its own", func(t *testing.T, s *shape) { s.stream(t, hist).Subjects = []string{"hist.>"} }, req(stream(hist), "subjects"), nil},
		{"history not sourcing a partition", func(t *testing.T, s *shape) {
			h := s.stream(t, hist)
			h.Sources = h.Sources[:3]
		}, req(stream(hist), "sources"), nil},
		{"history source with another filter", func(t *testing.T, s *shape) {
			s.stream(t, hist).Sources[1].FilterSubject = "wh.ingest.1.acme.>"
		}, req(stream(hist), "sources"), nil},
		{"history source transforming subjects", func(t *testing.T, s *shape) {
			s.stream(t, hist).Sources[0].SubjectTransforms = []jetstream.SubjectTransformConfig{{Source: "wh.ingest.0.>", Destination: "h.0.>"}}
		}, req(stream(hist), "sources"), nil},
		{"history retention", func(t *testing.T, s *shape) { s.stream(t, hist).Retention = jetstream.InterestPolicy }, req(stream(hist), "retention"), nil},
		{"history discard", func(t *testing.T, s *shape) { s.stream(t, hist).Discard = jetstream.DiscardNew }, req(stream(hist), "discard"), nil},
		{"history max_age", func(t *testing.T, s *shape) { s.stream(t, hist).MaxAge = 0 }, req(stream(hist), "max_age"), nil},
		{"history max_bytes", func(t *testing.T, s *shape) { s.stream(t, hist).MaxBytes = -1 }, rec(stream(hist), "max_bytes"), nil},
		{"history max_age shorter than the topology's", func(t *testing.T, s *shape) {
			s.stream(t, hist).MaxAge = s.topo.HistoryMaxAge - time.Minute
		}, rec(stream(hist), "max_age"), nil},
		{"history max_msgs_per_subject", func(t *testing.T, s *shape) { s.stream(t, hist).MaxMsgsPerSubject = 1 }, rec(stream(hist), "max_msgs_per_subject"), nil},
		{"history max_msgs", func(t *testing.T, s *shape) { s.stream(t, hist).MaxMsgs = 1000 }, rec(stream(hist), "max_msgs"), nil},
		{"history storage", func(t *testing.T, s *shape) { s.stream(t, hist).Storage = jetstream.MemoryStorage }, rec(stream(hist), "storage"), nil},
		{"history monitor metadata expecting another source count", func(t *testing.T, s *shape) {
			s.stream(t, hist).Metadata[monitorMinSources] = "3"
		}, rec(stream(hist), "metadata"), nil},
		{"dead-letter stream missing", func(t *testing.T, s *shape) { s.drop(dlq) }, req("dead-letter stream", "subjects"), nil},
		{"dead-letter subjects missing the wildcard", func(t *testing.T, s *shape) { s.stream(t, dlq).Subjects = []string{"wh.dlq.x"} }, req(stream(dlq), "subjects"), nil},
		{"dead-letter retention", func(t *testing.T, s *shape) { s.stream(t, dlq).Retention = jetstream.InterestPolicy }, req(stream(dlq), "retention"), nil},
		{"dead-letter discard", func(t *testing.T, s *shape) { s.stream(t, dlq).Discard = jetstream.DiscardNew }, req(stream(dlq), "discard"), nil},
		{"dead-letter storage", func(t *testing.T, s *shape) { s.stream(t, dlq).Storage = jetstream.MemoryStorage }, req(stream(dlq), "storage"), nil},
		{"dead-letter max_bytes", func(t *testing.T, s *shape) { s.stream(t, dlq).MaxBytes = -1 }, req(stream(dlq), "max_bytes"), nil},
		{"dead-letter deny_delete", func(t *testing.T, s *shape) { s.stream(t, dlq).DenyDelete = true }, req(stream(dlq), "deny_delete"), nil},
		{"dead-letter no_ack", func(t *testing.T, s *shape) { s.stream(t, dlq).NoAck = true }, req(stream(dlq), "no_ack"), nil},
		{"dead-letter stream under another name", func(t *testing.T, s *shape) { s.stream(t, dlq).Name = "PARKED" }, rec(stream("PARKED"), "name"), nil},
		{"dead-letter max_msgs_per_subject", func(t *testing.T, s *shape) { s.stream(t, dlq).MaxMsgsPerSubject = -1 }, rec(stream(dlq), "max_msgs_per_subject"), nil},
	}
	// says is what a rule's problem must say: an enum value is spelled as in
	// JetStream's JSON, like the field that holds it, in every finding.
	says := map[string]string{
		"partition retention":                                     "is limits, must be interest",
		"partition discard":                                       "is old, must be new",
		"partition storage":                                       "is memory, must be file",
		"durable ack_policy":                                      "is all, must be explicit",
		"durable deliver_policy":                                  "is new, must be all",
		"durable replay_policy":                                   "is original, must be instant",
		"durable priority_policy none":                            "is none, must be pinned_client",
		"durable priority_policy overflow":                        "is overflow, must be pinned_client",
		"durable priority_groups without the workers' group":      `must include "ingest"`,
		"durable priority_timeout below twice the pull expiry":    "must be at least 10s",
		"durable priority_timeout above the ack wait":             "above the ack wait 1m0s",
		"history retention":                                       "is interest, must be limits",
		"history discard":                                         "is new, must be old",
		"history monitor metadata expecting another source count": "io.nats.monitor.min-sources is 3, the topology has 4 partitions",
		"dead-letter retention":                                   "is interest, must be limits",
		"dead-letter discard":                                     "is new, must be old",
		"dead-letter storage":                                     "is memory, must be file",
		"dead-letter stream under another name":                   "must be WH_DLQ",
		"history max_age shorter than the topology's":             "is 14m0s, shorter than the topology's HistoryMaxAge 15m0s",
	}
	known := map[string]bool{}
	for _, tc := range cases {
		known[tc.rule] = true
	}
	for rule := range says {
		assert.True(t, known[rule], "says names no rule %q", rule)
	}
	for _, tc := range cases {
		t.Run(tc.rule, func(t *testing.T) {
			t.Parallel()
			s := shapeOf(NATSTopology{})
			tc.break_(t, s)
			findings := verifyShape(t, s)
			assert.ElementsMatch(t, append([]finding{tc.want}, tc.also...), beyondBaseline(s.topo, findings))
			if says[tc.rule] == "" {
				return
			}
			for _, f := range findings {
				if keyOf(f) == tc.want {
					assert.Contains(t, f.Problem, says[tc.rule], "%s", f)
				}
			}
		})
	}
}

// TestVerifier_RulesNoSingleServerCanBreak covers the rules whose broken state one
// server refuses to hold (overlapping streams, a mirror with subjects, a sealed stream
// created so, a source before it attaches, an external source): the checks over the
// configurations a cluster reports.
func TestVerifier_RulesNoSingleServerCanBreak(t *testing.T) {
	topo := NATSTopology{}.WithDefaults()
	v := &verifier{topo: topo, subs: topo.subjects()}
	cfg := topo.partitionConfig(0)
	cfg.Replicas = 3
	cfg.Mirror = &jetstream.StreamSource{Name: "ELSEWHERE"}
	cfg.Sealed = true
	v.checkPartition(0, cfg)
	dlq := topo.deadLetterConfig()
	dlq.Sealed = true
	v.checkDeadLetterStream(dlq)
	var got []finding
	for _, f := range v.findings {
		got = append(got, keyOf(f))
	}
	assert.ElementsMatch(t, []finding{{Required, "stream WH_INGEST_0", "mirror"}, {Required, "stream WH_INGEST_0", "sealed"}, {Required, "stream WH_DLQ", "sealed"}}, got)
}

func TestVerifyNATSTopology_ASourceNotAttachedYetIsTransient(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	s := shapeOf(NATSTopology{})
	// The history sources partition 0 through a domain nobody answers for, so the
	// source never attaches; the external source is its own finding.
	s.stream(t, "WH_HISTORY").Sources[0].External = &jetstream.ExternalStream{APIPrefix: "$JS.nowhere.API"}
	f.apply(t, s)
	findings, err := VerifyNATSTopology(t.Context(), f.admin, s.topo)
	require.NoError(t, err)
	var transient []Finding
	for _, fd := range findings {
		if fd.Transient {
			transient = append(transient, fd)
		}
	}
	require.Len(t, transient, 1)
	assert.Equal(t, Required, transient[0].Severity)
	assert.Contains(t, transient[0].Problem, "WH_INGEST_0 is not attached yet")
	assert.ElementsMatch(t, []finding{{Required, "stream WH_HISTORY", "sources"}, {Required, "stream WH_HISTORY", "sources"}},
		beyondBaseline(s.topo, findings), "the external source and its missing attachment")
}

func TestCheckServer_AcceptsTheTestedLineAndRefusesOldServers(t *testing.T) {
	cases := map[string]Severity{
		"2.15.2": 0, "v2.15.0-beta": 0,
		"2.10.0": Recommended, "2.14.6": Recommended, "3.0.0": Recommended,
		"2.9.25": Required, "1.4.1": Required, "garbage": Required, "": Required,
	}
	for version, want := range cases {
		v := &verifier{}
		v.checkServer(version)
		if want == 0 {
			assert.Empty(t, v.findings, version)
			continue
		}
		require.Len(t, v.findings, 1, version)
		assert.Equal(t, want, v.findings[0].Severity, version)
		assert.Equal(t, "version", v.findings[0].Field)
	}
}

func TestAwaitNATSTopology_ThreeFaultsGiveOneErrorNamingAll(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	s := shapeOf(NATSTopology{})
	s.drop("WH_DLQ")
	s.stream(t, "WH_INGEST_1").Retention = jetstream.LimitsPolicy
	delete(s.consumers, "WH_INGEST_2")
	f.apply(t, s)
	_, err := AwaitNATSTopology(t.Context(), f.admin, s.topo, 600*time.Millisecond)
	require.ErrorIs(t, err, ErrTopology)
	var te *TopologyError
	require.ErrorAs(t, err, &te)
	required := 0
	for _, fd := range te.Findings {
		if fd.Severity == Required {
			required++
		}
	}
	assert.Equal(t, 3, required)
	for _, want := range []string{"dead-letter stream: subjects", "stream WH_INGEST_1: retention", "consumer WH_INGEST_2/INGEST: durable_name"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Equal(t, Required, te.Findings[0].Severity, "required findings come first")
}

// TestAwaitNATSTopology_ACtxEndingBeforeTheWaitKeepsWhatTheLastCheckFound: a ctx
// shorter than the wait ends the wait in an error that is the ctx's and also the last
// check's: the *TopologyError with its findings, or, on a server gone, the error of a
// check that could not run.
func TestAwaitNATSTopology_ACtxEndingBeforeTheWaitKeepsWhatTheLastCheckFound(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	f.apply(t, shapeOf(NATSTopology{Partitions: 2}))
	await := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := AwaitNATSTopology(ctx, f.admin, NATSTopology{Partitions: 3}, time.Hour)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		return err
	}
	err := await()
	var te *TopologyError
	require.ErrorAs(t, err, &te)
	assert.Contains(t, err.Error(), "ingest partition 2: subjects")

	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	err = await()
	assert.NotErrorIs(t, err, ErrTopology)
	assert.Contains(t, err.Error(), "check nats topology")
}

func TestAwaitNATSTopology_ReturnsTheRecommendationsOnceTheShapeIsRight(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	s := shapeOf(NATSTopology{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		f.apply(t, s)
	}()
	findings, err := AwaitNATSTopology(t.Context(), f.admin, s.topo, 10*time.Second)
	require.NoError(t, err)
	assert.Empty(t, beyondBaseline(s.topo, findings))
}

func TestVerifyNATSTopology_AServerNeverReachedIsAnErrorNotAFinding(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	findings, err := VerifyNATSTopology(ctx, f.admin, NATSTopology{})
	require.Error(t, err)
	assert.Nil(t, findings)
	_, err = AwaitNATSTopology(t.Context(), f.admin, NATSTopology{}, 500*time.Millisecond)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrTopology)
	assert.Contains(t, err.Error(), "check nats topology")
}

// TestVerifyNATSTopology_RulesOnlyARaceOrAnotherAccountCanBreak covers the lookups no
// single account can break (JetStream refuses two streams with overlapping subjects in
// one account, and a stream found by subject but gone by name is a race with the
// operator) by answering the subject lookup with fixed names over a real server.
func TestVerifyNATSTopology_RulesOnlyARaceOrAnotherAccountCanBreak(t *testing.T) {
	t.Parallel()
	f := newNATSFixture(t)
	s := shapeOf(NATSTopology{})
	f.apply(t, s)
	for name, tc := range map[string]struct {
		subject string
		names   []string
		want    finding
	}{
		"two streams hold a partition":      {"wh.ingest.1.x", []string{"OTHER", "WH_INGEST_1"}, finding{Required, "ingest partition 1", "subjects"}},
		"a partition gone by name":          {"wh.ingest.2.x", []string{"GONE"}, finding{Required, "stream GONE", "name"}},
		"two streams hold the dead letters": {"wh.dlq.x", []string{"OTHER", "WH_DLQ"}, finding{Required, "dead-letter stream", "subjects"}},
		"a dead-letter stream gone by name": {"wh.dlq.x", []string{"GONE"}, finding{Required, "stream GONE", "name"}},
	} {
		t.Run(name, func(t *testing.T) {
			v := newVerifier(f.admin, s.topo)
			real := v.holders
			v.holders = func(ctx context.Context, subject string) ([]string, error) {
				if subject == tc.subject {
					return tc.names, nil
				}
				return real(ctx, subject)
			}
			findings, err := v.run(t.Context())
			require.NoError(t, err)
			got := beyondBaseline(s.topo, findings)
			require.NotEmpty(t, got)
			assert.Equal(t, tc.want, got[0], "%v", got)
		})
	}
}
