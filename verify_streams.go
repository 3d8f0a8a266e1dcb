package mq

// The verifier's checks of the history and the dead-letter stream.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

func (v *verifier) checkHistory(ctx context.Context) error {
	obj := "stream " + v.topo.HistoryStream
	info, err := v.streamInfo(ctx, v.topo.HistoryStream)
	if err != nil {
		return err
	}
	if info == nil {
		v.add(Required, obj, "name", "does not exist: the hub and replay read it")
		return nil
	}
	cfg := info.Config
	if len(cfg.Subjects) > 0 {
		v.add(Required, obj, "subjects", "is %v, must be empty: the history only sources the partitions", cfg.Subjects)
	}
	active := map[string]int64{}
	for _, s := range info.Sources {
		active[s.Name] = int64(s.Active)
	}
	for p, name := range v.partitionStreams {
		if name == "" {
			continue
		}
		i := slices.IndexFunc(cfg.Sources, func(s *jetstream.StreamSource) bool { return s.Name == name })
		if i < 0 {
			v.add(Required, obj, "sources", "does not source partition %d (stream %s)", p, name)
			continue
		}
		src := cfg.Sources[i]
		if src.FilterSubject != "" && src.FilterSubject != v.subs.partitionFilter(p) {
			v.add(Required, obj, "sources", "source %s filters %s: must be empty or %s", name, src.FilterSubject, v.subs.partitionFilter(p))
		}
		if len(src.SubjectTransforms) > 0 {
			v.add(Required, obj, "sources", "source %s transforms subjects: the history must keep them", name)
		}
		if src.External != nil {
			v.add(Required, obj, "sources", "source %s is external (another domain or account)", name)
		}
		if a, ok := active[name]; !ok || a < 0 {
			v.findings = append(v.findings, Finding{Severity: Required, Object: obj, Field: "sources", Transient: true,
				Problem: fmt.Sprintf("source %s is not attached yet: events acknowledged before it attaches never reach the history", name)})
		}
	}
	if cfg.Retention != jetstream.LimitsPolicy {
		v.add(Required, obj, "retention", "is %s, must be limits", jsonName(cfg.Retention))
	}
	if cfg.Discard != jetstream.DiscardOld {
		v.add(Required, obj, "discard", "is %s, must be old: a full history would hold events on the partitions and refuse ingest", jsonName(cfg.Discard))
	}
	switch {
	case cfg.MaxAge <= 0:
		v.add(Required, obj, "max_age", "is unlimited, must be set to at least the longest gap window served")
	case cfg.MaxAge < v.topo.HistoryMaxAge:
		v.add(Recommended, obj, "max_age", "is %s, shorter than the topology's HistoryMaxAge %s: a replay of an older gap misses events",
			cfg.MaxAge, v.topo.HistoryMaxAge)
	}
	if cfg.MaxMsgsPerSubject > 0 {
		v.add(Recommended, obj, "max_msgs_per_subject", "is %d: a topic's replay keeps only its last %d events", cfg.MaxMsgsPerSubject, cfg.MaxMsgsPerSubject)
	}
	if cfg.MaxMsgs > 0 {
		v.add(Recommended, obj, "max_msgs", "is %d: bound the history by max_age and max_bytes, or a burst shortens every replay's window", cfg.MaxMsgs)
	}
	if cfg.Storage != jetstream.FileStorage {
		v.add(Recommended, obj, "storage", "is %s: a server restart empties the history, and replays of gaps before it", jsonName(cfg.Storage))
	}
	if cfg.MaxBytes <= 0 {
		v.add(Recommended, obj, "max_bytes", "is unlimited: bound the history's disk")
	}
	v.checkHistoryMonitor(obj, cfg.Metadata)
	return nil
}

func (v *verifier) checkDeadLetters(ctx context.Context) error {
	probe := v.subs.deadLetter("x")
	names, err := v.holders(ctx, probe)
	if err != nil {
		return err
	}
	switch {
	case len(names) == 0:
		v.add(Required, "dead-letter stream", "subjects", "no stream holds %s (create %s with subjects %s)",
			v.subs.deadLetterAll(), v.topo.DeadLetterStream(), v.subs.deadLetterAll())
		return nil
	case len(names) > 1:
		v.add(Required, "dead-letter stream", "subjects", "streams %s all hold %s: exactly one may", strings.Join(names, ", "), probe)
		return nil
	}
	info, err := v.streamInfo(ctx, names[0])
	if err != nil {
		return err
	}
	if info == nil {
		v.add(Required, "stream "+names[0], "name", "found by subject but not by name")
		return nil
	}
	v.checkDeadLetterStream(info.Config)
	return nil
}

func (v *verifier) checkDeadLetterStream(cfg jetstream.StreamConfig) {
	obj := "stream " + cfg.Name
	if want := v.topo.DeadLetterStream(); cfg.Name != want {
		v.add(Recommended, obj, "name", "must be %s for the dead-letter workflow (DeadLetters, Redrive, mqctl dlq) under the application user's permissions, which name it; parking works either way", want)
	}
	if cfg.NoAck {
		v.add(Required, obj, "no_ack", "is set: a park would never be confirmed")
	}
	if cfg.Sealed {
		v.add(Required, obj, "sealed", "is set: a sealed stream takes no parks")
	}
	if !slices.Contains(cfg.Subjects, v.subs.deadLetterAll()) {
		v.add(Required, obj, "subjects", "%v must include %s", cfg.Subjects, v.subs.deadLetterAll())
	}
	if cfg.Retention != jetstream.LimitsPolicy {
		v.add(Required, obj, "retention", "is %s, must be limits", jsonName(cfg.Retention))
	}
	if cfg.Discard != jetstream.DiscardOld {
		v.add(Required, obj, "discard", "is %s, must be old: a full dead-letter stream must never refuse a park", jsonName(cfg.Discard))
	}
	if cfg.Storage != jetstream.FileStorage {
		v.add(Required, obj, "storage", "is %s, must be file", jsonName(cfg.Storage))
	}
	if cfg.MaxBytes <= 0 {
		v.add(Required, obj, "max_bytes", "is unlimited, must be set")
	}
	if cfg.DenyDelete {
		v.add(Required, obj, "deny_delete", "is set: Redrive and DeleteDeadLetters delete single parked events, allow it")
	}
	if cfg.MaxMsgsPerSubject <= 0 {
		v.add(Recommended, obj, "max_msgs_per_subject", "is unlimited: set it so one flooding topic evicts only its own parked events")
	}
}
