package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

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
	var cfg mq.NATSConfig
	var urls string
	fs.StringVar(&urls, "url", "", "server URLs, comma-separated, without credentials (required)")
	fs.StringVar(&cfg.User, "user", "", "user name (with -password-file)")
	fs.StringVar(&cfg.PasswordFile, "password-file", "", "file holding the user's password")
	fs.StringVar(&cfg.NKeySeedFile, "nkey-seed-file", "", "file holding an nkey seed")
	fs.StringVar(&cfg.CredsFile, "creds-file", "", "user credentials file (JWT and seed)")
	fs.StringVar(&cfg.TLS.CAFile, "tls-ca", "", "CA certificate file to trust")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "client certificate file (mutual TLS, with -tls-key)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "client key file")
	fs.StringVar(&cfg.TLS.ServerName, "tls-server-name", "", "server name to verify")
	fs.StringVar(&cfg.Prefix, "prefix", "wh", "subject prefix")
	fs.IntVar(&cfg.Partitions, "partitions", 4, "ingest partitions the application runs")
	fs.StringVar(&cfg.HistoryStream, "history", "", "history stream name (default <PREFIX>_HISTORY)")
	fs.StringVar(&cfg.IngestConsumer, "ingest-consumer", "", "the ingest durable (default INGEST)")
	fs.StringVar(&cfg.IngestGroup, "ingest-group", "", "the priority group the workers pull the durable in (default ingest)")
	fs.DurationVar(&cfg.TopologyWait, "wait", 10*time.Second, "how long to wait for the connection")
	if code := parse(fs, args); code >= 0 {
		return code
	}
	if urls == "" {
		fmt.Fprintln(e.stderr, "mqctl check: -url is required")
		fs.Usage()
		return 2
	}
	cfg.URLs = strings.Split(urls, ",")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	findings, err := mq.CheckNATS(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "mqctl check: %v\n", err)
		return 1
	}
	required := 0
	for _, f := range findings {
		fmt.Fprintln(e.stdout, f.String())
		if f.Severity == mq.Required {
			required++
		}
	}
	fmt.Fprintf(e.stdout, "%d findings, %d required\n", len(findings), required)
	if required > 0 {
		return 1
	}
	return 0
}
