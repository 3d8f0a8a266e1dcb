package mq

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"
)

// storeLockFile is the file in an EmbeddedNATS store whose lock the serving broker
// holds. nats-server takes no lock of its own on a store: a second NewEmbedded on a
// store in use started a second server on it without a word (tried), two writers of
// one store's files.
const storeLockFile = "mq.lock"

// storeLockRetry is how often a broker waiting for a store tries its lock again.
const storeLockRetry = 50 * time.Millisecond

// lockStore takes dir's lock for this broker, waiting up to wait for one that still
// holds it, as a process restarting on the same volume may find its predecessor still
// closing. The operating system lets go of it when the process ends, however it ends.
// A store still held after wait is ErrUnavailable; a ctx that ends first returns its
// error.
func lockStore(ctx context.Context, dir string, wait time.Duration) (*flock.Flock, error) {
	path := filepath.Join(dir, storeLockFile)
	lock := flock.New(path)
	start := time.Now()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		// Tried before ctx is looked at: a free store is taken whatever ctx says, as
		// the rest of NewEmbedded reports ctx's end itself.
		ok, err := lock.TryLock()
		switch {
		case err != nil:
			return nil, fmt.Errorf("embedded nats: store %s: lock %s (the store's file system must support file locks): %w", dir, path, err)
		case ok:
			return lock, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("embedded nats: store %s: waiting for another broker to let go of it: %w", dir, ctx.Err())
		case <-deadline.C:
			return nil, fmt.Errorf("%w: embedded nats: store %s is served by another broker (it holds %s; waited %s)",
				ErrUnavailable, dir, path, time.Since(start).Round(time.Millisecond))
		case <-time.After(storeLockRetry):
		}
	}
}
