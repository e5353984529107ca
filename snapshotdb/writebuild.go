package snapshotdb

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/encoding/protowire"

	"kube-etcd-migrate/internal/input"
)

// Result describes the output written.
type WriteResult struct {
	Path string
	Size int64
	// Revision is the output's revision, to which it is compacted.
	Revision int64
	// Keys counts its keys; Rewritten those written by the run (at new
	// revisions); Deleted the input's keys the run deleted (not in the
	// output); LeasedKeys those attached to a lease.
	Keys, Rewritten, Deleted, LeasedKeys int64
}

// chunkBytes is how much is copied in one bbolt transaction of the output,
// and read through one mapping of the input, before the transaction is
// committed and the mapping dropped: what bounds the memory of a build. A
// variable for the tests.
var chunkBytes = 8 << 20

// Finish builds the output from the input and the writes, and publishes it
// atomically at the output path (an existing file is replaced only with
// force). A build that fails leaves no file behind. The writer is closed.
func (w *Writer) Finish(ctx context.Context, force bool) (res WriteResult, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.log == nil {
		return res, input.Errorf("%s %s: the writer is closed", input.OutputSnapshot, w.out)
	}
	defer func() {
		w.log.Close()
		w.log, w.logw = nil, nil
	}()
	if fe := w.stopped.Load(); fe != nil {
		return res, fe
	}
	if err := w.logw.Flush(); err != nil {
		return res, input.Errorf("%s %s: store the new values beside it: %w", input.OutputSnapshot, w.out, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(w.out), "."+filepath.Base(w.out)+".new-*")
	if err != nil {
		return res, input.Errorf("%s %s: %w", input.OutputSnapshot, w.out, err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	building(tmpPath, true)
	defer func() {
		os.Remove(tmpPath) // after Publish, a name no longer there
		building(tmpPath, false)
	}()
	b := &builder{w: w, ctx: ctx, res: WriteResult{Path: w.out, Revision: w.next, Rewritten: w.rewritten, Deleted: w.deleted}}
	if err := b.build(tmpPath); err != nil {
		return res, err
	}
	if err := AppendTrailer(tmpPath); err != nil {
		return res, input.Errorf("%s %s: %w", input.OutputSnapshot, w.out, err)
	}
	fi, err := os.Stat(tmpPath)
	if err != nil {
		return res, input.Errorf("%s %s: %w", input.OutputSnapshot, w.out, err)
	}
	b.res.Size = fi.Size()
	if err := Publish(tmpPath, w.out, force); err != nil {
		return res, input.Errorf("%s %s: %w", input.OutputSnapshot, w.out, err)
	}
	return b.res, nil
}

// The outputs being built, for RemoveTempFiles.
var (
	buildMu sync.Mutex
	builds  = map[string]bool{}
)

func building(path string, on bool) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if on {
		builds[path] = true
	} else {
		delete(builds, path)
	}
}

// RemoveTempFiles removes the outputs being built. It is for a process about
// to exit without running its deferred calls (a second SIGINT); the values'
// temporary files were unlinked when created.
func RemoveWriterFiles() {
	buildMu.Lock()
	defer buildMu.Unlock()
	for p := range builds {
		os.Remove(p)
	}
}

// builder is one build of the output.
type builder struct {
	w   *Writer
	ctx context.Context
	res WriteResult

	in    *bolt.DB
	inTx  *bolt.Tx
	out   *bolt.DB
	outTx *bolt.Tx
	n     int // bytes put since the last commit
}

// The number of mvccpb.KeyValue's lease field, from its own descriptor.
var leaseField = (&mvccpb.KeyValue{}).ProtoReflect().Descriptor().Fields().ByName("lease").Number()

// hasLease says whether an encoded KeyValue has a lease, without decoding
// its value.
func hasLease(v []byte) (bool, error) {
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return false, protowire.ParseError(n)
		}
		v = v[n:]
		if num == leaseField && typ == protowire.VarintType {
			l, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false, protowire.ParseError(n)
			}
			return l != 0, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, v)
		if n < 0 {
			return false, protowire.ParseError(n)
		}
		v = v[n:]
	}
	return false, nil
}

func (b *builder) inErr(format string, args ...any) error {
	return fmt.Errorf("snapshot file %s: %w", b.w.in.Info.Path, fmt.Errorf(format, args...))
}

func (b *builder) outErr(err error) error {
	return input.Errorf("%s %s: %w", input.OutputSnapshot, b.w.out, err)
}

// openIn opens the input read-only, checking it is the file the run read.
func (b *builder) openIn() error {
	path := b.w.in.Info.Path
	fi, err := os.Stat(path)
	if err != nil {
		return b.inErr("%v", err)
	}
	if fi.Size() != b.w.in.Info.Size {
		return b.inErr("changed while it was being read")
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return b.inErr("locked by a running etcd member")
	}
	if err != nil {
		return b.inErr("%v", err)
	}
	tx, err := db.Begin(false)
	if err != nil {
		db.Close()
		return b.inErr("read: %v", err)
	}
	b.in, b.inTx = db, tx
	return nil
}

