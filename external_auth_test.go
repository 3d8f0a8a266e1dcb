//go:build integration

package mq

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// authServer starts a server from opts and applies the shipped shape through an
// operator connection made with adminOpts.
func authServer(t *testing.T, opts *server.Options, adminOpts ...nats.Option) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoSigs, opts.NoLog = "127.0.0.1", server.RANDOM_PORT, true, true
	opts.JetStream, opts.StoreDir, opts.JetStreamMaxStore = true, filepath.Join(t.TempDir(), "js"), maxStore
	f := &natsFixture{opts: opts, srv: runServer(t, opts)}
	nc, err := nats.Connect(f.srv.ClientURL(), adminOpts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	f.admin, err = jetstream.New(nc)
	require.NoError(t, err)
	f.apply(t, shapeOf(NATSTopology{}))
	return f.srv
}

func authConfig(url string) NATSConfig {
	return NATSConfig{URLs: []string{url}, TopologyWait: 10 * time.Second, Logger: quietLog}
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

func bootAndPublish(t *testing.T, cfg NATSConfig) {
	t.Helper()
	e, err := NewNATS(t.Context(), cfg)
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Publish(testCtx(t), Topic{Tenant: "acme", Table: "t"}, []byte("x")))
}

// refusedAtBoot checks NewNATS refuses cfg with an error wrapping want. Credentials
// the server refuses are ErrInvalidConfig as soon as nats.go gives up on them (after
// the second refusal), well within the wait; anything else is ErrUnavailable once the
// wait is over.
func refusedAtBoot(t *testing.T, cfg NATSConfig, want error) {
	t.Helper()
	cfg.TopologyWait = 500 * time.Millisecond
	if want == ErrInvalidConfig {
		cfg.TopologyWait = time.Minute
	}
	_, err := NewNATS(t.Context(), cfg)
	require.ErrorIs(t, err, want)
	if want == ErrInvalidConfig {
		assert.NotErrorIs(t, err, ErrUnavailable, "retrying cannot help")
		assert.Contains(t, err.Error(), "refused the credentials")
	}
}

func TestNewNATS_BootsWithAnNKeySeedFileAndRefusesNoCredentials(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	seedFile := writeFile(t, "user.nk", seed)
	adminOpt, err := nats.NkeyOptionFromSeed(seedFile)
	require.NoError(t, err)
	url := authServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}}, adminOpt).ClientURL()

	cfg := authConfig(url)
	cfg.NKeySeedFile = seedFile
	bootAndPublish(t, cfg)
	refusedAtBoot(t, authConfig(url), ErrInvalidConfig)
}

// operatorMode is a server in operator mode (user JWTs, accounts from a memory
// resolver) with the shipped shape applied, and a user of its JetStream account.
type operatorMode struct {
	srv       *server.Server
	credsFile string // the user's JWT and seed, as nsc writes them
	seed      []byte // the user's nkey seed alone, as a user.nk file holds it
}

func newOperatorMode(t *testing.T) *operatorMode {
	t.Helper()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{DiskStorage: -1, MemoryStorage: -1, Streams: -1, Consumer: -1}
	ajwt, err := ac.Encode(okp)
	require.NoError(t, err)
	skp, _ := nkeys.CreateAccount()
	spub, _ := skp.PublicKey()
	sjwt, err := jwt.NewAccountClaims(spub).Encode(okp)
	require.NoError(t, err)
	ojwt, err := oc.Encode(okp)
	require.NoError(t, err)
	operator, err := jwt.DecodeOperatorClaims(ojwt)
	require.NoError(t, err)
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.IssuerAccount = apub
	ujwt, err := uc.Encode(akp)
	require.NoError(t, err)
	useed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	require.NoError(t, err)
	credsFile := writeFile(t, "user.creds", creds)

	resolver := &server.MemAccResolver{}
	require.NoError(t, resolver.Store(apub, ajwt))
	require.NoError(t, resolver.Store(spub, sjwt))
	opts := &server.Options{TrustedOperators: []*jwt.OperatorClaims{operator}, AccountResolver: resolver, SystemAccount: spub}
	return &operatorMode{srv: authServer(t, opts, nats.UserCredentials(credsFile)), credsFile: credsFile, seed: useed}
}

// traceTo turns the server's protocol trace on, into a buffer: a client's CONNECT
// shows there whole but for its password and token.
func (om *operatorMode) traceTo() *syncBuffer {
	var trace syncBuffer
	om.srv.SetLoggerV2(serverLogger{slog.New(slog.NewTextHandler(&trace, &slog.HandlerOptions{Level: slog.LevelDebug}))}, false, true, false)
	return &trace
}

