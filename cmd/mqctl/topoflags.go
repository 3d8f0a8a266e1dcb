package main

import (
	"flag"
	"fmt"

	"github.com/wavehouse/mq"
)

// topologyFlags are the flags naming and sizing the NATS topology, bound once here so
// every command that takes them takes the same names, defaults and checks: the one
// command line then generates a topology's resources (manifests), grants its user
// (permissions) and checks a cluster against it. Which of them a command reads is the
// command's business; a value none could work with is refused by all alike.
type topologyFlags struct {
	topo     *mq.NATSTopology
	replicas bool
}

// addTopologyFlags registers the topology flags on fs, writing into topo; -replicas
// only with replicas, for the commands that write the streams' configuration.
func addTopologyFlags(fs *flag.FlagSet, topo *mq.NATSTopology, replicas bool) *topologyFlags {
	fs.IntVar(&topo.Partitions, "partitions", 4, fmt.Sprintf("ingest partitions `n` the application runs (at most %d)", mq.MaxPartitions))
	if replicas {
		fs.IntVar(&topo.Replicas, "replicas", 3, "replicas of every stream")
	}
	fs.StringVar(&topo.Prefix, "prefix", "wh", "subject prefix, one token of [a-z0-9_-]")
	fs.StringVar(&topo.HistoryStream, "history", "", "history stream name (default <PREFIX>_HISTORY)")
	fs.StringVar(&topo.IngestConsumer, "ingest-consumer", "", "the ingest durable (default INGEST)")
	fs.StringVar(&topo.IngestGroup, "ingest-group", "", "the priority group the workers pull the durable in (default ingest)")
	fs.DurationVar(&topo.HistoryMaxAge, "history-max-age", mq.NATSTopology{}.WithDefaults().HistoryMaxAge,
		"the longest gap the application replays from the history: manifests keep events that long, check reports a shorter max_age")
	return &topologyFlags{topo: topo, replicas: replicas}
}

// problem names a value given that the library would read as "the default" (a zero),
// which on the command line is a mistake; "" when there is none. What the library
// refuses on its own (see NATSTopology.Validate) it reports itself.
func (f *topologyFlags) problem() string {
	switch {
	case f.topo.Partitions < 1:
		return fmt.Sprintf("-partitions %d: must be at least 1", f.topo.Partitions)
	case f.replicas && f.topo.Replicas < 1:
		return fmt.Sprintf("-replicas %d: must be at least 1", f.topo.Replicas)
	case f.topo.HistoryMaxAge <= 0:
		return fmt.Sprintf("-history-max-age %s: must be more than 0", f.topo.HistoryMaxAge)
	}
	return ""
}
