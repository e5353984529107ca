package snapshotdb

import (
	"crypto/sha256"
	"io"
	"os"
)

// TrailerSize is the size of the sha256 trailer etcd appends to a snapshot
// it sends (etcdctl and etcdutl check it before a restore).
const TrailerSize = sha256.Size

// HasTrailer is etcdutl's test for the sha256 trailer: etcd snapshots are a
// whole number of 512-byte sectors plus the 32-byte digest.
func HasTrailer(size int64) bool { return size%512 == TrailerSize }

// AppendTrailer appends the sha256 of the database, as etcd does to a
// snapshot it sends.
func AppendTrailer(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if _, err := f.Write(h.Sum(nil)); err != nil {
		return err
	}
	return f.Sync()
}
