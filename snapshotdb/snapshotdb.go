// Package snapshotdb is etcd's backup files: an etcd snapshot file — what
// `etcdctl snapshot save`, `migrate --snapshot` or an --output-snapshot wrote,
// or a member's member/snap/db — checked (etcd's sha256 trailer, the bbolt
// structure, etcd's buckets), then read in place, or written anew. The
// package links no etcd server: a backup is never restored to be read or
// written.
//
// Read in place (Open, File), read-only, as an etcdscan.Source for every
// command: no restore, no etcd, no copy of the file.
// etcd's bbolt database is read with bbolt in read-only mode, the
// revision-keyed records through etcd's own mvcc revision encoding and
// mvccpb.KeyValue, and the meta and lease buckets through etcd's own schema
// and mvcc readers: a key at revision R is its latest record at or below R
// unless that is a tombstone, and revisions below the compaction are refused,
// as etcd reads them. The records are ordered by revision, not key: the reads
// at a revision share an index of each key's latest record, built in one pass
// over the records as an external sort (runs of bounded memory, spilled to
// unlinked temporary files in $TMPDIR, merged; see index.go), and the records
// are then read in key order through the file's memory mapping, whose pages
// are the page cache's: private memory stays flat whatever the size of the
// file.
//
// Written anew (NewWriter, Writer, write.go and writebuild.go) for the
// --output-snapshot of migrate and quarantine from a file read in place: the
// run's writes (updates and deletes, compare-and-swap as etcd's) kept beside
// the output, the output built with bbolt and etcd's encodings, no etcd.
//
// Every writer finishes its file here: etcd's trailer appended
// (AppendTrailer) and the file published whole (Publish), so that the
// trailer is known in one place.
package snapshotdb

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
)

// Options tune Open.
type Options struct {
	// SkipHashCheck reads a file without etcd's sha256 trailer (a member's
	// member/snap/db) or whose trailer does not match, as etcdutl's
	// --skip-hash-check does; every record is then read through once.
	SkipHashCheck bool
}

// Info describes an open snapshot file.
type Info struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Hash Hash   `json:"hash"`
	// Revision is the snapshot's revision: what a read sees by default.
	Revision int64 `json:"revision"`
	// CompactRevision is the oldest revision still readable (--revision); 0
	// when the keyspace was never compacted.
	CompactRevision int64 `json:"compactRevision"`
	// Leases counts the etcd leases in the snapshot.
	Leases int `json:"leases"`
	// StorageVersion is the etcd storage schema version the file records
	// ("" before etcd 3.6); ClusterVersion its cluster version.
	StorageVersion string `json:"storageVersion,omitempty"`
	ClusterVersion string `json:"clusterVersion,omitempty"`
}

// File is a snapshot file opened for reading in place. Its methods open the
// database afresh for each call (a read-only bbolt handle is cheap to open)
// and share only the last pass's window (under a lock), so a File is safe
// for concurrent use.
type File struct {
	Info Info

	opened   os.FileInfo // the file when it was checked: a fault, or a record not found again, is its change or its damage (changedOrDamaged)
	dataSize int64       // the database's bytes (the file less etcd's trailer)
	txID     int         // the database's transaction ID when opened: a reopen must see the same

	building sync.Mutex // held while an index is built
	mu       sync.Mutex
	cache    []*index     // the indexes of the last revisions read, the latest first
	passes   atomic.Int64 // passes over the file made (tests)
	spills   atomic.Int64 // runs of an index spilled to disk (tests)
}

