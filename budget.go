package mq

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// budgets enforces per-tenant byte budgets over the shared partitions. A tenant's
// backlog is the size of its events stored on a partition and not yet acknowledged
// through the ingest durable.
//
// A stored event is counted under its identity, its partition and stream sequence.
// A message id is no identity: a partition drops a repeated id only within its
// duplicate window, and stores it again after. A publish reserves the event's size
// before it is sent, so no publish overtakes the budget, and hands the reservation
// to the event once the stream's answer names it; an event the durable already
// acknowledged by then (the ack overtook the answer) or one already counted is not
// counted again.
type budgets struct {
	mu   sync.Mutex
	max  map[TenantID]budgetLimit
	used map[TenantID]int64
	held []heldQueue // by partition
	// keyed maps the message id of a held event published under a caller's
	// idempotency key to the event the stream would drop a repeat of.
	keyed map[string]keyedEvent
	// acked holds, per partition, the stream sequences the durable is known to have
	// acknowledged: through its ack floor, and above it what this broker saw
	// acknowledged out of order, kept in the store across restarts because the
	// server does not tell which events above the floor are acknowledged.
	acked []seqSet
	// surelyDropped is how long after an event's store the stream surely still drops
	// a repeat of its id: the duplicate window less the longest a publish with its
	// retries takes to reach the stream.
	surelyDropped time.Duration
	// doubted names tenants with a budget write whose answer was lost: it may yet be
	// stored, so memory cannot tell whether a value is already in force.
	doubted map[TenantID]bool
}

// budgetLimit is a tenant's budget and the revision of the store's bucket it was
// written at. Revisions order every write of the bucket, so memory applies a value
// only if it is newer than the one in force: the store keeps its last write, and
// concurrent writers must not leave memory with an older one.
type budgetLimit struct {
	n   int64
	rev uint64
}

// eventRef is a stored event's identity: its partition and stream sequence.
type eventRef struct {
	partition int
	seq       uint64
}

type heldEvent struct {
	tenant TenantID
	size   int64
	// keyedID is the message id when a caller's idempotency key made it, else "".
	keyedID string
}

type keyedEvent struct {
	ref eventRef
	// stored is no later than the stream stored the event.
	stored time.Time
}

// reservation is what a publish holds against its tenant from before it is sent
// until the stream has answered. It ends exactly once, by commit or cancel.
type reservation struct {
	tenant    TenantID
	partition int
	keyedID   string
	size      int64
	// charged is what the reservation holds: size, or 0 for a repeat of a held
	// event that the stream surely drops.
	charged int64
	// at is taken before the send, so the event cannot be stored earlier.
	at    time.Time
	ended bool
}

func newBudgets(partitions int, surelyDropped time.Duration) *budgets {
	return &budgets{
		max: map[TenantID]budgetLimit{}, used: map[TenantID]int64{}, held: make([]heldQueue, partitions),
		keyed: map[string]keyedEvent{}, acked: make([]seqSet, partitions),
		surelyDropped: surelyDropped, doubted: map[TenantID]bool{},
	}
}

// eventSize is what an event counts against its tenant's budget: subject, user
// headers (h's without the broker's own "Nats-" ones) and data. It is computed alike
// at publish and when the backlog is rebuilt, without copying h.
func eventSize(subject string, h Headers, dataLen int) int64 {
	n := len(subject) + dataLen
	for k, vs := range h {
		if reserved(k) {
			continue
		}
		for _, v := range vs {
			n += len(k) + len(v) + 4 // ": " and CRLF
		}
	}
	return int64(n)
}

// reserve holds size bytes of tenant's budget for an event about to be sent to
// partition, with keyedID its message id if a caller's key made it. A repeat of a
// held keyed event, sent while the stream surely drops it, holds nothing: it cannot
// be stored, so it succeeds even at a full budget.
func (b *budgets) reserve(tenant TenantID, partition int, keyedID string, size int64, now time.Time) (*reservation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := &reservation{tenant: tenant, partition: partition, keyedID: keyedID, size: size, charged: size, at: now}
	if err := b.chargeLocked(tenant, []*reservation{r}, now); err != nil {
		return nil, err
	}
	return r, nil
}

// reserveBatch reserves every event of one batch of tenant's, or none: sizes[i] and
// keyedIDs[i] are the i-th event's. The batch fits when all its new bytes fit at once.
func (b *budgets) reserveBatch(tenant TenantID, partition int, keyedIDs []string, sizes []int64, now time.Time) ([]*reservation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := make([]*reservation, len(sizes))
	for i, size := range sizes {
		rs[i] = &reservation{tenant: tenant, partition: partition, keyedID: keyedIDs[i], size: size, charged: size, at: now}
	}
	if err := b.chargeLocked(tenant, rs, now); err != nil {
		return nil, err
	}
	return rs, nil
}

