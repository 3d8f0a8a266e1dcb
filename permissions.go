package mq

import (
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// NATSPermissions are the subjects the restricted application user may publish to and
// subscribe on: everything the brokers do (publish, pull, ack and unpin the ingest
// durable, the workers' presence, dead letters, the hub and replay consumers on the
// history, stream and consumer info, reading and deleting single parked events) and nothing that changes the topology.
// A permission names a stream, not the kind of consumer: the user may create and delete
// any consumer on the history, so other readers of it belong on a mirror.
type NATSPermissions struct {
	PublishAllow   []string
	PublishDeny    []string
	SubscribeAllow []string
}

// PermissionsFor returns the application user's permissions for topo (defaults
// applied), or, for a topology Validate refuses, its error (ErrInvalidConfig): the
// grants name every partition, so they exist only for a topology that can. Publishing
// to the ingest or dead-letter subjects is as good as being the application: grant it
// to that user only.
func PermissionsFor(topo NATSTopology) (NATSPermissions, error) {
	topo = topo.WithDefaults()
	if err := topo.Validate(); err != nil {
		return NATSPermissions{}, err
	}
	s := topo.subjects()
	h := topo.HistoryStream
	return NATSPermissions{
		PublishAllow: append([]string{
			s.ingestAll(),
			s.deadLetterAll(),
			"$JS.API.INFO",
			"$JS.API.STREAM.NAMES",
			"$JS.API.STREAM.INFO.*",
			"$JS.API.CONSUMER.INFO.*.*",
			// Pulling the durable on any stream also drains partitions a lower N left.
			"$JS.API.CONSUMER.MSG.NEXT.*." + topo.IngestConsumer,
			"$JS.ACK.>",
			// A worker that stops hands its pinned partitions (those too) to another.
			"$JS.API.CONSUMER.UNPIN.*." + topo.IngestConsumer,
			// The workers sharing the durable tell each other they are there.
			topo.workerSubject(),
			// The hub's and replays' auto-expiring consumers on the history.
			"$JS.API.CONSUMER.CREATE." + h + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + h + ".>",
			"$JS.API.CONSUMER.DELETE." + h + ".>",
			// Dead letters as a workflow: read parked events one by one, and delete
			// one once redriven or dismissed. Neither changes the stream.
			"$JS.API.STREAM.MSG.GET." + topo.DeadLetterStream(),
			"$JS.API.STREAM.MSG.DELETE." + topo.DeadLetterStream(),
		}, partitionReads(topo)...),
		PublishDeny: []string{
			"$JS.API.STREAM.CREATE.>",
			"$JS.API.STREAM.UPDATE.>",
			"$JS.API.STREAM.DELETE.>",
			"$JS.API.STREAM.PURGE.>",
			"$JS.API.CONSUMER.DURABLE.CREATE.>",
		},
		SubscribeAllow: []string{inboxPrefix(topo) + ".>", topo.workerSubject()},
	}, nil
}

// partitionReads lets a worker read one stored event of each partition: whether a
// failed event it waits for is still there (worker_vanished.go).
func partitionReads(topo NATSTopology) []string {
	out := make([]string, topo.Partitions)
	for p := range out {
		out[p] = "$JS.API.STREAM.MSG.GET." + topo.PartitionStream(p)
	}
	return out
}

// inboxPrefix is the application connection's reply-subject prefix, so its subscribe
// permission can be narrowed to its own inbox.
func inboxPrefix(topo NATSTopology) string { return "_INBOX_" + topo.WithDefaults().Prefix }

type permissionsBlock struct {
	Publish struct {
		Allow []string `yaml:"allow"`
		Deny  []string `yaml:"deny"`
	} `yaml:"publish"`
	Subscribe struct {
		Allow []string `yaml:"allow"`
	} `yaml:"subscribe"`
}

// WriteNATSPermissions writes the "permissions:" block of the application user's entry
// in the NATS Helm chart's config.merge (accounts.<account>.users), with a comment
// naming the topology it is for.
func WriteNATSPermissions(w io.Writer, topo NATSTopology) error {
	topo = topo.WithDefaults()
	p, err := PermissionsFor(topo)
	if err != nil {
		return err
	}
	var block struct {
		Permissions permissionsBlock `yaml:"permissions"`
	}
	block.Permissions.Publish.Allow = p.PublishAllow
	block.Permissions.Publish.Deny = p.PublishDeny
	block.Permissions.Subscribe.Allow = p.SubscribeAllow
	var b strings.Builder
	fmt.Fprintf(&b, "# Permissions of the restricted mq application user (prefix %s, history %s, durable %s, %d partitions).\n",
		topo.Prefix, topo.HistoryStream, topo.IngestConsumer, topo.Partitions)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(block); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String())
	return err
}