// Open checks the file at path and reads its revisions and leases. The file
// is opened read-only and never changed. Errors are one line naming the file.
func Open(path string, opts Options) (*File, error) {
	fi, hash, v, err := check(path, opts.SkipHashCheck)
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	f := &File{Info: Info{Path: path, Size: size, Hash: hash, StorageVersion: v.Storage, ClusterVersion: v.Cluster}, opened: fi, dataSize: size, txID: -1}
	if HasTrailer(size) {
		f.dataSize -= 32
	}
	err = f.view(func(r *reader) error {
		f.txID = r.tx.ID()
		return f.describe(r)
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Close drops the indexes of the keys the reads kept (the temporary file of
// each is closed once the last read using it ends); every read opened and
// closed the database itself. The File can still be read: an index is built
// again.
func (f *File) Close() error {
	f.forget()
	return nil
}

// forget drops the cached indexes.
func (f *File) forget() {
	if f == nil {
		return
	}
	f.mu.Lock()
	old := f.cache
	f.cache = nil
	f.mu.Unlock()
	for _, x := range old {
		x.release()
	}
}

// describe reads the revisions as etcd's store restores them, and the leases.
func (f *File) describe(r *reader) error {
	u := unsafeReader{r.tx}
	finished, _ := mvcc.UnsafeReadFinishedCompact(u)
	scheduled, _ := mvcc.UnsafeReadScheduledCompact(u)
	// etcd finishes a compaction that was scheduled but not finished when it
	// starts on the file: from then on, what is below it cannot be read.
	f.Info.CompactRevision = max(finished, scheduled)
	last := int64(1) // an empty store is at revision 1
	if k, _ := r.tx.Bucket(schema.Key.Name()).Cursor().Last(); k != nil {
		last = max(last, mvcc.BytesToBucketKey(k).Main)
	}
	// A compaction can have removed the tombstones of the newest revisions.
	f.Info.Revision = max(last, f.Info.CompactRevision)
	f.Info.Leases = len(schema.MustUnsafeGetAllLeases(u))
	return nil
}

// reader is one read-only bbolt handle on the file and its read transaction.
// The pages of the file it reads are the page cache's: mapped, they count in
// the process's resident set but not in its private memory, and the kernel
// reclaims them like any cached file.
type reader struct {
	f  *File
	db *bolt.DB
	tx *bolt.Tx
}

func (f *File) openReader() (*reader, error) {
	path := f.Info.Path
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, FileError(path, "locked by a running etcd member: stop the member or copy the file first")
	}
	if err != nil {
		return nil, FileError(path, "not an etcd snapshot: %v", err)
	}
	tx, err := db.Begin(false)
	if err != nil {
		db.Close()
		return nil, FileError(path, "read: %v", err)
	}
	if tx.Size() > f.dataSize || (f.txID >= 0 && tx.ID() != f.txID) {
		tx.Rollback()
		db.Close()
		return nil, changedOrDamaged(path, f.opened, "its meta page changed between two reads")
	}
	if tx.Bucket(schema.Key.Name()) == nil || tx.Bucket(schema.Meta.Name()) == nil {
		tx.Rollback()
		db.Close()
		return nil, FileError(path, "not an etcd snapshot: no %q or %q bucket", schema.Key.Name(), schema.Meta.Name())
	}
	return &reader{f: f, db: db, tx: tx}, nil
}

// bucket is etcd's key bucket.
func (r *reader) bucket() *bolt.Bucket { return r.tx.Bucket(schema.Key.Name()) }

func (r *reader) close() {
	if r.tx != nil {
		_ = r.tx.Rollback()
		r.tx = nil
	}
	if r.db != nil {
		_ = r.db.Close()
		r.db = nil
	}
}

// view runs fn on a fresh reader, in the calling goroutine with memory faults
// turned into panics (a file truncated or damaged under the reader), and any
// panic of bbolt or of etcd's decoders on a damaged record into a one-line
// error naming the file.
func (f *File) view(fn func(r *reader) error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	var r *reader
	defer func() {
		if p := recover(); p != nil {
			err = changedOrDamaged(f.Info.Path, f.opened, "%s", recovered(p))
		}
		if r != nil {
			r.close()
		}
	}()
	r, err = f.openReader()
	if err != nil {
		return err
	}
	return fn(r)
}

// unsafeReader is the read interface etcd's own schema and mvcc readers are
// written against (backend.UnsafeReader), on a bbolt read transaction, with
// etcd's semantics: no endKey reads the one key; a limit <= 0 is no limit.
type unsafeReader struct{ tx *bolt.Tx }

var _ backend.UnsafeReader = unsafeReader{}

func (u unsafeReader) UnsafeRange(bucket backend.Bucket, key, endKey []byte, limit int64) (keys [][]byte, vals [][]byte) {
	b := u.tx.Bucket(bucket.Name())
	if b == nil {
		return nil, nil
	}
	if len(endKey) == 0 {
		if v := b.Get(key); v != nil {
			return [][]byte{key}, [][]byte{v}
		}
		return nil, nil
	}
	if limit <= 0 {
		limit = math.MaxInt64
	}
	c := b.Cursor()
	for k, v := c.Seek(key); k != nil && bytes.Compare(k, endKey) < 0; k, v = c.Next() {
		keys, vals = append(keys, k), append(vals, v)
		if int64(len(keys)) >= limit {
			break
		}
	}
	return keys, vals
}

func (u unsafeReader) UnsafeForEach(bucket backend.Bucket, visitor func(k, v []byte) error) error {
	b := u.tx.Bucket(bucket.Name())
	if b == nil {
		return nil
	}
	return b.ForEach(visitor)
}

// errorf wraps err with the file's name.
func (f *File) errorf(format string, args ...any) error {
	return fmt.Errorf("snapshot file %s: %w", f.Info.Path, fmt.Errorf(format, args...))
}
