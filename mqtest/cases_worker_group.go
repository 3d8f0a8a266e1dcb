package mqtest

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
)

// Several Consumes sharing one durable.

func twoConsumesShareTheDurable(t *testing.T, h Harness) {
	e := setup(t, h)
	if !h.Caps.SharedConsumers {
		e.consume(mq.ConsumerConfig{}, e.ackEach)
		c, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
		if err == nil {
			var stop func()
			stop, _, err = c.Consume(e.ackEach, 16)
			if stop != nil {
				t.Cleanup(stop)
			}
		}
		assert.Error(t, err, "Caps.SharedConsumers is false, yet a second Consume of a running durable started")
		return
	}
	tenants := e.manyTenants(6)
	handleA, callsA := e.recorded(e.ackEach)
	handleB, callsB := e.recorded(e.ackEach)
	a := e.consume(mq.ConsumerConfig{}, handleA)
	cb, err := e.b.CreateConsumer(e.ctx, mq.ConsumerConfig{Durable: Durable})
	require.NoError(t, err, "create a second consumer of %s", Durable)
	stopB, _, err := cb.Consume(handleB, 16)
	require.NoError(t, err, "Caps.SharedConsumers is true, but a second Consume of a running durable was refused")
	t.Cleanup(stopB)

	const per = 3
	rounds := 0
	publishRound := func() {
		for i := range per {
			for _, id := range tenants {
				e.publish(topic(id, "t", ""), strconv.Itoa(rounds*per+i))
			}
		}
		rounds++
	}
	byWorker := map[string][]delivery{}
	handled := map[string]bool{} // tenant/data
	drain := func(what string) {
		t.Helper()
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for len(handled) < rounds*per*len(tenants) {
			var d delivery
			var worker string
			select {
			case d = <-callsA:
				worker = "A"
			case d = <-callsB:
				worker = "B"
			case <-timer.C:
				var missing []string
				for r := range rounds * per {
					for _, id := range tenants {
						if label := string(id) + "/" + strconv.Itoa(r); !handled[label] {
							missing = append(missing, label)
						}
					}
				}
				t.Fatalf("%s: %d of %d events handled, then nothing for %s; never handled: %q",
					what, len(handled), rounds*per*len(tenants), wait, missing)
			}
			byWorker[worker] = append(byWorker[worker], d)
			handled[string(d.topic.Tenant)+"/"+d.data] = true
			timer.Reset(wait)
		}
	}
	deadline := time.Now().Add(wait)
	for len(byWorker["A"]) == 0 || len(byWorker["B"]) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds only one Consume was handed events: %d and %d calls", rounds, len(byWorker["A"]), len(byWorker["B"]))
		}
		publishRound()
		drain("a round with both running")
	}
	publishRound()
	a.stop()
	stopped := time.Now()
	publishRound()
	drain("the rounds around the stop")

	var all []delivery
	for _, d := range byWorker["A"] {
		assert.False(t, d.start.After(stopped), "a call for %s %q began after its Consume's stop returned", d.topic.Tenant, d.data)
		all = append(all, d)
	}
	all = append(all, byWorker["B"]...)
	for _, id := range tenants {
		calls := callsOf(id, all)
		assertOneAtATime(t, calls, string(id))
		for i := 1; i < len(calls); i++ {
			prev, _ := strconv.Atoi(calls[i-1].data)
			cur, _ := strconv.Atoi(calls[i].data)
			assert.GreaterOrEqual(t, cur, prev, "tenant %s: event %d after event %d", id, cur, prev)
		}
	}
	if extra := len(all) - len(handled); extra > 0 {
		t.Logf("%d events, %d handled again", len(handled), extra)
	}
	if t.Failed() {
		worker := map[*mq.Message]string{}
		for w, ds := range byWorker {
			for _, d := range ds {
				worker[d.msg] = w
			}
		}
		for _, id := range tenants {
			for _, d := range callsOf(id, all) {
				t.Logf("%s %s at %s, attempt %d, %s to %s", id, d.data, worker[d.msg], d.msg.Attempt,
					d.start.Format(time.StampMicro), d.end.Format(time.StampMicro))
			}
		}
	}
}
