package mq_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/wavehouse/mq"
)

// Example is the quickstart: an embedded broker, one tenant, one event published and
// consumed by the ingest worker's durable.
func Example() {
	ctx := context.Background()

	dir, err := os.MkdirTemp("", "mq-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	broker, err := mq.NewEmbedded(ctx, mq.EmbeddedOptions{
		StoreDir: dir,
		Logger:   slog.New(slog.DiscardHandler), // keep the server's start-up lines quiet
	})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()

	// A tenant is refused (ErrQueueFull) until it has a byte budget.
	if err := broker.SetMaxBytes(ctx, "acme", 64<<20); err != nil {
		log.Fatal(err)
	}

	topic := mq.Topic{Tenant: "acme", Table: "orders", Scope: "eu"}
	if err := broker.Publish(ctx, topic, []byte(`{"order":1}`)); err != nil {
		log.Fatal(err)
	}

	// The ingest worker: one durable, every event at least once.
	consumer, err := broker.CreateConsumer(ctx, mq.ConsumerConfig{Durable: mq.WorkerDurable})
	if err != nil {
		log.Fatal(err)
	}
	received := make(chan string, 1)
	stop, failed, err := consumer.Consume(func(msg *mq.Message) error {
		// Write the event somewhere durable, then confirm the ack.
		if err := msg.DoubleAck(msg.Ctx); err != nil {
			return nil // unconfirmed, so it may come again; an error would also nak it
		}
		t := msg.Topic()
		received <- fmt.Sprintf("%s/%s/%s %s", t.Tenant, t.Table, t.Scope, msg.Data)
		return nil
	}, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	select {
	case line := <-received:
		fmt.Println(line)
	case err := <-failed:
		log.Fatal(err)
	case <-time.After(30 * time.Second):
		log.Fatal("no delivery")
	}

	if err := broker.Close(); err != nil { // Close is idempotent: the deferred one is a no-op
		log.Fatal(err)
	}
	// Output:
	// acme/orders/eu {"order":1}
}
