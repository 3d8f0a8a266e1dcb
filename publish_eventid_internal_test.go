package mq

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEventIDOr_TakesTheSetIDOrCutsOnlyItsTenantsPrefixFromTheMessageID(t *testing.T) {
	for _, c := range []struct {
		set, msgID string
		tenant     TenantID
		want       string
	}{
		{"carried", "acme.k", "acme", "carried"},
		{"", "acme.k", "acme", "k"},
		{"", "acme.", "acme", ""},
		{"", "acme", "acme", "acme"},
		{"", "acmex.k", "acme", "acmex.k"},
		{"", "globex.k", "acme", "globex.k"},
		{"", ".k", "", ".k"},
	} {
		assert.Equal(t, c.want, eventIDOr(c.set, c.tenant, c.msgID), "eventIDOr(%q, %q, %q)", c.set, c.tenant, c.msgID)
	}
}
