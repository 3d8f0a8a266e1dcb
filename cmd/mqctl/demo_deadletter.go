package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/wavehouse/mq"
)

// The dead letters: the broker's counts per tenant and table, and the parked events
// themselves, read back from the dead-letter stream to show why the policy parked
// the poison event.

// demoDeadLetters is what the dead-letter step read.
type demoDeadLetters struct {
	counts map[mq.TenantID]mq.DeadLetterCounts
	stream string // the dead-letter stream's name
	parked []parkedEvent
}

// parkedEvent is one event on the dead-letter stream, with the headers the poison
// policy adds (mq.HeaderDead*).
type parkedEvent struct {
	subject  string
	topic    mq.Topic
	stored   time.Time
	demoID   string // X-Demo-Id, as published
	reason   string
	lastErr  string
	attempts string
	part     string
	sequence string
	first    string
	last     string
}

// deadLetters counts every tenant's parked events and reads the parked events back.
func (d *demoRun) deadLetters(ctx context.Context) (demoDeadLetters, error) {
	dl := demoDeadLetters{counts: map[mq.TenantID]mq.DeadLetterCounts{}, stream: d.topo.DeadLetterStream()}
	for _, t := range demoTenants {
		c, err := d.broker.DeadLetterCounts(ctx, t, "")
		if err != nil {
			return dl, fmt.Errorf("dead-letter counts %s: %w", t, err)
		}
		dl.counts[t] = c
	}
	poison := d.plan.poison
	narrowed, err := d.broker.DeadLetterCounts(ctx, poison.Tenant, poison.Table)
	if err != nil {
		return dl, fmt.Errorf("dead-letter counts %s %s: %w", poison.Tenant, poison.Table, err)
	}
	d.check(fmt.Sprintf("dead-lettered %s/%s (table filter)", poison.Tenant, poison.Table), narrowed.Tables[poison.Table], 1)
	for _, t := range demoTenants {
		want := map[string]uint64{}
		if t == poison.Tenant {
			want[poison.Table] = 1
		}
		d.check("dead-lettered "+string(t)+" per table", formatCounts(dl.counts[t].Tables), formatCounts(want))
		d.check("dead-lettered "+string(t)+" total", dl.counts[t].Total, uint64(len(want)))
	}
	d.printf("parked: %s", formatTotals(dl.counts))

	dl.parked, err = readParked(ctx, d.broker.ClientURL(), d.topo)
	if err != nil {
		return dl, fmt.Errorf("read the dead-letter stream %s: %w", dl.stream, err)
	}
	for _, p := range dl.parked {
		d.printf("read back from %s: %s (%s), reason %s after %s attempts: %s",
			dl.stream, p.demoID, p.subject, p.reason, p.attempts, p.lastErr)
	}
	return dl, nil
}

// readParked reads every event on the dead-letter stream, oldest first.
//
// EmbeddedNATS has no reader of parked events yet, so this one reads the stream
// itself, with a nats.go connection of its own to the embedded server's listener: the
// stream is topo.DeadLetterStream(), and an event parked from topic key K is on
// subject "<prefix>.dlq.K". Demo-only: a host would wait for the library's reader.
func readParked(ctx context.Context, url string, topo mq.NATSTopology) ([]parkedEvent, error) {
	if url == "" {
		return nil, errors.New("the embedded broker has no listener")
	}
	nc, err := nats.Connect(url, nats.Name("mqctl-demo-dead-letter-reader"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, topo.DeadLetterStream())
	if err != nil {
		return nil, err
	}
	state := stream.CachedInfo().State
	var parked []parkedEvent
	for seq := state.FirstSeq; state.Msgs > 0 && seq <= state.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // a gap the stream's limits left
		}
		if err != nil {
			return parked, fmt.Errorf("message %d: %w", seq, err)
		}
		p := parkedEvent{
			subject: m.Subject, stored: m.Time, demoID: m.Header.Get("X-Demo-Id"),
			reason: m.Header.Get(mq.HeaderDeadReason), lastErr: m.Header.Get(mq.HeaderDeadError),
			attempts: m.Header.Get(mq.HeaderDeadAttempts), part: m.Header.Get(mq.HeaderDeadPartition),
			sequence: m.Header.Get(mq.HeaderDeadSequence),
			first:    m.Header.Get(mq.HeaderDeadFirstAttempt), last: m.Header.Get(mq.HeaderDeadLastAttempt),
		}
		if key, ok := strings.CutPrefix(m.Subject, topo.Prefix+".dlq."); ok {
			p.topic, _ = mq.ParseTopicKey(key)
		}
		parked = append(parked, p)
	}
	return parked, nil
}

// checkParked adds the checks of what the dead-letter stream holds, under d.mu: the
// poison event alone, parked by the policy with why, and its tenant's later events
// written only after the park.
func (d *demoRun) checkParked(parked []parkedEvent) {
	poison := d.plan.poison
	d.check("events on the dead-letter stream", len(parked), 1)
	if len(parked) == 0 {
		return
	}
	p := parked[0]
	last := d.fleet.lastPoison()
	d.check("parked event (X-Demo-Id)", p.demoID, poison.id())
	d.check("parked topic", p.topic, poison.topic())
	d.check("parked reason ("+mq.HeaderDeadReason+")", p.reason, mq.DeadReasonHandlerFailed)
	d.check("parked last error ("+mq.HeaderDeadError+") is the last attempt's", p.lastErr == last.err && last.err != "", true)
	d.check("parked attempts ("+mq.HeaderDeadAttempts+")", p.attempts, demoPolicy.MaxDeliveries)
	d.check("parked partition ("+mq.HeaderDeadPartition+")", p.part, mq.Partition(poison.Tenant, d.topo.Partitions))
	d.check("parked sequence ("+mq.HeaderDeadSequence+")", p.sequence, strconv.FormatUint(last.sequence, 10))

	later, after := 0, 0
	for _, ev := range d.plan.events[poison.Tenant][poison.Seq:] {
		later++
		if at, ok := d.fleet.firstWrite[ev.id()]; ok && at.After(p.stored) {
			after++
		}
	}
	d.check(fmt.Sprintf("%s events after the poison, first written after its park", poison.Tenant), after, later)
}
