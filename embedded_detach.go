package mq

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/minio/highwayhash"
)

// Keeping the history from attaching partitions while the server recovers the store.
//
// nats-server restores streams in parallel and adds each stream's consumers only after
// the stream itself. A history restored first attaches its partitions 100-200 ms
// later; one that lands on a partition restored but whose durable is not added yet
// creates the source consumer there, and creating a sourcing consumer on a standalone
// server resets it to its floor, which on an interest stream removes every event at or
// below it that no consumer added so far wants: every event the history had copied
// and the worker had not acknowledged. The durable's name sorting first
// (ingestConsumerSortsFirst) covers the recovery's own order, not this. Seen under
// load in the conformance suite: a partition's 81 unacknowledged events gone after a
// restart, with the server logging that the source consumer it then recovered
// already existed; in 3 of about 200 loaded runs, and in none of 60 after this.
//
// So the history starts without its sources: detachHistory removes them from its
// stored configuration before the server starts, and the boot sets them again
// (createStream with the topology's history) once every partition and its durable are
// recovered. The history then resumes each partition after the last event it copied.
// Until then the partitions' source consumers, recovered after the durable, keep what
// the history has not copied. Detached, the history has the server's default subject,
// its own name, for the boot's few hundred milliseconds; nothing of mq publishes to it.

// Names in nats-server's file store (filestore.go), read in v2.15.3.
const (
	storeMetaFile     = "meta.inf"
	storeMetaSum      = "meta.sum"
	storeMetaKey      = "meta.key"
	storeMetaPending  = ".new" // detachHistory's copies before they replace the store's
	storeConsumersDir = "obs"  // a stream's consumers, one directory each, named as the consumer
)

// storeStreamDir is where stream lives in the file store under dir, for the
// in-process account ($G).
func storeStreamDir(dir, stream string) string {
	return filepath.Join(dir, "jetstream", "$G", "streams", stream)
}

// detachHistory removes the sources from the history's stored configuration in dir,
// before the server starts. It does nothing to a store without a history, to a history
// without sources, or to an encrypted one. It writes the configuration and its
// checksum as new files first and renames them over the old ones in that order; a
// crash between the two renames is finished at the next start.
func (e *EmbeddedNATS) detachHistory(dir string) error {
	sdir := storeStreamDir(dir, e.topo.HistoryStream)
	detached, err := detachSources(e.topo.HistoryStream, sdir)
	if err != nil {
		return fmt.Errorf("embedded nats: store %s: detach the history's sources: %w", sdir, err)
	}
	if detached {
		e.log.Debug("mq: the history starts without its sources; the start attaches them once the partitions are recovered",
			"stream", e.topo.HistoryStream)
	}
	return nil
}

// detachSources is detachHistory on stream's directory sdir: it reports whether it
// removed sources.
func detachSources(stream, sdir string) (bool, error) {
	meta, sum := filepath.Join(sdir, storeMetaFile), filepath.Join(sdir, storeMetaSum)
	if err := finishDetach(stream, meta, sum); err != nil {
		return false, err
	}
	buf, err := os.ReadFile(meta)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // a new store
	}
	if err != nil {
		return false, err
	}
	if _, err := os.Stat(filepath.Join(sdir, storeMetaKey)); err == nil {
		return false, nil // encrypted: not this broker's store
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(buf, &cfg); err != nil {
		return false, err
	}
	if _, ok := cfg["sources"]; !ok {
		return false, nil
	}
	delete(cfg, "sources")
	out, err := json.Marshal(cfg)
	if err != nil {
		return false, err
	}
	checksum, err := storeChecksum(stream, out)
	if err != nil {
		return false, err
	}
	if err := writeSynced(meta+storeMetaPending, out); err != nil {
		return false, err
	}
	if err := writeSynced(sum+storeMetaPending, []byte(checksum)); err != nil {
		return false, err
	}
	if err := os.Rename(meta+storeMetaPending, meta); err != nil {
		return false, err
	}
	if err := os.Rename(sum+storeMetaPending, sum); err != nil {
		return false, err
	}
	return true, syncDir(sdir)
}

// finishDetach completes or drops a detachHistory that a crash interrupted. With
// only the new checksum left, the configuration was renamed already and the checksum
// follows, if it is the configuration's (anything else opened the store since, the
// stale file goes); with both left, neither was renamed, and the old pair stands.
func finishDetach(stream, meta, sum string) error {
	_, metaErr := os.Stat(meta + storeMetaPending)
	pending, sumErr := os.ReadFile(sum + storeMetaPending)
	switch {
	case sumErr != nil: // no new checksum: a lone new configuration was never renamed
		if metaErr == nil {
			return os.Remove(meta + storeMetaPending)
		}
		return nil
	case metaErr == nil:
		if err := os.Remove(meta + storeMetaPending); err != nil {
			return err
		}
		return os.Remove(sum + storeMetaPending)
	}
	buf, err := os.ReadFile(meta)
	if err != nil {
		return err
	}
	if want, err := storeChecksum(stream, buf); err != nil || want != string(pending) {
		return os.Remove(sum + storeMetaPending)
	}
	return os.Rename(sum+storeMetaPending, sum)
}

// storeChecksum is the checksum nats-server keeps beside a stream's configuration:
// HighwayHash-64 keyed with the SHA-256 of the stream's name, in hex.
func storeChecksum(stream string, meta []byte) (string, error) {
	key := sha256.Sum256([]byte(stream))
	hh, err := highwayhash.NewDigest64(key[:])
	if err != nil {
		return "", err
	}
	_, _ = hh.Write(meta)
	return hex.EncodeToString(hh.Sum(nil)), nil
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}

// writeSynced writes data to path and syncs it, so a rename after it never exposes a
// file the disk does not hold yet.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
