package snapshotdb

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
)

// Hash says how the file's integrity was established.
type Hash string

const (
	// HashVerified: the file ends with the sha256 trailer etcd appends to a
	// snapshot, and it matches the database.
	HashVerified Hash = "verified"
	// HashSkipped: --skip-hash-check; the database structure and every record
	// were read through instead.
	HashSkipped Hash = "skipped"
)

// FileError is a one-line error naming the file: "snapshot file PATH: ...".
// Its arguments are written down or copied when it is made: none keeps a
// pointer into the file's mapping, unmapped by the time the message is
// written (a []byte read through bbolt, a panic's value).
func FileError(path string, format string, args ...any) error {
	for i, a := range args {
		switch a := a.(type) {
		case input.Name:
		case error:
			args[i] = textfmt.OneLine(a.Error())
		case string:
			args[i] = textfmt.OneLine(a)
		case []byte:
			args[i] = string(a)
		case fmt.Stringer:
			args[i] = textfmt.OneLine(a.String())
		}
	}
	return input.Errorf("snapshot file %s: "+format, append([]any{path}, args...)...)
}

// damagedRemedy is what to do with a damaged file: the tool never repairs one.
const damagedRemedy = "the file is damaged: use another copy of it (an earlier backup, or another member's member/snap/db)"

// damaged is the error for a file whose database is damaged: what is wrong,
// and what to do.
func damaged(path string, format string, args ...any) error {
	return FileError(path, "damaged database: "+format+"; "+damagedRemedy, args...)
}

// changedOrDamaged is the error for a fault or a record not found where a
// read found it: the file changed while it was being read when its size,
// modification time or identity differ from opened's (or it is gone); else
// nothing changed it, and its database is damaged (what says how).
func changedOrDamaged(path string, opened os.FileInfo, format string, args ...any) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return FileError(path, "changed while it was being read: %v", err)
	case opened == nil:
	case fi.Size() < opened.Size():
		return FileError(path, "changed while it was being read: truncated from %d to %d bytes", opened.Size(), fi.Size())
	case fi.Size() != opened.Size() || !fi.ModTime().Equal(opened.ModTime()) || !os.SameFile(fi, opened):
		return FileError(path, "changed while it was being read (modified at %s)", fi.ModTime().UTC().Format(time.RFC3339))
	}
	return damaged(path, format, args...)
}

// keyHex writes a record's key of a damaged file in hex, its first 24 bytes
// at most (etcd's revision keys are 17 or 18).
func keyHex(k []byte) string {
	if len(k) <= 24 {
		return fmt.Sprintf("%x", k)
	}
	return fmt.Sprintf("%x... (%d bytes)", k[:24], len(k))
}

// quoted writes a bucket's name of a damaged file quoted, its first 64 bytes
// at most.
func quoted(b []byte) string {
	if len(b) <= 64 {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q... (%d bytes)", b[:64], len(b))
}

// recovered writes a recovered panic's value as words, then: a value of
// bbolt's or of the runtime's may point into the mapping.
func recovered(p any) string {
	if err, ok := p.(error); ok {
		return textfmt.OneLine(err.Error())
	}
	return textfmt.OneLine(fmt.Sprint(p))
}

// Check establishes that path is an etcd snapshot that etcd's restore code
// can read, without writing to it. With the hash checked, only the database
// header and etcd's buckets are looked at (the digest proves the rest is what
// etcd wrote); without it, every record of every bucket is read through etcd's
// own decoders, so that a damaged file fails here with a message instead of
// crashing etcd's restore. It also returns the versions the file records
// (Versions.Storage is "" for etcd 3.5 and older, which record none).
func Check(path string, skipHash bool) (size int64, hash Hash, v Versions, err error) {
	fi, hash, v, err := check(path, skipHash)
	if err != nil {
		return 0, "", Versions{}, err
	}
	return fi.Size(), hash, v, nil
}

// check is Check, returning what the file was when it was checked.
func check(path string, skipHash bool) (fi os.FileInfo, hash Hash, v Versions, err error) {
	fi, err = os.Stat(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, "", Versions{}, FileError(path, "%v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, "", Versions{}, FileError(path, "not a regular file")
	}
	size := fi.Size()
	dataSize := size
	if HasTrailer(size) {
		dataSize -= TrailerSize
	}
	switch {
	case skipHash:
		hash = HashSkipped
	case !HasTrailer(size):
		return nil, "", Versions{}, FileError(path, "no sha256 trailer: truncated, or not a snapshot saved by etcdctl/etcdutl (a member's member/snap/db has none: read it with %s)", input.SkipHashCheck)
	default:
		if err := checkDigest(path, dataSize); err != nil {
			return nil, "", Versions{}, err
		}
		hash = HashVerified
	}
	v, err = checkDatabase(path, fi, dataSize, hash != HashVerified)
	if err != nil {
		return nil, "", Versions{}, err
	}
	return fi, hash, v, nil
}

// checkDigest compares the sha256 of the first dataSize bytes with the trailer.
func checkDigest(path string, dataSize int64) error {
	f, err := os.Open(path)
	if err != nil {
		return FileError(path, "%v", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, dataSize); err != nil {
		return FileError(path, "read: %v", err)
	}
	trailer := make([]byte, TrailerSize)
	if _, err := io.ReadFull(f, trailer); err != nil {
		return FileError(path, "read the sha256 trailer: %v", err)
	}
	if !bytes.Equal(h.Sum(nil), trailer) {
		return FileError(path, "sha256 of the database does not match the trailer etcd wrote: the file is corrupt or truncated (%s reads it anyway)", input.SkipHashCheck)
	}
	return nil
}

// checkDatabase opens the file read-only with bbolt (etcd's storage engine) in
// a goroutine of its own that turns memory faults into panics, so that a
// damaged file is an error, never a crash. With full (its digest not
// checked), its pages are walked before bbolt reads a bucket (checkPages:
// bbolt trusts them), and every record of every bucket is then read through
// (checkRecords); a file whose digest matches is the database etcd wrote,
// page for page.
func checkDatabase(path string, fi os.FileInfo, dataSize int64, full bool) (v Versions, err error) {
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				done <- changedOrDamaged(path, fi, "%s", recovered(r))
			}
		}()
		done <- readDatabase(path, dataSize, full, &v)
	}()
	if err := <-done; err != nil || !full {
		return v, err
	}
	return v, checkRecords(path, fi, dataSize)
}