func (b *builder) closeIn() {
	if b.inTx != nil {
		_ = b.inTx.Rollback()
		b.inTx = nil
	}
	if b.in != nil {
		_ = b.in.Close()
		b.in = nil
	}
}

// build writes the database at path.
func (b *builder) build(path string) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if p := recover(); p != nil {
			err = b.inErr("damaged database: %v", p)
		}
		b.closeIn()
		if b.outTx != nil {
			_ = b.outTx.Rollback()
		}
		if b.out != nil {
			if cerr := b.out.Close(); err == nil && cerr != nil {
				err = b.outErr(cerr)
			}
		}
	}()
	// No fsync per transaction: the trailer's fsync makes the file
	// durable before it is published.
	b.out, err = bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoGrowSync: true, Timeout: time.Second})
	if err != nil {
		return b.outErr(err)
	}
	if b.outTx, err = b.out.Begin(true); err != nil {
		return b.outErr(err)
	}
	if err := b.openIn(); err != nil {
		return err
	}
	var names [][]byte
	if err := b.inTx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		names = append(names, bytes.Clone(name))
		return nil
	}); err != nil {
		return b.inErr("%v", err)
	}
	keyName := schema.Key.Name()
	for _, name := range names {
		if bytes.Equal(name, keyName) {
			continue
		}
		if err := b.copyBucket(name, nil); err != nil {
			return err
		}
	}
	if err := b.copyKeys(); err != nil {
		return err
	}
	// The records copied point into the input's mapping until committed.
	if err := b.commit(); err != nil {
		return err
	}
	b.closeIn()
	if err := b.appendWrites(); err != nil {
		return err
	}
	// Compacted at its revision, as etcd's compaction leaves a store: the
	// latest record of each key, nothing older.
	uw := &unsafeWriter{tx: b.outTx}
	mvcc.UnsafeSetScheduledCompact(uw, b.res.Revision)
	mvcc.UnsafeSetFinishedCompact(uw, b.res.Revision)
	if uw.err != nil {
		return b.outErr(uw.err)
	}
	err = b.outTx.Commit()
	b.outTx = nil
	if err != nil {
		return b.outErr(err)
	}
	return nil
}

// outBucket is the output's bucket name in the current transaction, created
// with the input's sequence.
func (b *builder) outBucket(name []byte, seq uint64) (*bolt.Bucket, error) {
	ob, err := b.outTx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, b.outErr(err)
	}
	// Written in key order: pages filled whole.
	ob.FillPercent = 1.0
	if ob.Sequence() != seq {
		if err := ob.SetSequence(seq); err != nil {
			return nil, b.outErr(err)
		}
	}
	return ob, nil
}

// keyBucket is the output's key bucket (copied from the input's) in the
// current transaction.
func (b *builder) keyBucket() (*bolt.Bucket, error) {
	ob := b.outTx.Bucket(schema.Key.Name())
	if ob == nil {
		return nil, b.outErr(errors.New("no key bucket"))
	}
	ob.FillPercent = 1.0
	return ob, nil
}

// put puts one record, and says whether chunkBytes were put since the
// last commit: then the caller commits (and drops the input's mapping,
// after copying what it needs of it).
func (b *builder) put(ob *bolt.Bucket, k, v []byte) (bool, error) {
	if err := ob.Put(k, v); err != nil {
		return false, b.outErr(err)
	}
	b.n += len(k) + len(v)
	if b.n < chunkBytes {
		return false, nil
	}
	if err := b.ctx.Err(); err != nil {
		return false, b.outErr(fmt.Errorf("not written: %w", err))
	}
	return true, nil
}

// commit commits the output's transaction and begins the next.
func (b *builder) commit() error {
	b.n = 0
	err := b.outTx.Commit()
	b.outTx = nil
	if err != nil {
		return b.outErr(err)
	}
	if b.outTx, err = b.out.Begin(true); err != nil {
		return b.outErr(err)
	}
	return nil
}

