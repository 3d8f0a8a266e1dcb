package mq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// The workers' group: every Consume without a static claim is a member. Members say
// which partitions they hold in a heartbeat on a core NATS subject, and each computes
// the same spread of the partitions over the live members, so each takes its share and
// gives up what is no longer its own. The heartbeats only balance: exclusivity is the
// server's, since the ingest durable pins each partition to one puller at a time.
//
// A partition changes hands in order. A member gives one up by handing back all it
// holds of it, in sequence order, and then unpinning it; the next owner takes it once
// a heartbeat shows it released. A member that falls silent for MemberTimeout is gone;
// its partitions are taken at once when nothing of them is unsettled, or else one ack
// wait after its last possible delivery, when every event it held has come back to the
// server ahead of anything later of its tenants.

// beat is one member's heartbeat.
type beat struct {
	ID string `json:"id"`
	// Name is the connection's name, so an operator's status view (mqctl status)
	// shows the host, not only the id.
	Name    string `json:"name,omitempty"`
	Owned   []int  `json:"owned,omitempty"`
	Claim   []int  `json:"claim,omitempty"` // a static claim: never spread to others
	Leaving bool   `json:"leaving,omitempty"`
	// Unsettled are partitions this member gave up with events delivered to it that
	// never arrived: the others take them as orphans, not as released.
	Unsettled []int `json:"unsettled,omitempty"`
}

// peer is what a member knows of another.
type peer struct {
	beat
	seen time.Time
}

// group is one member's view, driving its dispatcher.
type group struct {
	d       *dispatcher
	subject string
	self    string
	timeout time.Duration

	mu        sync.Mutex
	peers     map[string]*peer
	owned     map[int]bool      // taken by this member, pull running
	moving    map[int]bool      // being taken or given up
	released  map[int]bool      // seen given up cleanly, since last taken
	orphaned  map[int]time.Time // held by a member that fell silent, since then
	unsettled map[int]bool      // given up by this member with events unsettled (beat.Unsettled)
	sub       *nats.Subscription
	end       chan struct{}
	ended     chan struct{}
	wg        sync.WaitGroup
	haltOnce  sync.Once
	leaveOnce sync.Once
	echoed    atomic.Bool // heard its own heartbeat
	// ticked is when the loop last beat; stalls are the recent times this process did
	// not run, oldest first (see silent). Both under mu.
	ticked time.Time
	stalls []stall
}

// stall is a time this process did not run.
type stall struct{ from, to time.Time }

// maxStalls is how many stalls a member remembers: enough for a member timeout of a
// machine that starves it again and again.
const maxStalls = 16

func newGroup(d *dispatcher, subject string, timeout time.Duration) *group {
	return &group{
		d: d, subject: subject, self: nuid.Next(), timeout: timeout,
		peers: map[string]*peer{}, owned: map[int]bool{}, moving: map[int]bool{},
		released: map[int]bool{}, orphaned: map[int]time.Time{}, unsettled: map[int]bool{},
		end: make(chan struct{}), ended: make(chan struct{}), ticked: time.Now(),
	}
}

// silent reports whether peer p has said nothing for longer than the member timeout,
// counting only the time this process ran. A process that did not run (a paused VM or
// container, a SIGSTOP, a starved machine) heard nobody meanwhile: that silence says
// nothing of the others, and taking their partitions for it had two workers run one
// tenant's events at once (a probe saw it, pausing every worker of a group at once).
// Only the time lost is discounted, so a member that stalls again and again still
// takes a dead peer's partitions once it ran a member timeout. Called with g.mu held.
func (g *group) silent(p *peer, now time.Time) bool {
	quiet := now.Sub(p.seen)
	for _, s := range g.stalls {
		if from, to := later(s.from, p.seen), earlier(s.to, now); to.After(from) {
			quiet -= to.Sub(from)
		}
	}
	return quiet > g.timeout
}