// readDatabase checks the database's header: its size, with pages its
// pages (checkPages), and etcd's buckets; and reads the versions it records.
func readDatabase(path string, dataSize int64, pages bool, v *Versions) error {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return FileError(path, "locked by a running etcd member: stop the member or copy the file first")
	}
	if err != nil {
		return FileError(path, "not an etcd snapshot: %v", err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		if tx.Size() > dataSize {
			return FileError(path, "truncated: the database needs %d bytes, the file holds %d; %s", tx.Size(), dataSize, damagedRemedy)
		}
		if pages {
			if err := checkPages(path, uint64(tx.ID()), db.Info().PageSize, dataSize); err != nil {
				return err
			}
		}
		for _, b := range []interface{ Name() []byte }{schema.Key, schema.Meta} {
			if tx.Bucket(b.Name()) == nil {
				return FileError(path, "not an etcd snapshot: no %q bucket", b.Name())
			}
		}
		*v = ReadVersions(tx)
		return nil
	})
}

// Versions are the etcd versions a database file records: its storage schema
// version (etcd 3.6 and later) and the cluster version.
type Versions struct{ Storage, Cluster string }

// ReadVersions reads them with etcd's own bucket and key names.
func ReadVersions(tx *bolt.Tx) Versions {
	var v Versions
	if sv := schema.ReadStorageVersionFromSnapshot(tx); sv != nil {
		v.Storage = sv.String()
	}
	if b := tx.Bucket(schema.Cluster.Name()); b != nil {
		v.Cluster = string(b.Get(schema.ClusterClusterVersionKeyName))
	}
	return v
}

// checkRecords reads every record of every bucket through etcd's own
// decoders. The file's pages it maps are the page cache's, not the process's
// private memory, which stays flat whatever the size of the file.
func checkRecords(path string, fi os.FileInfo, dataSize int64) error {
	f := &File{Info: Info{Path: path, Size: fi.Size()}, opened: fi, dataSize: dataSize, txID: -1}
	return f.view(func(r *reader) error {
		f.txID = r.tx.ID()
		var names [][]byte
		_ = r.tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			names = append(names, bytes.Clone(name))
			return nil
		})
		for _, name := range names {
			check := checkRecord(name)
			c := r.tx.Bucket(name).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if err := check(k, v); err != nil {
					return damaged(path, "%s record %s: %v", quoted(name), keyHex(k), err)
				}
			}
		}
		return nil
	})
}

// checkRecord returns the validation of one record of bucket name: the key
// bucket holds revisions and mvccpb.KeyValue, the lease bucket leasepb.Lease,
// as etcd's restore reads them.
func checkRecord(name []byte) func(k, v []byte) error {
	switch {
	case bytes.Equal(name, schema.Key.Name()):
		return func(k, v []byte) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("%v", r)
				}
			}()
			mvcc.BytesToBucketKey(k) // panics on a malformed revision
			return proto.Unmarshal(v, &mvccpb.KeyValue{})
		}
	case bytes.Equal(name, schema.Lease.Name()):
		return func(_, v []byte) error {
			return proto.Unmarshal(v, &leasepb.Lease{})
		}
	}
	return func(_, _ []byte) error { return nil }
}
