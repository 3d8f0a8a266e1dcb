package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wavehouse/mq"
)

// TestStatusOncePrintsPartitionsOwnersSourcesParkedCountsAndConsumers runs status
// --once against a live server with one worker holding every partition, an event it
// holds unacknowledged and one parked event, and checks each section of the table.
func TestStatusOncePrintsPartitionsOwnersSourcesParkedCountsAndConsumers(t *testing.T) {
	e := openEmbedded(t)
	parkEvents(t, e, "acme", "orders", 1)
	cons, err := e.CreateConsumer(t.Context(), mq.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *mq.Message, 1)
	stop, _, err := cons.Consume(func(m *mq.Message) error { held <- m; return nil }, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := e.Publish(t.Context(), mq.Topic{Tenant: "acme", Table: "orders"}, []byte("row")); err != nil {
		t.Fatal(err)
	}
	var m *mq.Message
	select {
	case m = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker was not given the event")
	}
	defer func() { _ = m.Ack() }()

	// The history copies the event asynchronously: status reads it once it is there.
	// Heartbeats come every second; the listen window gives room for a slow one.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := e.Status(t.Context(), mq.StatusOptions{ListenWorkers: time.Nanosecond})
		if err == nil && st.History.Messages >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history never held the event: %+v, %v", st.History, err)
		}
	}
	code, stdout, stderr := runArgs(t, "status", "-url", e.ClientURL(), "-once", "-listen", "3s")
	if code != 0 {
		t.Fatalf("status: exit %d\nstderr:\n%s", code, stderr)
	}
	rows := map[string][]string{} // by first column, the last row wins
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	for _, want := range []string{"WH_INGEST_0", "HISTORY WH_HISTORY: 1 messages", "replays reach back ", "WH_INGEST_3  0  ", " ago", "durable"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status: no %q in\n%s", want, stdout)
		}
	}
	// acme's one event is on a single partition: one row shows it held by the worker,
	// unacknowledged, and the partition pinned to it.
	var holding []string
	for p := range 4 {
		if f := rows[strconv.Itoa(p)]; len(f) >= 9 && f[5] == "1" {
			holding = f
		}
	}
	if holding == nil || !strings.HasPrefix(holding[7], "mq-embedded/") || holding[8] == "-" {
		t.Errorf("status: no partition with one event ack pending, owned by the worker and pinned:\n%s", stdout)
	}
	if f := rows["acme"]; len(f) != 2 || f[1] != "1" {
		t.Errorf("status: acme's parked count is not 1:\n%s", stdout)
	}
	if strings.Contains(stdout, "(no worker heard)") {
		t.Errorf("status: the worker was not heard:\n%s", stdout)
	}
	if strings.Contains(stdout, clearScreen) {
		t.Errorf("status -once redrew the screen:\n%q", stdout)
	}
}
