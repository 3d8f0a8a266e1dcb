package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// deadLetter parks msg's data and headers under its own topic key on the dead-letter
// stream. Its message id is never the original's (that left with its Nats- headers):
// a fresh one, or the caller's idempotency key scoped to msg's tenant, as on Publish.
// The poison policy's park gives the handler's error as deadErr ("" for a host's
// park): it goes in HeaderDeadError, cut to what the server takes.
func (c *natsCore) deadLetter(ctx context.Context, msg *Message, opts []PublishOpt, deadErr string) (err error) {
	if ctx == nil {
		return errNilContext("dead letter")
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if msg == nil || msg.key == "" {
		return fmt.Errorf("%w: dead letter: the message has no topic key", ErrInvalidTopic)
	}
	// A delivered message has no "Nats-" header (see Message.Headers); one a host put
	// in a message it built is refused as on Publish, not dropped unseen, since the
	// host meant something by it. The message's own key is never reused: a park
	// takes one from WithIdempotencyKey alone.
	for k := range msg.Headers {
		if reserved(k) {
			return fmt.Errorf("%w: dead letter: the message's own header %q: names starting with \"Nats-\" are reserved for the broker (a park's key is set with WithIdempotencyKey)",
				ErrInvalidHeader, k)
		}
	}
	ctx = carryingEventID(ctx, msg.ID) // for a redrive to keep
	// The key's first token is the tenant, also for a key this package did not write:
	// DeadLetterCounts counts that park under the same tenant.
	tenant, _, _ := strings.Cut(msg.key, ".")
	// The metrics get the topic's own tenant, "" for a foreign key, whose first token
	// a foreign producer chose: it must not add values to mq.tenant.
	ctx, span := c.startSend(ctx, opDeadLetter, toDeadLetters, -1, msg.Topic().Tenant, 1)
	defer func() { span.end(err) }()
	ev, err := c.prepareFitting(ctx, tenant, c.subs.deadLetter(msg.key), msg.Headers, msg.Data, opts, deadErr)
	if err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	span.SetAttributes(semconv.MessagingMessageID(eventID(TenantID(tenant), ev.header.Get(HeaderIdempotencyKey))))
	ack, unanswered, err := c.sendRetrying(ctx, ev)
	// A Duplicate is a park an earlier call stored (a host's retry after a success), or
	// this call's own first attempt, whose answer was lost.
	if err == nil && (!ack.Duplicate || unanswered) {
		c.metrics.park(msg.Topic())
	}
	return err
}

// prepareFitting prepares a park of data with headers base and the options opts, and
// with deadErr (if any) as HeaderDeadError, on one line and cut to maxDeadErrorLen,
// then to what the server's max payload leaves of it: the error is the one header
// whose length the event did not fix when it was published (see park_room.go), so a
// park of the largest event loses some of its error rather than being refused.
func (c *natsCore) prepareFitting(ctx context.Context, tenant, subject string, base Headers, data []byte, opts []PublishOpt, deadErr string) (outgoing, error) {
	text := oneLine(deadErr, maxDeadErrorLen)
	for {
		all := opts
		if text != "" {
			all = append(slices.Clip(opts), WithHeader(HeaderDeadError, text))
		}
		ev, err := c.prepare(ctx, tenant, subject, c.deadLetters, base, data, all)
		var tooLarge *sizeError
		if text == "" || !errors.As(err, &tooLarge) {
			return ev, err
		}
		// Cut by the excess; a cut that leaves nothing drops the header.
		text = oneLine(text, max(0, len(text)-(tooLarge.size-int(tooLarge.limit))))
	}
}

// deadLetterCounts reads tenant's parked counts with one subject-filtered info request.
func (c *natsCore) deadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	if ctx == nil {
		return DeadLetterCounts{}, errNilContext("dead-letter counts")
	}
	if err := c.checkOpen(); err != nil {
		return DeadLetterCounts{}, err
	}
	if err := tenant.Validate(); err != nil {
		return DeadLetterCounts{}, fmt.Errorf("dead-letter counts: %w", err)
	}
	perSubject, err := c.subjectCounts(ctx, c.deadLetters, c.subs.tenantDeadLetters(tenant))
	if err != nil {
		return DeadLetterCounts{}, c.mapRequestError("dead-letter counts: tenant "+string(tenant)+" on stream "+c.deadLetters, err)
	}
	counts := DeadLetterCounts{Tables: deadLetterTables(perSubject, c.subs, table)}
	for _, n := range perSubject {
		counts.Total += n
	}
	return counts, nil
}

// streamSubjectsAnswer is the part of a STREAM.INFO answer subjectCounts reads.
type streamSubjectsAnswer struct {
	Error *jetstream.APIError `json:"error"`
	Total int                 `json:"total"`
	State struct {
		Subjects map[string]uint64 `json:"subjects"`
	} `json:"state"`
}

// subjectCounts reads stream's message count per subject under filter: one STREAM.INFO
// request carrying the filter, and more only when the server pages a long answer
// (over 100,000 subjects). jetstream's Stream and then Info would ask twice, the
// first time for nothing the counts use. Both brokers make their JetStream handle
// with jetstream.New, so the API lives under the default prefix.
func (c *natsCore) subjectCounts(ctx context.Context, stream, filter string) (map[string]uint64, error) {
	subject := jetstream.DefaultAPIPrefix + "STREAM.INFO." + stream
	counts := map[string]uint64{}
	for {
		req, err := json.Marshal(struct {
			SubjectsFilter string `json:"subjects_filter"`
			Offset         int    `json:"offset,omitempty"`
		}{filter, len(counts)})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
		msg, err := c.nc.RequestWithContext(rctx, subject, req)
		cancel()
		if err != nil {
			return nil, err
		}
		var answer streamSubjectsAnswer
		if err := json.Unmarshal(msg.Data, &answer); err != nil {
			return nil, fmt.Errorf("stream info of %s: %w", stream, err)
		}
		if answer.Error != nil {
			if answer.Error.ErrorCode == jetstream.JSErrCodeStreamNotFound {
				return nil, fmt.Errorf("%w: %w", jetstream.ErrStreamNotFound, answer.Error)
			}
			return nil, answer.Error
		}
		before := len(counts)
		maps.Copy(counts, answer.State.Subjects)
		// A page that adds nothing ends it too: subjects that vanish between pages
		// would otherwise keep the total out of reach.
		if len(counts) >= answer.Total || len(counts) == before {
			return counts, nil
		}
	}
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
