package main

import (
	"context"
	"fmt"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "manifests",
		summary: "print the NACK Stream and Consumer resources of the NATS topology (deployments/nats/jetstream.yaml)",
		usage:   "[-partitions n] [-replicas n] [-prefix p] [-history name] [-history-max-age d] [-ingest-consumer name] [-ingest-group name]",
		run:     runManifests,
	})
	register(command{
		name:    "permissions",
		summary: "print the permissions block of the restricted application user for the NATS Helm values",
		usage:   "[-prefix p] [-history name] [-ingest-consumer name]",
		run:     runPermissions,
	})
}

func runManifests(_ context.Context, e *env, args []string) int {
	c := commands["manifests"]
	fs := c.flags(e)
	var topo mq.NATSTopology
	fs.IntVar(&topo.Partitions, "partitions", 4, "ingest partitions `n`")
	fs.IntVar(&topo.Replicas, "replicas", 3, "replicas of every stream")
	fs.StringVar(&topo.Prefix, "prefix", "wh", "subject prefix, one token of [a-z0-9_-]")
	fs.StringVar(&topo.HistoryStream, "history", "", "history stream name (default <PREFIX>_HISTORY)")
	fs.StringVar(&topo.IngestConsumer, "ingest-consumer", "", "the ingest durable (default INGEST)")
	fs.StringVar(&topo.IngestGroup, "ingest-group", "", "the priority group the workers pull the durable in (default ingest)")
	fs.DurationVar(&topo.HistoryMaxAge, "history-max-age", mq.NATSTopology{}.WithDefaults().HistoryMaxAge,
		"how long the history keeps events: at least the longest gap the application replays")
	if code := parse(fs, args); code >= 0 {
		return code
	}
	// Zero is the library's "default": given on the command line it is a mistake.
	if topo.Partitions < 1 || topo.Replicas < 1 || topo.HistoryMaxAge <= 0 {
		fmt.Fprintf(e.stderr, "mqctl manifests: -partitions %d and -replicas %d must each be at least 1, -history-max-age %s more than 0\n",
			topo.Partitions, topo.Replicas, topo.HistoryMaxAge)
		return 2
	}
	if err := mq.WriteNATSManifests(e.stdout, topo); err != nil {
		fmt.Fprintf(e.stderr, "mqctl manifests: %v\n", err)
		return 2
	}
	return 0
}

func runPermissions(_ context.Context, e *env, args []string) int {
	c := commands["permissions"]
	fs := c.flags(e)
	var topo mq.NATSTopology
	fs.StringVar(&topo.Prefix, "prefix", "wh", "subject prefix, one token of [a-z0-9_-]")
	fs.StringVar(&topo.HistoryStream, "history", "", "history stream name (default <PREFIX>_HISTORY)")
	fs.StringVar(&topo.IngestConsumer, "ingest-consumer", "", "the ingest durable (default INGEST)")
	if code := parse(fs, args); code >= 0 {
		return code
	}
	if err := mq.WriteNATSPermissions(e.stdout, topo); err != nil {
		fmt.Fprintf(e.stderr, "mqctl permissions: %v\n", err)
		return 2
	}
	return 0
}
