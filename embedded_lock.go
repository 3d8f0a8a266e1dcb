package mq

import (
	"context"
	"errors"
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

// lockStore takes dir's lock for this broker, waiting up to wait (and ctx) for one that
// still holds it, as a process restarting on the same volume may find its predecessor
// still closing. The operating system lets go of it when the process ends, however it
// ends. A store still held then is ErrUnavailable.
func lockStore(ctx context.Context, dir string, wait time.Duration) (*flock.Flock, error) {
	path := filepath.Join(dir, storeLockFile)
	lock := flock.New(path)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ok, err := lock.TryLockContext(wctx, storeLockRetry)
	switch {
	case ok:
		return lock, nil
	case err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
		return nil, fmt.Errorf("embedded nats: store %s: lock %s: %w", dir, path, err)
	}
	return nil, errors.Join(fmt.Errorf("%w: embedded nats: store %s is served by another broker (it holds %s; waited %s)",
		ErrUnavailable, dir, path, wait), ctx.Err())
}