// noteStall records the time lost when the loop's beat is late by more than half its
// interval (the process did not run from when the beat was due until now), or when the
// connection is down (nothing was heard since the last beat). Asked at
// every rebalance, not only at the loop's: a heartbeat heard after the stall may
// rebalance before the loop's late beat, which then extends the same stall. Called
// with g.mu held.
func (g *group) noteStall(now time.Time) {
	due := g.ticked.Add(g.interval())
	nc := g.d.core.nc
	connected := nc == nil || nc.IsConnected() // nil: a unit test's group
	if !connected {
		// Cut off: nobody was heard since the last beat either.
		due = g.ticked
	} else if now.Sub(due) <= g.interval()/2 {
		return
	}
	if n := len(g.stalls); n > 0 && !g.stalls[n-1].to.Before(due) {
		g.stalls[n-1].to = later(g.stalls[n-1].to, now)
		return
	}
	if lost := now.Sub(due); lost > stallSlack && connected {
		g.d.core.log.Warn("mq: the worker did not run for a while; the others' silence meanwhile does not count against them",
			"stalled", lost.Round(time.Millisecond))
	}
	g.stalls = append(g.stalls, stall{from: due, to: now})
	if len(g.stalls) > maxStalls {
		g.stalls = slices.Delete(g.stalls, 0, 1)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// join starts hearing the others and beating. The first spread waits joinWait, so a
// member that joins hears the others (they answer a newcomer at once) before it takes
// anything; a static claim takes its partitions itself and only beats.
func (g *group) join() error {
	sub, err := g.d.core.nc.Subscribe(g.subject, g.hear)
	if err != nil {
		return g.d.core.mapRequestError("consume: join the workers on "+g.subject, err)
	}
	g.sub = sub
	g.send(false)
	go g.loop()
	return nil
}

// joinWait is how long a joining member listens before its first spread: the others
// answer its first heartbeat at once, over loopback or a LAN within milliseconds. One
// it missed is heard at the next beat, and until then the partition's pin keeps the two
// from both consuming it.
const joinWait = 200 * time.Millisecond

func (g *group) interval() time.Duration { return g.timeout / 3 }

func (g *group) loop() {
	defer close(g.ended)
	first := time.NewTimer(min(joinWait, g.interval()))
	defer first.Stop()
	tick := time.NewTicker(g.interval())
	defer tick.Stop()
	for {
		select {
		case <-g.end:
			return
		case <-first.C:
			if !g.echoed.Load() {
				// Its own heartbeat did not come back: the others cannot hear it
				// either, and each would take every partition for itself.
				g.d.core.log.Error("mq: the worker does not hear its own heartbeat; several workers would consume the same partitions. "+
					"Check that the user may publish and subscribe to the subject", "subject", g.subject)
			}
			g.rebalance()
			continue
		case <-tick.C:
		}
		g.send(false)
		g.rebalance()
		g.mu.Lock()
		g.ticked = time.Now()
		g.mu.Unlock()
	}
}

// hear files another member's heartbeat; a member it did not know yet hears this one's
// at once, so a joining member learns the group within a round trip.
func (g *group) hear(m *nats.Msg) {
	var b beat
	if err := json.Unmarshal(m.Data, &b); err != nil || b.ID == "" {
		return
	}
	if b.ID == g.self {
		g.echoed.Store(true)
		return
	}
	g.mu.Lock()
	old := g.peers[b.ID]
	if b.Leaving {
		delete(g.peers, b.ID)
	} else {
		g.peers[b.ID] = &peer{beat: b, seen: time.Now()}
	}
	if old != nil {
		for _, p := range old.Owned {
			switch {
			case slices.Contains(b.Owned, p):
			case slices.Contains(b.Unsettled, p):
				if _, ok := g.orphaned[p]; !ok {
					g.orphaned[p] = time.Now()
				}
				delete(g.released, p)
			default:
				g.released[p] = true
				delete(g.orphaned, p)
			}
		}
	}
	for _, p := range b.Owned {
		delete(g.released, p) // held again: a release seen earlier no longer counts
	}
	newcomer := old == nil && !b.Leaving
	g.mu.Unlock()
	if newcomer {
		g.send(false)
	}
	if b.Leaving || newcomer || (old != nil && !slices.Equal(old.Owned, b.Owned)) {
		go g.rebalance()
	}
}

// send publishes this member's heartbeat.
func (g *group) send(leaving bool) {
	g.mu.Lock()
	b := beat{ID: g.self, Name: g.d.core.nc.Opts.Name, Leaving: leaving, Claim: g.d.policy.claim}
	for p := range g.owned {
		b.Owned = append(b.Owned, p)
	}
	for p := range g.unsettled {
		b.Unsettled = append(b.Unsettled, p)
	}
	g.mu.Unlock()
	slices.Sort(b.Owned)
	slices.Sort(b.Unsettled)
	data, err := json.Marshal(b)
	if err == nil {
		_ = g.d.core.nc.Publish(g.subject, data)
	}
}

// spread is the partitions this member should hold: those no live static claim
// holds, dealt round-robin over the live members in id order.
func (g *group) spread(now time.Time) []int {
	claimed := map[int]bool{}
	members := []string{g.self}
	for id, p := range g.peers {
		if g.silent(p, now) {
			continue
		}
		for _, q := range p.Claim {
			claimed[q] = true
		}
		if p.Claim == nil {
			members = append(members, id)
		}
	}
	slices.Sort(members)
	me := slices.Index(members, g.self)
	var mine []int
	i := 0
	for p := range g.d.core.partitions {
		if claimed[p] {
			continue
		}
		if i%len(members) == me {
			mine = append(mine, p)
		}
		i++
	}
	return mine
}

// rebalance gives up what is no longer this member's and takes what is, once its
// previous holder let it go.
func (g *group) rebalance() {
	if g.d.isOver() || g.d.policy.claim != nil {
		return
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.end: // halted: halt waits only for what started before
		return
	default:
	}
	g.noteStall(now)
	heldBy := map[int]bool{} // partitions a live member says it holds
	for id, p := range g.peers {
		if g.silent(p, now) {
			for _, q := range p.Owned {
				if _, ok := g.orphaned[q]; !ok {
					g.orphaned[q] = p.seen
				}
			}
			delete(g.peers, id)
			continue
		}
		for _, q := range p.Owned {
			heldBy[q] = true
		}
	}
	want := g.spread(now)
	var give, take []int
	for p := range g.owned {
		if !slices.Contains(want, p) && !g.moving[p] {
			give = append(give, p)
		}
	}
	var orphans, unknown []int
	for _, p := range want {
		if g.owned[p] || g.moving[p] || heldBy[p] {
			continue
		}
		if _, ok := g.orphaned[p]; ok && !g.released[p] {
			orphans = append(orphans, p)
			continue
		}
		if !g.released[p] {
			unknown = append(unknown, p)
			continue
		}
		take = append(take, p)
	}
	for _, p := range append(append(append(give, take...), orphans...), unknown...) {
		g.moving[p] = true
	}
	for _, p := range unknown {
		g.wg.Go(func() { g.takeUnpinned(p) })
	}
	since := maps.Clone(g.orphaned)
	for _, p := range give {
		g.wg.Go(func() { g.giveUp(p) })
	}
	for _, p := range take {
		// Seen released, yet checked as one never seen: the member that took it
		// next may have died before a heartbeat said so, holding its events.
		g.wg.Go(func() { g.takeUnpinned(p) })
	}
	for _, p := range orphans {
		g.wg.Go(func() {
			if g.settledSince(p, since[p], now) {
				g.unpinSilent(p)
				g.takeUp(p)
				return
			}
			g.mu.Lock()
			delete(g.moving, p)
			g.mu.Unlock()
		})
	}
}

// settledSince reports whether partition p, orphaned since then, may be taken now:
// nothing of it is unsettled, or every event the silent member held has come back to
// the server's redelivery queue, ahead of everything later of its tenants. It asks the
// server, bounded.
//
// since is the silent member's last heartbeat, and it went on pulling after that beat:
// one ack wait from since is not enough (an event delivered just before it died was
// then still pending, and the next owner got its tenant's later events first). The
// bound is one ack wait after its last possible delivery: the member timeout after
// since on this member's clock, and, where the consumer's leader knows it, the
// server's own time of its last delivery on the server's clock. redeliverySlack covers
// the server's timer, which moves expired events to the redelivery queue.
func (g *group) settledSince(p int, since, now time.Time) bool {
	c := g.d.core
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(ctx, c.partitions[p], g.d.durable)
	if err != nil {
		return false
	}
	info := cons.CachedInfo()
	if info.NumAckPending == 0 {
		return true
	}
	wait := info.Config.AckWait + redeliverySlack
	if now.Sub(since) <= g.timeout+wait {
		return false
	}
	last := info.Delivered.Last
	return last == nil || info.TimeStamp.Sub(*last) > wait
}

// redeliverySlack is how long after an event's ack wait ran out the server may take
// to queue it for redelivery: its pending timer fires at the deadline, and backs off
// 100 ms while acks are arriving.
const redeliverySlack = 500 * time.Millisecond

// unpinSilent frees partition p from the pin of the member that fell silent, rather
// than wait out the durable's pinned TTL (measured: 15 s by default). It is safe
// because settledSince holds: nothing the silent member held can still be unsettled.
func (g *group) unpinSilent(p int) {
	c := g.d.core
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.partitions[p])
	if err == nil {
		err = stream.UnpinConsumer(ctx, g.d.durable, c.topo.IngestGroup)
	}
	if err != nil {
		c.log.Debug("mq: cannot unpin a silent worker's partition; its pinned TTL frees it", "stream", c.partitions[p], "error", err)
	}
}

// takeUnpinned takes partition p, which no live member holds: one this member never
// saw let go (it joined later, or the whole group restarted), or one it saw released,
// which another member may have taken since and died holding before its heartbeat
// said so (measured: a partition moved from a killed worker in 8 ms, and the events
// it held came an ack wait later, behind their tenants' later ones). A pin the server
// still keeps while no live member holds p means a worker died holding it: the pin
// outlives it by the pinned TTL. With events of it unsettled, p is then an orphan from
// now, taken once an ack wait passed, so the dead worker's events come back ahead of
// their tenants' later ones.
func (g *group) takeUnpinned(p int) {
	c := g.d.core
	ctx, cancel := context.WithTimeout(context.Background(), c.topo.PublishTimeout)
	defer cancel()
	cons, err := c.js.Consumer(ctx, c.partitions[p], g.d.durable)
	if err == nil && cons.CachedInfo().NumAckPending > 0 {
		for _, pg := range cons.CachedInfo().PriorityGroups {
			if pg.PinnedClientID != "" {
				g.mu.Lock()
				if _, ok := g.orphaned[p]; !ok {
					g.orphaned[p] = time.Now()
				}
				delete(g.moving, p)
				g.mu.Unlock()
				return
			}
		}
	}
	g.takeUp(p)
}

func (g *group) takeUp(p int) {
	err := g.d.take(p)
	g.mu.Lock()
	delete(g.moving, p)
	if err == nil {
		g.owned[p] = true
		delete(g.unsettled, p)
		delete(g.released, p)
		delete(g.orphaned, p)
	}
	g.mu.Unlock()
	switch {
	case errors.Is(err, ErrConsumerNotFound):
		// The durable is gone: the delivery ends, as it does when a running pull
		// learns of it.
		g.d.ended(fmt.Errorf("%w: stream %s consumer %s: %w: %w", ErrDeliveryEnded,
			g.d.core.partitions[p], g.d.durable, jetstream.ErrConsumerDeleted, err))
	case errors.Is(err, ErrClosed): // stopped meanwhile
	case err != nil:
		g.d.core.log.Warn("mq: cannot take a partition; trying again", "stream", g.d.core.partitions[p], "error", err)
	default:
		g.send(false)
	}
}

func (g *group) giveUp(p int) {
	g.d.give(p)
	g.mu.Lock()
	delete(g.moving, p)
	delete(g.owned, p)
	g.mu.Unlock()
	g.send(false)
}

// noteUnsettled marks partition p, just given up, as one the others must take as an
// orphan: the heartbeats say so until this member takes it again.
func (g *group) noteUnsettled(p int) {
	g.mu.Lock()
	g.unsettled[p] = true
	g.mu.Unlock()
}

// halt stops the spreading and waits for the takes and give-ups under way, so the
// dispatcher's stop sees every partition this member took.
func (g *group) halt() {
	g.haltOnce.Do(func() {
		g.mu.Lock()
		close(g.end)
		g.mu.Unlock()
		<-g.ended
		g.wg.Wait()
	})
}

// leave ends the membership once the dispatcher handed everything back: a last
// heartbeat says so, and the others take the partitions at once.
func (g *group) leave() {
	g.halt()
	g.leaveOnce.Do(func() {
		if g.sub != nil {
			_ = g.sub.Unsubscribe()
		}
		g.mu.Lock()
		clear(g.owned)
		g.mu.Unlock()
		g.send(true)
		ctx, cancel := context.WithTimeout(context.Background(), g.d.core.topo.PublishTimeout)
		defer cancel()
		_ = g.d.core.nc.FlushWithContext(ctx)
	})
}