// connections counts the client connections the server has ever accepted.
func (om *operatorMode) connections(t *testing.T) uint64 {
	t.Helper()
	v, err := om.srv.Varz(nil)
	require.NoError(t, err)
	return v.TotalConnections
}

func TestNewNATS_BootsWithACredsFileInOperatorMode(t *testing.T) {
	t.Parallel()
	om := newOperatorMode(t)
	cfg := authConfig(om.srv.ClientURL())
	cfg.CredsFile = om.credsFile
	bootAndPublish(t, cfg)
}

// refusedBeforeDialing boots with each file of files as the credentials field picks,
// through NewNATS and CheckNATS, and checks each is refused before any dial: invalid
// config naming the file and saying each of reasons, from the library and not from the
// server (which counts no connection but the operator's), showing no part of the seed.
// The wait is an hour: a refusal that came from the server would have had to dial.
func (om *operatorMode) refusedBeforeDialing(t *testing.T, files map[string][]byte, field func(*NATSConfig) *string, reasons ...string) {
	t.Helper()
	for name, contents := range files {
		t.Run(name, func(t *testing.T) {
			file := writeFile(t, "user.nk", contents)
			cfg := authConfig(om.srv.ClientURL())
			*field(&cfg), cfg.TopologyWait = file, time.Hour
			_, err := NewNATS(t.Context(), cfg)
			_, cerr := CheckNATS(t.Context(), cfg)
			for _, err := range []error{err, cerr} {
				require.ErrorIs(t, err, ErrInvalidConfig)
				assert.NotErrorIs(t, err, ErrUnavailable)
				assert.NotErrorIs(t, err, nats.ErrAuthorization, "refused here, not by the server")
				assert.Contains(t, err.Error(), file)
				for _, reason := range reasons {
					assert.Contains(t, err.Error(), reason)
				}
				// The path is taken out first: it holds the test's name, which a
				// piece of the seed could match by chance.
				assert.Empty(t, leaked(strings.ReplaceAll(err.Error(), file, "<file>"), string(om.seed)), "the error shows part of the seed: %v", err)
			}
		})
	}
	assert.Equal(t, uint64(1), om.connections(t), "only the operator's connection: none was attempted")
}

// TestExternalNATS_ACredsFileHoldingOnlyASeedIsRefusedBeforeDialing: nats.go takes a
// file without a decorated JWT for the JWT itself, so a user.nk given as creds would
// send the seed in CONNECT's jwt field, which the server's trace shows. It is refused
// as a malformed creds file before any connection, pointing to NKeySeedFile.
func TestExternalNATS_ACredsFileHoldingOnlyASeedIsRefusedBeforeDialing(t *testing.T) {
	t.Parallel()
	om := newOperatorMode(t)
	trace := om.traceTo()
	decorated, err := jwt.DecorateSeed(om.seed)
	require.NoError(t, err)
	om.refusedBeforeDialing(t, map[string][]byte{
		"a bare seed":      append(slices.Clone(om.seed), '\n'),
		"a decorated seed": decorated,
	}, func(c *NATSConfig) *string { return &c.CredsFile }, "malformed", "NKeySeedFile")
	assert.NotContains(t, trace.String(), string(om.seed))
}

// TestExternalNATS_AnNKeySeedFileHoldingACredsFileIsRefusedBeforeDialing: nats.go
// takes the seed out of a creds file given as the nkey seed and connects as that bare
// key, which an operator-mode server refuses with no word about the file. A seed file
// holding a JWT is refused before any connection, pointing to CredsFile.
func TestExternalNATS_AnNKeySeedFileHoldingACredsFileIsRefusedBeforeDialing(t *testing.T) {
	t.Parallel()
	om := newOperatorMode(t)
	creds, err := os.ReadFile(om.credsFile)
	require.NoError(t, err)
	userJWT, err := jwt.ParseDecoratedJWT(creds)
	require.NoError(t, err)
	om.refusedBeforeDialing(t, map[string][]byte{
		"a creds file":     creds,
		"a user JWT alone": []byte(userJWT),
	}, func(c *NATSConfig) *string { return &c.NKeySeedFile }, "holds a JWT", "CredsFile")
}

