package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsErrNoMessageFound is the server's code for a sequence (or a next-by-subject search)
// that holds no message.
const jsErrNoMessageFound = 10037

// defaultDeadLetterPage is the page size of a DeadLetterQuery without a Limit.
const defaultDeadLetterPage = 100

// storedMsgAnswer is a STREAM.MSG.GET answer.
type storedMsgAnswer struct {
	Error   *jetstream.APIError `json:"error"`
	Message *storedMsg          `json:"message"`
}

// storedMsg is one message as STREAM.MSG.GET returns it.
type storedMsg struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"seq"`
	Header   []byte    `json:"hdrs"`
	Data     []byte    `json:"data"`
	Time     time.Time `json:"time"`
}

// parked is one stored dead letter.
type parked struct {
	seq    uint64
	key    string
	header nats.Header
	msg    *Message
}

// dlqRequest sends one JetStream API request about the dead-letter stream, bounded by
// PublishTimeout.
func (c *natsCore) dlqRequest(ctx context.Context, api string, req any) ([]byte, error) {
	return c.streamRequest(ctx, api, c.deadLetters, req)
}

// streamRequest sends one JetStream API request about stream, bounded by
// PublishTimeout.
func (c *natsCore) streamRequest(ctx context.Context, api, stream string, req any) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.topo.PublishTimeout)
	defer cancel()
	msg, err := c.nc.RequestWithContext(rctx, jetstream.DefaultAPIPrefix+api+"."+stream, body)
	switch {
	case err == nil:
	case c.closed.Load(): // Close cut the request off: no retry will do
		return nil, c.mapRequestError(api+" on stream "+stream, err)
	case ctx.Err() != nil:
		return nil, ctx.Err()
	default:
		return nil, fmt.Errorf("%w: %s on stream %s: %w", ErrUnavailable, api, stream, err)
	}
	return msg.Data, nil
}

// storedMsg asks stream for one stored message (STREAM.MSG.GET with req): a miss is
// (nil, nil).
func (c *natsCore) storedMsg(ctx context.Context, stream string, req any) (*storedMsg, error) {
	data, err := c.streamRequest(ctx, "STREAM.MSG.GET", stream, req)
	if err != nil {
		return nil, err
	}
	var answer storedMsgAnswer
	if err := json.Unmarshal(data, &answer); err != nil {
		return nil, fmt.Errorf("stored message on %s: %w", stream, err)
	}
	if answer.Error != nil {
		if answer.Error.ErrorCode == jsErrNoMessageFound {
			return nil, nil
		}
		if answer.Error.ErrorCode == jetstream.JSErrCodeStreamNotFound {
			return nil, fmt.Errorf("%w: stream %s: %w", ErrUnavailable, stream, answer.Error)
		}
		return nil, fmt.Errorf("stored message on %s: %w", stream, answer.Error)
	}
	return answer.Message, nil
}

// getParked reads the first parked event at or after seq whose subject matches filter,
// or, with an empty filter, exactly seq. A miss is (nil, nil).
func (c *natsCore) getParked(ctx context.Context, seq uint64, filter string) (*parked, error) {
	req := struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj,omitempty"`
	}{seq, filter}
	m, err := c.storedMsg(ctx, c.deadLetters, req)
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	if m == nil {
		return nil, nil
	}
	h := nats.Header{}
	if len(m.Header) > 0 {
		if h, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("dead letter %d: headers: %w", m.Sequence, err)
		}
	}
	key := c.subs.keyOrSubject(m.Subject)
	msg := &Message{
		Data: m.Data, Headers: userHeaders(h), ID: strconv.FormatUint(m.Sequence, 10),
		Attempt: 1, Sequence: m.Sequence, Ctx: ctx, key: key, Timestamp: m.Time,
	}
	return &parked{seq: m.Sequence, key: key, header: h, msg: msg}, nil
}

// belongs reports whether p is tenant's and, with a table, that table's (any scope).
func belongs(p *parked, tenant TenantID, table string) bool {
	t, err := ParseTopicKey(p.key)
	if err != nil {
		// A key this package did not write: the tenant is its first token, as for counts.
		first, _, _ := strings.Cut(p.key, ".")
		return first == string(tenant) && table == ""
	}
	return t.Tenant == tenant && (table == "" || t.Table == table)
}