// copyBucket copies the input's bucket name whole, or, with keep, the
// records keep says.
func (b *builder) copyBucket(name []byte, keep func(k, v []byte) (bool, error)) error {
	ib := b.inTx.Bucket(name)
	if ib == nil {
		return b.inErr("changed while it was being read: no bucket %q", name)
	}
	ob, err := b.outBucket(name, ib.Sequence())
	if err != nil {
		return err
	}
	c := ib.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			return b.inErr("bucket %q holds a nested bucket %q: not an etcd database", name, k)
		}
		if keep != nil {
			ok, err := keep(k, v)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
		}
		full, err := b.put(ob, k, v)
		if err != nil {
			return err
		}
		if full {
			// k and v are in the input's mapping: dropped after the commit.
			last := bytes.Clone(k)
			if err := b.commit(); err != nil {
				return err
			}
			b.closeIn()
			if err := b.openIn(); err != nil {
				return err
			}
			if ib = b.inTx.Bucket(name); ib == nil {
				return b.inErr("changed while it was being read: no bucket %q", name)
			}
			if ob, err = b.outBucket(name, ib.Sequence()); err != nil {
				return err
			}
			c = ib.Cursor()
			if k, _ = c.Seek(last); k == nil || !bytes.Equal(k, last) {
				return b.inErr("changed while it was being read")
			}
		}
	}
	return nil
}

// copyKeys copies the records of etcd's key bucket that are live at the
// input's revision and were not rewritten, in revision order.
func (b *builder) copyKeys() error {
	w := b.w
	j := 0
	var kept int64
	err := b.copyBucket(schema.Key.Name(), func(k, v []byte) (bool, error) {
		if len(k) < 17 {
			return false, b.inErr("damaged key record %x", k)
		}
		if mvcc.IsTombstone(k) {
			return false, nil
		}
		bk := mvcc.BytesToBucketKey(k)
		p, ok := pack(bk.Main, bk.Sub)
		if !ok {
			return false, nil // not live (New packed every live one)
		}
		for j < len(w.live) && w.live[j] < p {
			j++
		}
		if j == len(w.live) || w.live[j] != p || w.gone[j/64]&(1<<(j%64)) != 0 {
			return false, nil
		}
		leased, err := hasLease(v)
		if err != nil {
			return false, b.inErr("damaged key record %x: %v", k, err)
		}
		if leased {
			b.res.LeasedKeys++
		}
		kept++
		return true, nil
	})
	if err != nil {
		return err
	}
	if want := int64(len(w.live)) - w.rewritten - w.deleted; kept != want {
		return b.inErr("changed while it was being read: %d of its %d live key record(s) found", kept, want)
	}
	b.res.Keys = kept
	return nil
}

// appendWrites appends the run's records, at their new revisions.
func (b *builder) appendWrites() error {
	w := b.w
	ob, err := b.keyBucket()
	if err != nil {
		return err
	}
	size, err := w.log.Seek(0, io.SeekEnd)
	if err != nil {
		return b.outErr(err)
	}
	lr := &logReader{r: bufio.NewReaderSize(io.NewSectionReader(w.log, 0, size), 1<<20)}
	for {
		rev, rec, err := lr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return b.outErr(fmt.Errorf("read the new values back: %w", err))
		}
		if w.superseded[rev] {
			continue
		}
		leased, err := hasLease(rec)
		if err != nil {
			return b.outErr(fmt.Errorf("read the new values back: %w", err))
		}
		if leased {
			b.res.LeasedKeys++
		}
		b.res.Keys++
		// bbolt keeps the slices until the commit: the reader's buffer is reused.
		k := mvcc.RevToBytes(mvcc.Revision{Main: rev}, mvcc.NewRevBytes())
		full, err := b.put(ob, k, bytes.Clone(rec))
		if err != nil {
			return err
		}
		if full {
			if err := b.commit(); err != nil {
				return err
			}
			if ob, err = b.keyBucket(); err != nil {
				return err
			}
		}
	}
	return nil
}

// unsafeWriter is etcd's backend.UnsafeWriter on a bbolt write transaction,
// for etcd's own writers of the meta bucket; the first error is kept.
type unsafeWriter struct {
	tx  *bolt.Tx
	err error
}

var _ backend.UnsafeWriter = (*unsafeWriter)(nil)

func (u *unsafeWriter) keep(err error) {
	if u.err == nil && err != nil {
		u.err = err
	}
}

func (u *unsafeWriter) UnsafeCreateBucket(bucket backend.Bucket) {
	_, err := u.tx.CreateBucketIfNotExists(bucket.Name())
	u.keep(err)
}

func (u *unsafeWriter) UnsafeDeleteBucket(bucket backend.Bucket) {
	u.keep(u.tx.DeleteBucket(bucket.Name()))
}

func (u *unsafeWriter) UnsafePut(bucket backend.Bucket, key, value []byte) {
	b, err := u.tx.CreateBucketIfNotExists(bucket.Name())
	if err != nil {
		u.keep(err)
		return
	}
	u.keep(b.Put(key, value))
}

func (u *unsafeWriter) UnsafeSeqPut(bucket backend.Bucket, key, value []byte) {
	u.UnsafePut(bucket, key, value)
}

func (u *unsafeWriter) UnsafeDelete(bucket backend.Bucket, key []byte) {
	if b := u.tx.Bucket(bucket.Name()); b != nil {
		u.keep(b.Delete(key))
	}
}
