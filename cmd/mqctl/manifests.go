package main

import (
	"context"
	"fmt"
	"io"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "manifests",
		summary: "print the NACK Stream and Consumer resources of the NATS topology (deployments/nats/jetstream.yaml)",
		usage:   topologyUsage,
		run:     runManifests,
	})
	register(command{
		name:    "permissions",
		summary: "print the permissions block of the restricted application user for the NATS Helm values (give it manifests' flags)",
		usage:   topologyUsage,
		run:     runPermissions,
	})
}

const topologyUsage = "[-partitions n] [-replicas n] [-prefix p] [-history name] [-history-max-age d] [-ingest-consumer name] [-ingest-group name]"

func runManifests(_ context.Context, e *env, args []string) int {
	return runTopologyWriter(e, "manifests", args, mq.WriteNATSManifests)
}

func runPermissions(_ context.Context, e *env, args []string) int {
	return runTopologyWriter(e, "permissions", args, mq.WriteNATSPermissions)
}

// runTopologyWriter parses the topology flags of command name and prints what write
// makes of the topology they give. Both commands take the same flags, so an operator
// grants the user exactly the streams the manifests create.
func runTopologyWriter(e *env, name string, args []string, write func(io.Writer, mq.NATSTopology) error) int {
	fs := commands[name].flags(e)
	var topo mq.NATSTopology
	tf := addTopologyFlags(fs, &topo, true)
	if code := parse(e, fs, args); code >= 0 {
		return code
	}
	if problem := tf.problem(); problem != "" {
		fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), problem)
		fs.Usage()
		return 2
	}
	err := write(e.stdout, topo)
	if e.outputLost("mqctl "+name, "the "+name) {
		return 1
	}
	if err != nil { // the library refused the topology before writing anything
		fmt.Fprintf(e.stderr, "mqctl %s: %v\n", name, err)
		return 2
	}
	return 0
}
