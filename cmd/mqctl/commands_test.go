package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/wavehouse/mq"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestManifestsPrintsTheShippedFileForTheShippedFlags(t *testing.T) {
	shipped, err := os.ReadFile("../../deployments/nats/jetstream.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runArgs(t, "manifests", "-partitions", "4", "-replicas", "3")
	if code != 0 || stdout != string(shipped) {
		t.Fatalf("manifests: exit %d, stderr %s; output differs from the shipped file", code, stderr)
	}
	if code, _, stderr := runArgs(t, "manifests", "-prefix", "A.B"); code != 2 || !strings.Contains(stderr, "prefix") {
		t.Fatalf("a bad prefix: exit %d, stderr %s", code, stderr)
	}
	// A zero is the library's "default": given on the command line it is refused, not
	// silently made 4 partitions or 3 replicas; JetStream takes at most 5 replicas.
	for _, args := range [][]string{{"-partitions", "0"}, {"-replicas", "0"}, {"-replicas", "7"}, {"-partitions", "-1"},
		{"-prefix="}, {"-history="}, {"-ingest-consumer="}, {"-ingest-group="}} {
		if code, stdout, stderr := runArgs(t, append([]string{"manifests"}, args...)...); code != 2 || stdout != "" || stderr == "" {
			t.Errorf("manifests %v: exit %d, stdout %d bytes, stderr %q; want a usage error and nothing printed", args, code, len(stdout), stderr)
		}
	}
}

// TestManifestsRefusesAHistoryThatIsAnotherStreamOrNoKubernetesName: -history WH_DLQ
// or wh-dlq used to print two Stream resources wh-dlq, and Hïst#1 a metadata.name
// Kubernetes refuses; now each is a usage error naming the clash, and nothing printed.
func TestManifestsRefusesAHistoryThatIsAnotherStreamOrNoKubernetesName(t *testing.T) {
	for history, want := range map[string]string{
		"WH_DLQ":        `the history stream and the dead-letter stream are both named "WH_DLQ"`,
		"wh-dlq":        `the dead-letter stream "WH_DLQ" differ only in case`,
		"WH_INGEST_0":   `ingest partition 0's stream and the history stream`,
		"KV_WH_BUDGETS": `the budgets bucket's stream are both named`,
		"Hïst#1":        `makes the Kubernetes resource name "hïst#1"`,
	} {
		code, stdout, stderr := runArgs(t, "manifests", "-history", history)
		if code != 2 || stdout != "" || !strings.Contains(stderr, want) {
			t.Errorf("manifests -history %s: exit %d, stdout %d bytes, stderr %q; want exit 2 saying %q", history, code, len(stdout), stderr, want)
		}
	}
}

// TestManifestsCarryTheNamesCheckAndPermissionsTake: an operator with a history, a
// durable or a group of other names generates manifests holding them, with a header
// that regenerates the same.
func TestManifestsCarryTheNamesCheckAndPermissionsTake(t *testing.T) {
	args := []string{"manifests", "-partitions", "2", "-replicas", "1", "-history", "ARCHIVE", "-ingest-consumer", "AWORKER", "-ingest-group", "grp",
		"-history-max-age", "1h0m0s"}
	code, stdout, stderr := runArgs(t, args...)
	if code != 0 {
		t.Fatalf("manifests: exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"name: ARCHIVE", "durableName: AWORKER", "- grp", "maxAge: 1h", "go run ./cmd/mqctl " + strings.Join(args, " ")} {
		if !strings.Contains(stdout, want) {
			t.Errorf("manifests: no %q in\n%s", want, stdout)
		}
	}
}

func TestPermissionsPrintsTheApplicationUsersBlock(t *testing.T) {
	code, stdout, _ := runArgs(t, "permissions")
	if code != 0 || !strings.Contains(stdout, "permissions:") || !strings.Contains(stdout, "$JS.API.CONSUMER.MSG.NEXT.*.INGEST") {
		t.Fatalf("permissions: exit %d, output:\n%s", code, stdout)
	}
}

// partitionReads lists the partitions whose stored events a permissions block lets the
// user read ($JS.API.STREAM.MSG.GET.<partition>), as stream names.
func partitionReads(t *testing.T, block, prefix string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(block, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- $JS.API.STREAM.MSG.GET."+prefix+"_INGEST_"); ok {
			out = append(out, prefix+"_INGEST_"+name)
		}
	}
	return out
}

// TestPermissionsGrantsReadsOfExactlyThePartitionsOfN: permissions had no -partitions
// and always granted WH_INGEST_0..3, so with N=8 the worker could not read partitions
// 4 to 7 (its vanished-event check then parks nothing), and with N<4 streams that do
// not exist were granted.
func TestPermissionsGrantsReadsOfExactlyThePartitionsOfN(t *testing.T) {
	for _, n := range []int{1, 4, 8} {
		code, stdout, stderr := runArgs(t, "permissions", "-partitions", strconv.Itoa(n))
		if code != 0 {
			t.Fatalf("permissions -partitions %d: exit %d, stderr %s", n, code, stderr)
		}
		want := make([]string, n)
		for p := range want {
			want[p] = "WH_INGEST_" + strconv.Itoa(p)
		}
		if got := partitionReads(t, stdout, "WH"); !slices.Equal(got, want) {
			t.Errorf("permissions -partitions %d grants reads of %v, want %v", n, got, want)
		}
		if !strings.Contains(stdout, fmt.Sprintf("%d partitions)", n)) {
			t.Errorf("permissions -partitions %d: the header does not name the count:\n%s", n, stdout)
		}
	}
}

