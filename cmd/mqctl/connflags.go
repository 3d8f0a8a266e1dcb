package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/wavehouse/mq"
)

// natsFlags are the flags of every command that talks to an operator's cluster: the
// servers, the credentials (file paths only, as NATSConfig takes them) and the
// topology the application runs.
type natsFlags struct {
	cfg  mq.NATSConfig
	urls string
	topo *topologyFlags
}

// -wait's help for the commands that wait for the topology to verify (NewNATS) and
// for check, which verifies it once (CheckNATS): -wait bounds both steps.
const (
	waitVerifies = "how long to wait for the connection and then for the topology to verify: " +
		"a topology that does not match is reported only after this long"
	waitChecks = "how long to wait for the connection, and then for the one check of the topology to answer"
)

// addNATSFlags registers the connection and topology flags on fs; waitHelp is -wait's
// help, waitVerifies or waitChecks.
func addNATSFlags(fs *flag.FlagSet, waitHelp string) *natsFlags {
	f := &natsFlags{}
	cfg := &f.cfg
	fs.StringVar(&f.urls, "url", "", "server URLs, comma-separated, without credentials (required)")
	fs.StringVar(&cfg.User, "user", "", "user name (with -password-file)")
	fs.StringVar(&cfg.PasswordFile, "password-file", "", "file holding the user's password")
	fs.StringVar(&cfg.NKeySeedFile, "nkey-seed-file", "", "file holding an nkey seed")
	fs.StringVar(&cfg.CredsFile, "creds-file", "", "user credentials file (JWT and seed)")
	fs.StringVar(&cfg.TLS.CAFile, "tls-ca", "", "CA certificate file to trust")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "client certificate file (mutual TLS, with -tls-key)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "client key file")
	fs.StringVar(&cfg.TLS.ServerName, "tls-server-name", "", "server name to verify")
	f.topo = addTopologyFlags(fs, &cfg.NATSTopology, false)
	fs.DurationVar(&cfg.TopologyWait, "wait", 10*time.Second, waitHelp)
	return f
}

// config returns the NATSConfig the flags give, or, when -url is missing or a value
// given cannot work (a zero the library would take as "the default"), says so with
// fs's usage and returns ok false (a usage error). The broker's own logs are
// discarded: a command prints what it found itself.
func (f *natsFlags) config(fs *flag.FlagSet) (cfg mq.NATSConfig, ok bool) {
	var problem string
	switch {
	case f.urls == "":
		problem = "-url is required"
	case f.topo.problem() != "":
		problem = f.topo.problem()
	case f.cfg.TopologyWait <= 0:
		problem = fmt.Sprintf("-wait %s: must be more than 0", f.cfg.TopologyWait)
	}
	if problem != "" {
		fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), problem)
		fs.Usage()
		return mq.NATSConfig{}, false
	}
	cfg = f.cfg
	cfg.URLs = strings.Split(f.urls, ",")
	cfg.Name = "mqctl"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return mq.NATSConfig{}, false
	}
	return cfg, true
}

// connectExit is the exit code of a failed connection: 2 when the library found the
// configuration wrong (a malformed secret file, a CA that is no certificate, credentials
// the server refused), as for the usage errors found before dialing; 1 otherwise.
func connectExit(err error) int {
	if errors.Is(err, mq.ErrInvalidConfig) {
		return 2
	}
	return 1
}
