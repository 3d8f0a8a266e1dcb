package mq

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaked returns the first piece of secret, four bytes or longer, that text contains,
// or "": an error must not carry a secret whole or in part.
func leaked(text, secret string) string {
	const piece = 4
	for i := 0; i+piece <= len(secret); i++ {
		if strings.Contains(text, secret[i:i+piece]) {
			return secret[i : i+piece]
		}
	}
	return ""
}

// credentialURLs are URLs carrying userinfo, with the secrets each must never show.
var credentialURLs = []struct {
	url     string
	secrets []string
}{
	{"nats://s3cr3tT0kenValue@nats.example:4222", []string{"s3cr3tT0kenValue"}},
	{"nats://alice-user:pa55w0rdValue@nats.example:4222", []string{"alice-user", "pa55w0rdValue"}},
	{"tls://Zm9vYmFyYmF6@nats.example", []string{"Zm9vYmFyYmF6"}},
	{"nats://k3yWith@Sign@nats.example:4222", []string{"k3yWith", "Sign"}},
	// These do not parse (a bad escape, no scheme, a blank in the host).
	{"nats://bobby-user:pw%zzSecret@nats.example:4222", []string{"bobby-user", "pw%zzSecret"}},
	{"carol-user:hunter2Secret@nats.example:4222", []string{"carol-user", "hunter2Secret"}},
	{"nats://T0kenValue22@nats example", []string{"T0kenValue22"}},
}

// TestRedactURL_ShowsNoUserinfoAtAll: a token, a user and password, and the userinfo
// of a URL that does not parse are hidden whole, while the host stays readable.
func TestRedactURL_ShowsNoUserinfoAtAll(t *testing.T) {
	for _, c := range credentialURLs {
		got := redactURL(c.url)
		for _, s := range c.secrets {
			assert.Empty(t, leaked(got, s), "redactURL(%q) = %q shows part of %q", c.url, got, s)
		}
		assert.Contains(t, got, "example", "redactURL(%q) = %q lost the host", c.url, got) // every host here is nats.example
	}
	assert.Equal(t, "nats://nats.example:4222", redactURL("nats://nats.example:4222"), "a URL without userinfo is kept")
	assert.Equal(t, "nats://***@nats.example:4222", redactURL("nats://alice:pw@nats.example:4222"))
}

// TestNewNATSAndCheckNATS_RefuseACredentialURLWithoutShowingTheCredential: both refuse a
// URL with userinfo before dialing, and neither error shows any of it.
func TestNewNATSAndCheckNATS_RefuseACredentialURLWithoutShowingTheCredential(t *testing.T) {
	for _, c := range credentialURLs {
		cfg := NATSConfig{URLs: []string{"nats://other.example:4222", c.url}, Logger: quietLog}
		_, err := NewNATS(context.Background(), cfg)
		require.Error(t, err, "NewNATS with %q", c.url)
		assert.Contains(t, err.Error(), "credentials")
		_, cerr := CheckNATS(context.Background(), cfg)
		require.Error(t, cerr, "CheckNATS with %q", c.url)
		for _, s := range c.secrets {
			assert.Empty(t, leaked(err.Error(), s), "NewNATS: %q shows part of %q", err, s)
			assert.Empty(t, leaked(cerr.Error(), s), "CheckNATS: %q shows part of %q", cerr, s)
		}
	}
}
