package mq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PurgeAcked trims each tenant's history: the partitions already drop an event once
// the worker acknowledged it (interest retention), so what stays to reclaim is the
// history's copy. For each tenant with events in the history it removes those stored
// before min(the tenant's cutoff, the time of its first event the worker has not
// acknowledged); a tenant absent from olderThan has a cutoff of now.
func (e *EmbeddedNATS) PurgeAcked(ctx context.Context, consumer string, olderThan map[TenantID]time.Time) (bool, error) {
	if err := e.opened(); err != nil {
		return false, err
	}
	if ctx == nil {
		return false, errNilContext("purge acked")
	}
	if err := e.core.checkOpen(); err != nil {
		return false, err
	}
	durable, err := e.topo.durableFor(consumer)
	if err != nil {
		return false, fmt.Errorf("purge acked: %w", err)
	}
	if err := validCutoffs(olderThan); err != nil {
		return false, err
	}
	hist, err := e.js.Stream(ctx, e.topo.HistoryStream)
	if err != nil {
		return false, e.core.mapRequestError("purge acked: stream "+e.topo.HistoryStream, err)
	}
	info, err := hist.Info(ctx, jetstream.WithSubjectFilter(e.subs.ingestAll()))
	if err != nil {
		return false, e.core.mapRequestError("purge acked: stream "+e.topo.HistoryStream, err)
	}
	tenants := make(map[TenantID]bool)
	for subject := range info.State.Subjects {
		if key, ok := e.subs.key(subject); ok {
			if t, err := ParseTopicKey(key); err == nil {
				tenants[t.Tenant] = true
			}
		}
	}
	now := time.Now()
	purged := false
	var errs []error
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		cutoff, ok := olderThan[t]
		if !ok {
			cutoff = now
		}
		did, err := e.purgeTenant(ctx, hist, durable, t, cutoff)
		if err != nil {
			errs = append(errs, fmt.Errorf("purge acked: tenant %s: %w", t, err))
		}
		purged = purged || did
	}
	return purged, errors.Join(errs...)
}

// validCutoffs refuses a cutoff map with a key that is not a tenant: that key was meant
// for some tenant, which would otherwise purge as if absent.
func validCutoffs(olderThan map[TenantID]time.Time) error {
	for _, t := range slices.Sorted(maps.Keys(olderThan)) {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("purge acked: a cutoff's tenant: %w", err)
		}
	}
	return nil
}

// purgeTenant removes tenant's history copies stored before cutoff, and never the
// copy of an event its partition still holds above the durable's ack floor: copies
// arrive in partition order, each naming its original's sequence, so the first such
// copy is found by a binary search over the tenant's copies.
func (e *EmbeddedNATS) purgeTenant(ctx context.Context, hist jetstream.Stream, durable string, t TenantID, cutoff time.Time) (bool, error) {
	name := e.topo.PartitionStream(Partition(t, e.topo.Partitions))
	part, err := e.js.Stream(ctx, name)
	if err != nil {
		return false, e.core.mapRequestError("stream "+name, err)
	}
	cons, err := part.Consumer(ctx, durable)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return false, fmt.Errorf("%w: %s on stream %s", ErrConsumerNotFound, durable, name)
		}
		return false, e.core.mapRequestError("consumer "+durable+" on stream "+name, err)
	}
	filter := e.subs.tenantIngest(t)
	// Never purge past what the history held when this began: a copy arriving
	// meanwhile may be of an event nobody acknowledged yet.
	bound := hist.CachedInfo().State.LastSeq + 1
	first, err := hist.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, e.core.mapRequestError("stream "+e.topo.HistoryStream+": first event", err)
	}
	keep, err := e.firstStoredAtOrAfter(ctx, filter, cutoff)
	if err != nil {
		return false, err
	}
	unacked, err := part.GetMsg(ctx, cons.CachedInfo().AckFloor.Stream+1, jetstream.WithGetMsgSubject(filter))
	switch {
	case err == nil:
		held, err := firstCopyOf(ctx, hist, filter, name, unacked.Sequence)
		if err != nil {
			return false, e.core.mapRequestError("stream "+e.topo.HistoryStream+": find the first unacknowledged copy", err)
		}
		if held > 0 && (keep == 0 || held < keep) {
			keep = held
		}
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return false, e.core.mapRequestError("stream "+name+": first unacknowledged event", err)
	}
	if keep == 0 || keep > bound {
		keep = bound
	}
	if keep <= first.Sequence {
		return false, nil
	}
	if err := hist.Purge(ctx, jetstream.WithPurgeSubject(filter), jetstream.WithPurgeSequence(keep)); err != nil {
		return false, e.core.mapRequestError("stream "+e.topo.HistoryStream+": purge", err)
	}
	e.log.Debug("mq: purged acknowledged history", "tenant", t, "below_seq", keep, "cutoff", cutoff)
	return true, nil
}

// firstCopyOf returns the history sequence of the first copy matching filter whose
// original on partition stream has a sequence of at least partSeq, or 0 when there is
// none yet.
func firstCopyOf(ctx context.Context, hist jetstream.Stream, filter, stream string, partSeq uint64) (uint64, error) {
	lo, hi := uint64(1), hist.CachedInfo().State.LastSeq+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := hist.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, err
		}
		if src, ok := sourceSeq(m.Header.Get(streamSourceHeader), stream); !ok || src >= partSeq {
			hi = mid
		} else {
			lo = m.Sequence + 1
		}
	}
	m, err := hist.GetMsg(ctx, lo, jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// sourceSeq reads the original's sequence from a sourced copy's Nats-Stream-Source
// header, "<stream> <seq> <filter> <transform>".
func sourceSeq(header, stream string) (uint64, bool) {
	fields := strings.Fields(header)
	if len(fields) < 2 || fields[0] != stream { // WH_INGEST_1 is a prefix of WH_INGEST_10
		return 0, false
	}
	seq, err := strconv.ParseUint(fields[1], 10, 64)
	return seq, err == nil
}

// firstStoredAtOrAfter returns the history sequence of the first event matching filter
// stored at or after at, or 0 when there is none. A time outside what a stored time can
// be never reaches the server, which would wrap it around (see storedtime.go).
func (e *EmbeddedNATS) firstStoredAtOrAfter(ctx context.Context, filter string, at time.Time) (uint64, error) {
	if afterAnyStored(at) {
		return 0, nil
	}
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     filter,
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &at,
		InactiveThreshold: ephemeralInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if beforeAnyStored(at) {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverAllPolicy, nil
	}
	cons, err := e.js.CreateConsumer(ctx, e.topo.HistoryStream, cfg)
	if err != nil {
		return 0, e.core.mapRequestError("stream "+e.topo.HistoryStream+": find cutoff", err)
	}
	defer e.core.deleteConsumer(e.topo.HistoryStream, cons.CachedInfo().Name)
	if cons.CachedInfo().NumPending == 0 {
		return 0, nil
	}
	m, err := cons.Next(jetstream.FetchMaxWait(replayPullWait))
	if err != nil {
		return 0, e.core.mapRequestError("stream "+e.topo.HistoryStream+": find cutoff", err)
	}
	meta, err := deliveryOf(m)
	if err != nil {
		return 0, err
	}
	return meta.streamSeq, nil
}

// streamSourceHeader is the header a sourced copy carries naming its original.
const streamSourceHeader = "Nats-Stream-Source"
