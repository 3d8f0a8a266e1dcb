package mq

import (
	"fmt"
	"sync"
)

// budgets enforces per-tenant byte budgets over the shared partitions. A tenant's
// backlog is the size of its events stored and not yet acknowledged through the ingest
// durable. Events are held under their message id from before they are sent until they
// are acknowledged, so an ack that overtakes the publish's answer, or a duplicate
// publish, never counts twice.
type budgets struct {
	mu   sync.Mutex
	max  map[TenantID]budgetLimit
	used map[TenantID]int64
	held map[string]heldEvent
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

type heldEvent struct {
	tenant TenantID
	size   int64
}

func newBudgets() *budgets {
	return &budgets{
		max: map[TenantID]budgetLimit{}, used: map[TenantID]int64{}, held: map[string]heldEvent{},
		doubted: map[TenantID]bool{},
	}
}

// eventSize is what an event counts against its tenant's budget: subject, user
// headers and data. It is computed alike at publish and when the backlog is rebuilt.
func eventSize(subject string, h Headers, dataLen int) int64 {
	return int64(len(subject) + headerSize(h) + dataLen)
}

// reserve holds size bytes of tenant's budget for the event with message id. It
// reports false with no error when id is already held (a repeated publish).
func (b *budgets) reserve(tenant TenantID, id string, size int64) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, dup := b.held[id]; dup {
		return false, nil
	}
	limit, ok := b.max[tenant]
	if !ok {
		return false, fmt.Errorf("%w: tenant %s has no byte budget (SetMaxBytes opens it)", ErrQueueFull, tenant)
	}
	if used := b.used[tenant]; used+size > limit.n {
		return false, fmt.Errorf("%w: tenant %s: %d bytes queued + %d exceeds its budget of %d",
			ErrQueueFull, tenant, used, size, limit.n)
	}
	b.holdLocked(id, heldEvent{tenant: tenant, size: size})
	return true, nil
}

// restore counts a stored event without checking the budget: a backlog rebuilt from
// disk.
func (b *budgets) restore(id string, ev heldEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdLocked(id, ev)
}

func (b *budgets) holdLocked(id string, ev heldEvent) {
	if _, dup := b.held[id]; dup {
		return
	}
	b.held[id] = ev
	b.used[ev.tenant] += ev.size
}

// release stops counting the event with message id; releasing twice is harmless.
func (b *budgets) release(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev, ok := b.held[id]
	if !ok {
		return
	}
	delete(b.held, id)
	b.used[ev.tenant] -= ev.size
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
