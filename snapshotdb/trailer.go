package snapshotdb

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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

// FileDigest is a snapshot file read whole once: its sha256 (as sha256sum
// prints it) and whether etcd's sha256 trailer matches its database.
type FileDigest struct {
	Size   int64
	SHA256 string
	// HasTrailer: the file's size is that of a snapshot with etcd's trailer;
	// Trailer: the trailer matches the sha256 of the database before it.
	HasTrailer, Trailer bool
}

// Digest reads path once for both sums.
func Digest(path string) (FileDigest, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileDigest{}, FileError(path, "%v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return FileDigest{}, FileError(path, "%v", err)
	}
	d := FileDigest{Size: fi.Size(), HasTrailer: HasTrailer(fi.Size())}
	whole, data := sha256.New(), sha256.New()
	dataSize := d.Size
	if d.HasTrailer {
		dataSize -= TrailerSize
	}
	if _, err := io.CopyN(io.MultiWriter(whole, data), f, dataSize); err != nil {
		return FileDigest{}, FileError(path, "read: %v", err)
	}
	trailer, err := io.ReadAll(f)
	if err != nil {
		return FileDigest{}, FileError(path, "read: %v", err)
	}
	whole.Write(trailer)
	d.SHA256 = hex.EncodeToString(whole.Sum(nil))
	d.Trailer = d.HasTrailer && bytes.Equal(trailer, data.Sum(nil))
	return d, nil
}