// TestPermissionsTakesTheFlagsManifestsTakeAndGrantsThatTopology: the command line that
// generated the manifests (their header names it) grants the user that very topology,
// as the library's PermissionsFor has it, and what manifests refuses, permissions
// refuses too.
func TestPermissionsTakesTheFlagsManifestsTakeAndGrantsThatTopology(t *testing.T) {
	flags := []string{"-partitions", "6", "-replicas", "1", "-prefix", "acme", "-history", "ARCHIVE", "-ingest-consumer", "AWORKER",
		"-ingest-group", "grp", "-history-max-age", "1h0m0s"}
	code, stdout, stderr := runArgs(t, append([]string{"permissions"}, flags...)...)
	if code != 0 {
		t.Fatalf("permissions %v: exit %d, stderr %s", flags, code, stderr)
	}
	want, err := mq.PermissionsFor(mq.NATSTopology{Partitions: 6, Prefix: "acme", HistoryStream: "ARCHIVE", IngestConsumer: "AWORKER"})
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range slices.Concat(want.PublishAllow, want.PublishDeny, want.SubscribeAllow) {
		if !strings.Contains(stdout, "- "+subject+"\n") {
			t.Errorf("permissions %v: no %q in\n%s", flags, subject, stdout)
		}
	}
	if got := partitionReads(t, stdout, "ACME"); len(got) != 6 {
		t.Errorf("permissions %v grants reads of %v, want the 6 partitions", flags, got)
	}
	for _, args := range [][]string{{"-partitions", "0"}, {"-partitions", "1099511627776"}, {"-replicas", "0"}, {"-replicas", "7"},
		{"-history", "WH_DLQ"}, {"-history-max-age", "0s"}, {"-history-max-age", "1ns"}, {"-prefix="}, {"-ingest-group="}} {
		for _, command := range []string{"manifests", "permissions"} {
			if code, stdout, stderr := runArgs(t, append([]string{command}, args...)...); code != 2 || stdout != "" || stderr == "" {
				t.Errorf("%s %v: exit %d, stdout %d bytes, stderr %q; want a usage error and nothing printed", command, args, code, len(stdout), stderr)
			}
		}
	}
}

// TestCheckPrintsEveryFindingAndFailsOnARequiredOne runs the check against an embedded
// broker listening on loopback: its own topology passes with the one-replica
// recommendations, and a process configured for more partitions than exist fails.
func TestCheckPrintsEveryFindingAndFailsOnARequiredOne(t *testing.T) {
	e := openEmbedded(t)
	code, stdout, stderr := runArgs(t, "check", "-url", e.ClientURL())
	if code != 0 || !strings.Contains(stdout, "4 findings, 0 required") || !strings.Contains(stdout, "num_replicas") {
		t.Fatalf("check: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// The embedded history keeps 15 minutes: an application replaying an hour is told.
	code, stdout, _ = runArgs(t, "check", "-url", e.ClientURL(), "-history-max-age", "1h")
	if code != 0 || !strings.Contains(stdout, "recommended: stream WH_HISTORY: max_age") {
		t.Fatalf("check -history-max-age 1h: exit %d\nstdout:\n%s", code, stdout)
	}
	code, stdout, _ = runArgs(t, "check", "-url", e.ClientURL(), "-partitions", "6")
	if code != 1 || !strings.Contains(stdout, "required: ingest partition 5: subjects") {
		t.Fatalf("check -partitions 6: exit %d\nstdout:\n%s", code, stdout)
	}
	if code, _, stderr := runArgs(t, "check"); code != 2 || !strings.Contains(stderr, "-url is required") {
		t.Fatalf("check without -url: exit %d, stderr %s", code, stderr)
	}
	if code, _, stderr := runArgs(t, "check", "-url", "nats://u:secret@127.0.0.1:1"); code != 2 || strings.Contains(stderr, "secret") {
		t.Fatalf("inline credentials: exit %d, stderr %s", code, stderr)
	}
}

// TestAConfigurationTheLibraryFindsWrongWhenDialingIsAUsageError: a secret file that is
// no secret, or a CA that is no certificate, is found only as the connection is made,
// yet it is the operator's configuration, not the cluster, that is wrong: exit 2, and
// the file's content is never echoed.
func TestAConfigurationTheLibraryFindsWrongWhenDialingIsAUsageError(t *testing.T) {
	e, err := mq.NewEmbedded(t.Context(), mq.EmbeddedOptions{StoreDir: t.TempDir(), ListenAddr: "127.0.0.1:0", NoSync: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte("not-a-secret-Zq8x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"check", "-url", e.ClientURL(), "-nkey-seed-file", junk, "-wait", "3s"},
		{"check", "-url", e.ClientURL(), "-creds-file", junk, "-wait", "3s"},
		{"status", "-once", "-url", e.ClientURL(), "-tls-ca", junk},
	} {
		code, _, stderr := runArgs(t, args...)
		if code != 2 || !strings.Contains(stderr, "invalid config") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming an invalid config", args[:3], code, stderr)
		}
		if strings.Contains(stderr, "Zq8x") {
			t.Errorf("%v: the file's content is in the error: %q", args[:3], stderr)
		}
	}
}
