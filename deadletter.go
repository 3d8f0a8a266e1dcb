package mq

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// deadLetter parks msg's data and headers under its own topic key on the dead-letter
// stream. Its message id is never the original's (that left with its Nats- headers):
// a fresh one, or the caller's idempotency key scoped to msg's tenant, as on Publish.
func (c *natsCore) deadLetter(ctx context.Context, msg *Message, opts []PublishOpt) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	if msg == nil || msg.key == "" {
		return fmt.Errorf("%w: dead letter: the message has no topic key", ErrInvalidTopic)
	}
	base := make(Headers, len(msg.Headers))
	for k, v := range msg.Headers {
		if !strings.HasPrefix(strings.ToLower(k), reservedHeaderPrefix) {
			base[k] = v
		}
	}
	// The key's first token is the tenant, also for a key this package did not write:
	// DeadLetterCounts counts that park under the same tenant.
	tenant, _, _ := strings.Cut(msg.key, ".")
	ev, err := c.prepare(ctx, tenant, c.subs.deadLetter(msg.key), c.deadLetters, base, msg.Data, opts)
	if err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	_, _, err = c.send(ctx, ev)
	return err
}

// deadLetterCounts reads tenant's parked counts with one subject-filtered info call.
func (c *natsCore) deadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	if err := c.checkOpen(); err != nil {
		return DeadLetterCounts{}, err
	}
	if err := tenant.Validate(); err != nil {
		return DeadLetterCounts{}, fmt.Errorf("dead-letter counts: %w", err)
	}
	stream, err := c.js.Stream(ctx, c.deadLetters)
	if err != nil {
		return DeadLetterCounts{}, c.mapRequestError("dead-letter counts: stream "+c.deadLetters, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.subs.tenantDeadLetters(tenant)))
	if err != nil {
		return DeadLetterCounts{}, c.mapRequestError("dead-letter counts: stream "+c.deadLetters, err)
	}
	counts := DeadLetterCounts{Tables: deadLetterTables(info.State.Subjects, c.subs, table)}
	for _, n := range info.State.Subjects {
		counts.Total += n
	}
	return counts, nil
}

// deadLetterTables folds per-subject dead-letter counts into per-table counts, the
// shape of DeadLetterCounts.Tables. Every scope of a table counts under the table
// itself, so a table literally named "a.b" (one escaped token) never shares a count
// with table "a" scope "b". A non-empty table keeps only that table, with all its
// scopes. A subject this prefix did not write counts under its whole topic-key tail.
func deadLetterTables(perSubject map[string]uint64, subs subjects, table string) map[string]uint64 {
	tables := make(map[string]uint64)
	for subject, n := range perSubject {
		name := subs.keyOrSubject(subject)
		if t, err := ParseTopicKey(name); err == nil {
			name = t.Table
		}
		if table != "" && name != table {
			continue
		}
		tables[name] += n
	}
	return tables
}