// deadLetters pages tenant's parked events, oldest first.
func (c *natsCore) listDeadLetters(ctx context.Context, tenant TenantID, q DeadLetterQuery) ([]*Message, string, error) {
	if err := c.checkDLQCall(ctx, "dead letters", tenant); err != nil {
		return nil, "", err
	}
	from := uint64(1)
	if q.Cursor != "" {
		n, err := strconv.ParseUint(q.Cursor, 10, 64)
		if err != nil || n == 0 {
			return nil, "", fmt.Errorf("%w: dead letters: cursor %q is not one DeadLetters returned", ErrInvalidConfig, q.Cursor)
		}
		from = n
	}
	limit := q.Limit
	switch {
	case limit < 0:
		return nil, "", fmt.Errorf("%w: dead letters: negative limit %d", ErrInvalidConfig, limit)
	case limit == 0:
		limit = defaultDeadLetterPage
	}
	var page []*Message
	for seq := from; ; {
		p, err := c.getParked(ctx, seq, c.subs.tenantDeadLetters(tenant))
		if err != nil {
			return nil, "", fmt.Errorf("dead letters of %s: %w", tenant, err)
		}
		if p == nil {
			return page, "", nil
		}
		seq = p.seq + 1
		if !belongs(p, tenant, q.Table) {
			continue
		}
		if len(page) == limit {
			// The next page's first event, read ahead: a cursor after a full page
			// that ended the list led the operator to a page of nothing.
			return page, strconv.FormatUint(p.seq, 10), nil
		}
		page = append(page, p.msg)
	}
}