// TestExternalNATS_ACredsFileReplacedByASeedIsNotSentAtTheNextReconnect: nats.go reads
// the creds file again at each connect, so one rotated to a seed alone while the
// broker runs would reach the server at the next reconnect. The check runs there too:
// the reconnect fails on the malformed file, the broker warns naming it, and the seed
// shows neither in the server's trace nor in the broker's log.
func TestExternalNATS_ACredsFileReplacedByASeedIsNotSentAtTheNextReconnect(t *testing.T) {
	t.Parallel()
	om := newOperatorMode(t)
	creds, err := os.ReadFile(om.credsFile)
	require.NoError(t, err)
	var logs syncBuffer
	cfg := authConfig(om.srv.ClientURL())
	cfg.CredsFile = writeFile(t, "user.creds", creds) // its own copy, to rotate
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e, err := NewNATS(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	trace := om.traceTo()
	require.NoError(t, os.WriteFile(cfg.CredsFile, om.seed, 0o600))
	cid, err := e.nc.GetClientID()
	require.NoError(t, err)
	require.NoError(t, om.srv.DisconnectClientByID(cid))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "malformed") },
		30*time.Second, 20*time.Millisecond, "a reconnect reads the file again and refuses it")
	assert.Contains(t, logs.String(), cfg.CredsFile)
	assert.NotContains(t, logs.String(), string(om.seed))
	assert.NotContains(t, trace.String(), string(om.seed))
}

// testCA makes a CA and a certificate it signed for 127.0.0.1, written as PEM files.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mq test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, file: writeFile(t, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return writeFile(t, name+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		writeFile(t, name+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

func TestNewNATS_BootsWithMutualTLSAndRefusesNoClientCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	serverCert, serverKey := ca.issue(t, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, "client", x509.ExtKeyUsageClientAuth)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: serverCert, KeyFile: serverKey, CaFile: ca.file, Verify: true})
	require.NoError(t, err)
	tc.ClientAuth = tls.RequireAndVerifyClientCert
	url := authServer(t, &server.Options{TLSConfig: tc, TLS: true, TLSVerify: true},
		nats.RootCAs(ca.file), nats.ClientCert(clientCert, clientKey)).ClientURL()

	cfg := authConfig(url)
	cfg.TLS = NATSTLS{CAFile: ca.file, CertFile: clientCert, KeyFile: clientKey}
	bootAndPublish(t, cfg)
	noCert := authConfig(url)
	noCert.TLS = NATSTLS{CAFile: ca.file}
	refusedAtBoot(t, noCert, ErrUnavailable)
	assert.NotEmpty(t, url)
}

// TestNewNATS_CredentialsTheServerRefusesAreInvalidConfigNotUnavailable: a wrong
// password or an unknown user is refused as ErrInvalidConfig once nats.go gives up on
// it, not retried as ErrUnavailable until the wait runs out (a host that retries on
// ErrUnavailable would retry a typo forever); the password shows in no error. The
// wait is an hour, bounded by a ctx of two minutes: a call that waited it out is the
// ctx's ErrUnavailable.
func TestNewNATS_CredentialsTheServerRefusesAreInvalidConfigNotUnavailable(t *testing.T) {
	t.Parallel()
	url := authServer(t, &server.Options{Users: []*server.User{{Username: "app", Password: "right-one"}}},
		nats.UserInfo("app", "right-one")).ClientURL()
	for name, user := range map[string]struct {
		user, password string
		wait           time.Duration
	}{
		"a wrong password": {"app", "wrong-secret", time.Hour},
		"an unknown user":  {"nobody", "wrong-secret", time.Hour},
		// A wait shorter than nats.go's reconnect wait ends before its second try:
		// the one refusal was reported as a server out of reach, without a reason.
		"a wrong password and a short wait": {"app", "wrong-secret", 300 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := authConfig(url)
			cfg.TopologyWait = user.wait
			cfg.User, cfg.PasswordFile = user.user, writeFile(t, "pw", []byte(user.password))
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			_, err := NewNATS(ctx, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.NotErrorIs(t, err, ErrUnavailable)
			assert.ErrorIs(t, err, nats.ErrAuthorization)
			assert.NotContains(t, err.Error(), "secret")
			_, err = ConnectNATS(ctx, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig, "ConnectNATS, as NewNATS")
			_, err = CheckNATS(ctx, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig, "CheckNATS, as NewNATS")
		})
	}
	good := authConfig(url)
	good.User, good.PasswordFile = "app", writeFile(t, "pw", []byte("right-one\n"))
	bootAndPublish(t, good)
}
