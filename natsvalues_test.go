package mq

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const shippedValues = "deployments/nats/values.yaml"

// Users of the shipped Helm values.
const (
	operatorUser = "nack"
	appUser      = "wavehouse"
)

// password is the deterministic test password of user, standing in for the Secret.
func password(user string) string { return "pw-" + user }

// helmValues is the part of the shipped values the tests read.
type helmValues struct {
	Config struct {
		JetStream struct {
			FileStore struct {
				PVC struct {
					Size string `yaml:"size"`
				} `yaml:"pvc"`
			} `yaml:"fileStore"`
		} `yaml:"jetstream"`
		Merge map[string]any `yaml:"merge"`
	} `yaml:"config"`
	Container struct {
		Image struct {
			Tag string `yaml:"tag"`
		} `yaml:"image"`
	} `yaml:"container"`
	PromExporter struct {
		Enabled bool `yaml:"enabled"`
	} `yaml:"promExporter"`
}

func loadValues(t testing.TB) helmValues {
	t.Helper()
	data, err := os.ReadFile(shippedValues)
	require.NoError(t, err)
	var v helmValues
	require.NoError(t, yaml.Unmarshal(data, &v))
	return v
}

var helmVariable = regexp.MustCompile(`^<< \$([A-Z_]+) >>$`)

// resolvePlaceholders replaces the chart's "<< $VAR >>" passwords with each user's
// test password.
func resolvePlaceholders(v any, user string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		u, _ := x["user"].(string)
		for k, val := range x {
			out[k] = resolvePlaceholders(val, u)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = resolvePlaceholders(val, user)
		}
		return out
	case string:
		if helmVariable.MatchString(x) {
			return password(user)
		}
	}
	return v
}

// parseSize reads a Kubernetes quantity such as "300Gi".
func parseSize(t testing.TB, s string) int64 {
	for suffix, mult := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err)
			return v * mult
		}
	}
	t.Fatalf("size %q", s)
	return 0
}

// newValuesFixture starts a server configured with exactly the shipped values'
// accounts, users and permissions, and a file store of the shipped volume's size, so
// streams that would not fit the volume fail here too. admin is the operator user.
func newValuesFixture(t *testing.T) *natsFixture {
	t.Helper()
	opts := valuesOptions(t, t.TempDir())
	f := &natsFixture{opts: opts, srv: runServer(t, opts)}
	f.connectOperator(t)
	return f
}

// valuesOptions are one server's options from the shipped values, with its config
// file and store in dir, listening on a random loopback port.
func valuesOptions(t testing.TB, dir string) *server.Options {
	t.Helper()
	v := loadValues(t)
	var conf bytes.Buffer
	enc := json.NewEncoder(&conf)
	enc.SetEscapeHTML(false) // NATS config does not read \u003e as '>'
	require.NoError(t, enc.Encode(resolvePlaceholders(v.Config.Merge, "")))
	path := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(path, conf.Bytes(), 0o600))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	opts.Host, opts.Port, opts.NoSigs, opts.NoLog = "127.0.0.1", server.RANDOM_PORT, true, true
	opts.JetStream, opts.StoreDir = true, filepath.Join(dir, "js")
	opts.JetStreamMaxStore = parseSize(t, v.Config.JetStream.FileStore.PVC.Size)
	return opts
}

// connectOperator connects the fixture's operator handle.
func (f *natsFixture) connectOperator(t testing.TB) {
	t.Helper()
	f.nc = f.connect(t, operatorUser)
	var err error
	f.admin, err = jetstream.New(f.nc)
	require.NoError(t, err)
}

// connect connects as user with its test password; the application user gets the
// inbox prefix its subscribe permission allows.
func (f *natsFixture) connect(t testing.TB, user string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.UserInfo(user, password(user)), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		// Refusals are what the permission tests provoke: keep them off stderr.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts...)
	if user == appUser {
		opts = append(opts, nats.CustomInboxPrefix(inboxPrefix(NATSTopology{})))
	}
	nc, err := nats.Connect(strings.Join(f.clientURLs(), ","), opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// applyShipped applies the shipped manifests as the operator would, with every stream
// at replicas, after edits (a test's own choices, such as a short ack wait).
func (f *natsFixture) applyShipped(t testing.TB, replicas int, edits ...func(*shape)) *shape {
	t.Helper()
	data, err := os.ReadFile(shippedManifests)
	require.NoError(t, err)
	s := shapeFromManifests(t, shippedTopology, data)
	s.atReplicas(replicas)
	for _, edit := range edits {
		edit(s)
	}
	f.apply(t, s)
	return s
}

func TestShippedValues_PinTheServerVersionTheLibraryIsTestedWithAndExportMetrics(t *testing.T) {
	v := loadValues(t)
	version, _, _ := strings.Cut(v.Container.Image.Tag, "-")
	require.Equal(t, server.VERSION, version,
		"the chart's server image must be the nats-server the tests link (go.mod): the durability tests pin its behaviour")
	require.True(t, v.PromExporter.Enabled, "the chart's Prometheus exporter is on")
}
