//go:build integration

package mq

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewEmbedded_AStoreServedByAnotherBrokerIsRefusedUntilItCloses: two brokers on
// one StoreDir would be two nats-servers writing one store's files. The second waits
// ReadyTimeout for the first (a restart on the same volume may find it closing), then
// is ErrUnavailable naming the store, with nothing started; once the first closed, a
// broker opens the store and finds what the first stored.
func TestNewEmbedded_AStoreServedByAnotherBrokerIsRefusedUntilItCloses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := openEmbedded(t, dir)
	ctx := testCtx(t)
	require.NoError(t, first.SetMaxBytes(ctx, "acme", 1<<20))
	require.NoError(t, first.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("kept")))

	_, err := NewEmbedded(ctx, EmbeddedOptions{StoreDir: dir, ReadyTimeout: 300 * time.Millisecond, Logger: quietLog})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), dir)
	assert.Contains(t, err.Error(), "another broker")
	assert.Equal(t, int64(1<<20), first.MaxBytes("acme"), "the first broker goes on")
	require.NoError(t, first.Publish(ctx, Topic{Tenant: "acme", Table: "t"}, []byte("after")))

	// A broker waiting for the store gets it as soon as the first closes.
	opened := make(chan error, 1)
	var second *EmbeddedNATS
	go func() {
		var err error
		second, err = NewEmbedded(ctx, EmbeddedOptions{StoreDir: dir, ReadyTimeout: time.Minute, NoSync: true, Logger: quietLog})
		opened <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it find the store held
	require.NoError(t, first.Close())
	require.NoError(t, <-opened)
	t.Cleanup(func() { _ = second.Close() })
	assert.Equal(t, int64(1<<20), second.MaxBytes("acme"), "the store the first broker served")
	got, failed := consumeAll(t, second)
	for _, want := range []string{"kept", "after"} {
		assert.Equal(t, want, string(receive(t, got, failed).Data))
	}
}

// TestNewEmbedded_WaitingForAStoreEndsWithTheCallersCtx: a NewEmbedded whose ctx ends
// while another broker holds the store returns ctx's error, not ErrUnavailable (it is
// no reason to retry); options that cannot work are refused before any wait.
func TestNewEmbedded_WaitingForAStoreEndsWithTheCallersCtx(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	openEmbedded(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := NewEmbedded(ctx, EmbeddedOptions{StoreDir: dir, ReadyTimeout: time.Hour, Logger: quietLog})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, ErrUnavailable)
	_, err = NewEmbedded(t.Context(), EmbeddedOptions{StoreDir: dir, ReadyTimeout: time.Hour, ListenAddr: "127.0.0.1:70000", Logger: quietLog})
	require.ErrorIs(t, err, ErrInvalidConfig, "refused before waiting an hour for the store")
}