// chargeLocked charges tenant's budget for rs at once, or refuses them all. A
// reservation whose key the stream surely drops as a repeat is charged nothing.
func (b *budgets) chargeLocked(tenant TenantID, rs []*reservation, now time.Time) error {
	limit, ok := b.max[tenant]
	if !ok {
		return fmt.Errorf("%w: tenant %s has no byte budget (SetMaxBytes opens it)", ErrQueueFull, tenant)
	}
	var total int64
	repeats := 0
	for _, r := range rs {
		if k, ok := b.keyed[r.keyedID]; ok && r.keyedID != "" && now.Before(k.stored.Add(b.surelyDropped)) {
			r.charged = 0
			repeats++
		}
		total += r.charged
	}
	if used := b.used[tenant]; repeats < len(rs) && used+total > limit.n {
		return fmt.Errorf("%w: tenant %s: %d bytes queued + %d exceeds its budget of %d",
			ErrQueueFull, tenant, used, total, limit.n)
	}
	b.used[tenant] += total
	return nil
}

// commit hands r to the event the stream stored it as, at seq.
func (b *budgets) commit(r *reservation, seq uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	if b.acked[r.partition].has(seq) || !b.held[r.partition].add(seq, heldEvent{tenant: r.tenant, size: r.size, keyedID: r.keyedID}) {
		b.used[r.tenant] -= r.charged
		return
	}
	b.used[r.tenant] += r.size - r.charged
	if r.keyedID != "" {
		b.keyed[r.keyedID] = keyedEvent{ref: eventRef{r.partition, seq}, stored: r.at}
	}
}

// cancel gives r back unless it was committed; the publish stored nothing, or
// nothing known.
func (b *budgets) cancel(r *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	b.used[r.tenant] -= r.charged
}

// acknowledged reports whether the event at ref is known acknowledged.
func (b *budgets) acknowledged(ref eventRef) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isAcked(ref)
}

// isAcked is acknowledged with b.mu held.
func (b *budgets) isAcked(ref eventRef) bool {
	return ref.partition >= 0 && ref.partition < len(b.acked) && b.acked[ref.partition].has(ref.seq)
}

// counted reports whether the event at ref is held or acknowledged.
func (b *budgets) counted(ref eventRef) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, held := b.held[ref.partition].get(ref.seq)
	return held || b.isAcked(ref)
}

// adopt counts a stored event found uncounted, without checking the budget: a
// backlog rebuilt from disk, or the event a repeated id was dropped in favour of.
// stored is when the stream stored it. It reports whether it counted the event:
// not if it is counted already or known to be acknowledged.
func (b *budgets) adopt(ref eventRef, ev heldEvent, stored time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.acked[ref.partition].has(ref.seq) || !b.held[ref.partition].add(ref.seq, ev) {
		return false
	}
	b.used[ev.tenant] += ev.size
	if k, ok := b.keyed[ev.keyedID]; ev.keyedID != "" && (!ok || k.ref.seq < ref.seq) {
		b.keyed[ev.keyedID] = keyedEvent{ref: ref, stored: stored}
	}
	return true
}

// release records that the durable acknowledged the event at ref and stops counting
// it; releasing twice is harmless.
func (b *budgets) release(ref eventRef) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ref.partition < 0 || ref.partition >= len(b.acked) {
		return
	}
	b.acked[ref.partition].add(ref.seq)
	ev, ok := b.held[ref.partition].remove(ref.seq)
	if !ok {
		return
	}
	b.used[ev.tenant] -= ev.size
	if ev.keyedID == "" {
		return // most events: no key, no lookup on the ack path
	}
	if k, ok := b.keyed[ev.keyedID]; ok && k.ref == ref {
		delete(b.keyed, ev.keyedID)
	}
}

// ackedThrough records that the durable acknowledged every event of partition up to
// and including floor (its ack floor).
func (b *budgets) ackedThrough(partition int, floor uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.acked[partition].addRange(1, floor)
}

// ackedRanges records that the durable acknowledged the events of partition in
// ranges.
func (b *budgets) ackedRanges(partition int, ranges []seqRange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range ranges {
		b.acked[partition].addRange(r.lo, r.hi)
	}
}