func (c *natsCore) checkDLQCall(ctx context.Context, op string, tenant TenantID) error {
	if ctx == nil {
		return errNilContext(op)
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if err := tenant.Validate(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// selected calls each for every parked event of tenant sel selects, oldest first, up to
// the last one stored when it started (so an event parked again meanwhile waits for the
// next call). An id that is not tenant's parked event is ErrDeadLetterNotFound before
// anything is done.
func (c *natsCore) selected(ctx context.Context, op string, tenant TenantID, sel DeadLetterSelector, each func(*parked) error) error {
	if err := c.checkDLQCall(ctx, op, tenant); err != nil {
		return err
	}
	if err := sel.check(op); err != nil {
		return err
	}
	if len(sel.IDs) > 0 {
		var ps []*parked
		seen := map[uint64]bool{}
		for _, id := range sel.IDs {
			seq, err := strconv.ParseUint(id, 10, 64)
			if err == nil && seen[seq] {
				continue // an id given twice is one event
			}
			var p *parked
			if err == nil && seq > 0 {
				seen[seq] = true
				if p, err = c.getParked(ctx, seq, ""); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
			}
			if p == nil || !belongs(p, tenant, "") {
				return fmt.Errorf("%w: %s: %q is not a parked event of tenant %s", ErrDeadLetterNotFound, op, id, tenant)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			if err := each(p); err != nil {
				return err
			}
		}
		return nil
	}
	last, err := c.dlqLastSeq(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	for seq := uint64(1); seq <= last; {
		p, err := c.getParked(ctx, seq, c.subs.tenantDeadLetters(tenant))
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if p == nil || p.seq > last {
			return nil
		}
		seq = p.seq + 1
		if !belongs(p, tenant, sel.Table) {
			continue
		}
		if err := each(p); err != nil {
			return err
		}
	}
	return nil
}

// check refuses a selector that does not give exactly one way: one of two ways
// given at once would be dropped silently, All with IDs acting on the IDs alone.
func (sel DeadLetterSelector) check(op string) error {
	given := 0
	for _, way := range []bool{sel.All, sel.Table != "", len(sel.IDs) > 0} {
		if way {
			given++
		}
	}
	if given != 1 {
		return fmt.Errorf("%w: %s: select exactly one of All, a Table or IDs (%d given)", ErrInvalidConfig, op, given)
	}
	return nil
}

// dlqLastSeq reads the dead-letter stream's last sequence.
func (c *natsCore) dlqLastSeq(ctx context.Context) (uint64, error) {
	data, err := c.dlqRequest(ctx, "STREAM.INFO", struct{}{})
	if err != nil {
		return 0, err
	}
	var answer struct {
		Error *jetstream.APIError `json:"error"`
		State struct {
			LastSeq uint64 `json:"last_seq"`
		} `json:"state"`
	}
	if err := json.Unmarshal(data, &answer); err != nil {
		return 0, err
	}
	if answer.Error != nil {
		return 0, fmt.Errorf("%w: dead-letter stream %s: %w", ErrUnavailable, c.deadLetters, answer.Error)
	}
	return answer.State.LastSeq, nil
}

// deleteParked removes parked event seq and reports whether this call removed it; one
// already gone (another call removed it) is no error. The server answers such a delete
// with one of several codes (10057 "no message found" from its store, 10043 for a
// sequence it never had), so a refused delete is settled by reading seq back.
func (c *natsCore) deleteParked(ctx context.Context, seq uint64) (bool, error) {
	data, err := c.dlqRequest(ctx, "STREAM.MSG.DELETE", struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	if err != nil {
		return false, err
	}
	var answer struct {
		Error   *jetstream.APIError `json:"error"`
		Success bool                `json:"success"`
	}
	if err := json.Unmarshal(data, &answer); err != nil {
		return false, err
	}
	if answer.Error == nil {
		return true, nil
	}
	if answer.Error.ErrorCode != jsErrNoMessageFound {
		if p, err := c.getParked(ctx, seq, ""); err != nil || p != nil {
			return false, errors.Join(fmt.Errorf("delete dead letter %d on %s: %w", seq, c.deadLetters, answer.Error), err)
		}
	}
	return false, nil
}

// deleteDeadLetters removes what sel selects of tenant's parked events; the count is of
// those this call removed.
func (c *natsCore) deleteDeadLetters(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error) {
	n := 0
	err := c.selected(ctx, "delete dead letters", tenant, sel, func(p *parked) error {
		removed, err := c.deleteParked(ctx, p.seq)
		if removed {
			n++
		}
		return err
	})
	return n, err
}

// redriveKey is the idempotency key a redrive publishes parked event seq with: a retried
// redrive of one park is stored once (within the partitions' duplicate window).
func redriveKey(stream string, seq uint64) string {
	return "redrive-" + stream + "-" + strconv.FormatUint(seq, 10)
}

// redrive re-publishes what sel selects of tenant's parked events through publish (the
// broker's own Publish, budgets and all) and deletes each once it is stored.
func (c *natsCore) redrive(ctx context.Context, tenant TenantID, sel DeadLetterSelector,
	publish func(context.Context, Topic, []byte, ...PublishOpt) error) (int, error) {
	n := 0
	err := c.selected(ctx, "redrive", tenant, sel, func(p *parked) error {
		topic, err := ParseTopicKey(p.key)
		if err != nil {
			if len(sel.IDs) > 0 {
				return fmt.Errorf("redrive %d: %w", p.seq, err)
			}
			return nil // not a topic this package wrote: it stays parked
		}
		opts := []PublishOpt{WithIdempotencyKey(redriveKey(c.deadLetters, p.seq))}
		for k, vs := range p.msg.Headers {
			if strings.HasPrefix(strings.ToLower(k), "mq-dead-") {
				continue
			}
			for _, v := range vs {
				opts = append(opts, WithHeader(k, v))
			}
		}
		if err := publish(carryingEventID(ctx, p.header.Get(HeaderEventID)), topic, p.msg.Data, opts...); err != nil {
			return fmt.Errorf("redrive %d: %w", p.seq, err)
		}
		removed, err := c.deleteParked(ctx, p.seq)
		if err != nil {
			return fmt.Errorf("redrive %d: stored again, but its park may not be removed: %w", p.seq, err)
		}
		if removed { // else a redrive beside this one took it, and counts it
			n++
		}
		return nil
	})
	return n, err
}
