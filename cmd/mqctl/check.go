package main

import (
	"context"
	"fmt"

	"github.com/wavehouse/mq"
)

func init() {
	register(command{
		name:    "check",
		summary: "verify a live NATS cluster's topology and print every finding; exit 1 on a required one",
		usage:   "-url nats://host:4222[,...] [auth flags] [topology flags]",
		run:     runCheck,
	})
}

func runCheck(ctx context.Context, e *env, args []string) int {
	c := commands["check"]
	fs := c.flags(e)
	nf := addNATSFlags(fs, waitChecks)
	if code := parse(e, fs, args); code >= 0 {
		return code
	}
	cfg, ok := nf.config(fs)
	if !ok {
		return 2
	}
	findings, err := mq.CheckNATS(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl check: %v\n", err)
		return connectExit(err)
	}
	required := 0
	for _, f := range findings {
		fmt.Fprintln(e.stdout, f.String())
		if f.Severity == mq.Required {
			required++
		}
	}
	fmt.Fprintf(e.stdout, "%d findings, %d required\n", len(findings), required)
	if e.outputLost("mqctl check", "the findings") || required > 0 {
		return 1
	}
	return 0
}