// ackedAbove records partition's ack floor and returns the acknowledged sequences
// above it: events acknowledged out of order, which the partition may still store.
func (b *budgets) ackedAbove(partition int, floor uint64) []seqRange {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := &b.acked[partition]
	set.addRange(1, floor)
	var above []seqRange
	for _, r := range set.ranges {
		if r.hi > floor {
			above = append(above, seqRange{max(r.lo, floor+1), r.hi})
		}
	}
	return above
}

// stored applies tenant's budget n as the store holds it at revision rev, unless a
// later revision is already in force.
func (b *budgets) stored(tenant TenantID, n int64, rev uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.max[tenant]; ok && cur.rev >= rev {
		return
	}
	b.max[tenant] = budgetLimit{n: n, rev: rev}
}

// removed drops tenant's budget, deleted from the store at revision rev, unless a
// later revision is already in force.
func (b *budgets) removed(tenant TenantID, rev uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.max[tenant]; ok && cur.rev >= rev {
		return
	}
	delete(b.max, tenant)
}

// wrote applies a budget write the store confirmed at revision rev.
func (b *budgets) wrote(tenant TenantID, n int64, rev uint64) {
	b.stored(tenant, n, rev)
	b.mu.Lock()
	delete(b.doubted, tenant)
	b.mu.Unlock()
}

// doubt records a write of tenant's budget whose outcome is unknown.
func (b *budgets) doubt(tenant TenantID) {
	b.mu.Lock()
	b.doubted[tenant] = true
	b.mu.Unlock()
}

// inForce reports whether n is tenant's budget with no write of it in doubt, so
// writing n again would change nothing.
func (b *budgets) inForce(tenant TenantID, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.max[tenant]
	return ok && cur.n == n && !b.doubted[tenant]
}

// limit returns tenant's budget and whether it has one.
func (b *budgets) limit(tenant TenantID) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.max[tenant]
	return cur.n, ok
}

// snapshot returns every budgeted tenant's budget and backlog.
func (b *budgets) snapshot() (limits, used map[TenantID]int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	limits = make(map[TenantID]int64, len(b.max))
	used = make(map[TenantID]int64, len(b.max))
	for t, lim := range b.max {
		limits[t] = lim.n
		used[t] = b.used[t]
	}
	return limits, used
}

// seqSet is a set of stream sequences kept as sorted, disjoint, non-adjacent
// ranges: acknowledgements come mostly in order, so it stays a few ranges long.
type seqSet struct{ ranges []seqRange }

// seqRange is the sequences lo through hi, both included.
type seqRange struct{ lo, hi uint64 }

func (s *seqSet) has(seq uint64) bool {
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].hi >= seq })
	return i < len(s.ranges) && s.ranges[i].lo <= seq
}

func (s *seqSet) add(seq uint64) { s.addRange(seq, seq) }

// addRange adds lo through hi, merging every range it overlaps or touches.
func (s *seqSet) addRange(lo, hi uint64) {
	if lo > hi || lo == 0 {
		return
	}
	// The first range that ends at or after lo-1 is the first one lo can touch.
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].hi+1 >= lo })
	j := i
	for ; j < len(s.ranges) && s.ranges[j].lo <= hi+1; j++ {
		lo, hi = min(lo, s.ranges[j].lo), max(hi, s.ranges[j].hi)
	}
	s.ranges = slices.Replace(s.ranges, i, j, seqRange{lo, hi})
}

// formatSeqRanges writes ranges as the store keeps them: "lo-hi" or "seq", comma
// separated.
func formatSeqRanges(ranges []seqRange) string {
	var b strings.Builder
	for i, r := range ranges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(r.lo, 10))
		if r.hi != r.lo {
			b.WriteByte('-')
			b.WriteString(strconv.FormatUint(r.hi, 10))
		}
	}
	return b.String()
}

// parseSeqRanges reads what formatSeqRanges wrote.
func parseSeqRanges(s string) ([]seqRange, error) {
	if s == "" {
		return nil, nil
	}
	var out []seqRange
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		r, err := parseSeqRange(lo, hi, isRange)
		if err != nil {
			return nil, fmt.Errorf("sequence range %q: %w", part, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func parseSeqRange(lo, hi string, isRange bool) (seqRange, error) {
	l, err := strconv.ParseUint(lo, 10, 64)
	if err != nil {
		return seqRange{}, err
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(hi, 10, 64); err != nil {
			return seqRange{}, err
		}
	}
	if l == 0 || h < l {
		return seqRange{}, errors.New("not an ascending range of sequences")
	}
	return seqRange{l, h}, nil
}
