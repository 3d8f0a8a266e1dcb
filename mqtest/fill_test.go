package mqtest_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wavehouse/mq"
	"github.com/wavehouse/mq/mqtest"
)

// TestFillByPublishing_LeavesNoRoomForAnyEvent: after FillByPublishing, every event of
// the tenant is refused, the smallest there is included, whatever its table, scope or
// headers; another tenant still publishes.
func TestFillByPublishing_LeavesNoRoomForAnyEvent(t *testing.T) {
	b := openMemBroker(newMemStore())
	t.Cleanup(func() { _ = b.Close() })
	for _, tenant := range []mq.TenantID{mqtest.Acme, mqtest.Globex} {
		require.NoError(t, b.SetMaxBytes(t.Context(), tenant, 64<<20))
	}
	mqtest.FillByPublishing(t, b, mqtest.Acme)
	for _, c := range []struct {
		name string
		tp   mq.Topic
		data []byte
		opts []mq.PublishOpt
	}{
		{"empty on t", mq.Topic{Tenant: mqtest.Acme, Table: "t"}, nil, nil},
		{"one byte on t", mq.Topic{Tenant: mqtest.Acme, Table: "t"}, []byte("x"), nil},
		{"512 bytes on fill", mq.Topic{Tenant: mqtest.Acme, Table: "fill"}, bytes.Repeat([]byte("f"), 512), nil},
		{"scoped, with a header", mq.Topic{Tenant: mqtest.Acme, Table: "t", Scope: "s"}, []byte("x"), []mq.PublishOpt{mq.WithHeader("X-A", "b")}},
	} {
		assert.ErrorIs(t, b.Publish(t.Context(), c.tp, c.data, c.opts...), mq.ErrQueueFull, c.name)
	}
	assert.NoError(t, b.Publish(t.Context(), mq.Topic{Tenant: mqtest.Globex, Table: "t"}, nil), "globex")
}
