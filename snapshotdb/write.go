// The writer of an output snapshot: writes a new etcd snapshot file from one read in place
// (package snapshotdb) and the values a run rewrote, without an etcd and in
// flat memory, whatever the size of the file. A Writer takes the run's
// compare-and-swap puts as etcd would (each key's mod revision as read from
// the input, or as this writer wrote it): the new values go to an unlinked
// temporary file beside the output, in the order written, and the input's
// live records are known by revision only (8 bytes each, from the key index
// snapshotdb builds for the scan). Finish then builds the output with bbolt
// and etcd's own encodings (mvcc revisions, mvccpb.KeyValue, the meta
// bucket's compaction marks): every bucket of the input copied as it is but
// etcd's key bucket, which holds exactly one record per live key — a key not
// rewritten at its original revision with its original bytes, a rewritten one
// at a new revision above the input's (its create revision and lease kept,
// its version one more, as etcd's update does), a key the run deleted not
// at all — with no tombstone and no superseded record, and marked compacted
// at its revision, as etcd's own compaction leaves a store. The input's storage and cluster versions are in
// the copied meta and cluster buckets; etcd's sha256 trailer is appended, and
// the file published atomically (mode 0600). The input is never modified.

package snapshotdb

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
)

// CauseOutput is the cause of a write refused because the values could not be
// stored beside the output (a full disk, an I/O error): no later write can
// succeed.
const CauseOutput = "output-snapshot-write"

// Options tune a Writer.
type WriterOptions struct {
	// Track says which keys' writes are kept in memory, to be read back with
	// Get and written again (the CRDs a run trims after rewriting them): a
	// second write of a key not tracked is refused as a conflict.
	Track func(key string) bool
}

// Writer stores a run's writes for an output snapshot. It is safe for
// concurrent use.
type Writer struct {
	in    *File
	out   string
	opts  WriterOptions
	inRev int64

	mu   sync.Mutex
	live []uint64 // the input's live records, packed (pack), sorted
	gone []uint64 // a bit per live record: rewritten
	next int64    // the last revision given
	log  *os.File // the new records, in revision order (unlinked)
	logw *bufio.Writer
	// tracked: the latest write of each tracked key; superseded: revisions
	// of tracked keys' records written again since.
	tracked    map[string]etcdscan.KV
	superseded map[int64]bool
	removed    map[string]bool // tracked keys deleted
	rewritten  int64           // live records rewritten
	deleted    int64           // keys deleted

	calls   atomic.Int64
	stopped atomic.Pointer[etcdscan.FatalError]
}

// subBits is how many low bits of a packed revision hold its sub-revision:
// etcd numbers the operations of one transaction (at most --max-txn-ops,
// 128 by default) from 0.
const subBits = 20

func pack(main, sub int64) (uint64, bool) {
	if main < 0 || sub < 0 || sub >= 1<<subBits || main >= 1<<(63-subBits) {
		return 0, false
	}
	return uint64(main)<<subBits | uint64(sub), true
}

// New prepares a Writer for in, whose output will be out: it reads which
// records of in are live (the key index at in's revision, shared with a scan
// at that revision), and opens the temporary file of the new values in out's
// directory (unlinked at once: nothing is left behind whatever ends the
// process).
func NewWriter(ctx context.Context, in *File, out string, opts WriterOptions) (*Writer, error) {
	w := &Writer{in: in, out: out, opts: opts, inRev: in.Info.Revision, next: in.Info.Revision, tracked: map[string]etcdscan.KV{}, superseded: map[int64]bool{}, removed: map[string]bool{}}
	err := in.EachRevision(ctx, func(main, sub int64) error {
		p, ok := pack(main, sub)
		if !ok {
			return fmt.Errorf("snapshot file %s: revision %d_%d is beyond what an output snapshot is written for", in.Info.Path, main, sub)
		}
		w.live = append(w.live, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(w.live)
	w.live = slices.Clip(w.live)
	w.gone = make([]uint64, (len(w.live)+63)/64)
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".values-*")
	if err != nil {
		return nil, input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	os.Remove(f.Name())
	w.log, w.logw = f, bufio.NewWriterSize(f, 1<<20)
	return w, nil
}

// Close drops the temporary file of the values (Finish does it too).
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.log == nil {
		return nil
	}
	err := w.log.Close()
	w.log, w.logw = nil, nil
	return err
}

// Stopped returns the refusal that stopped the writer, nil while it writes.
func (w *Writer) Stopped() *etcdscan.FatalError { return w.stopped.Load() }

// Stats counts the writer's calls as transactions (nothing else applies).
func (w *Writer) Stats() etcdscan.WriterStats {
	return etcdscan.WriterStats{Txns: w.calls.Load()}
}

// Revision is the output's revision so far: the input's, or the last given.
func (w *Writer) Revision() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// Rewritten counts the keys written (a key written twice counts once; a key
// deleted is not counted).
func (w *Writer) Rewritten() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rewritten
}

// Get reads key as the output will hold it: a tracked key this writer wrote,
// else the input's.
func (w *Writer) Get(ctx context.Context, key string) (etcdscan.KV, bool, error) {
	w.mu.Lock()
	kv, ok := w.tracked[key]
	removed := w.removed[key]
	w.mu.Unlock()
	if removed {
		return etcdscan.KV{}, false, nil
	}
	if ok {
		kv.Value = slices.Clone(kv.Value)
		return kv, true, nil
	}
	return w.in.Get(ctx, key, 0)
}

// liveAt finds the live record (main, sub) not yet rewritten: its index.
func (w *Writer) liveAt(main, sub int64) (int, bool) {
	p, ok := pack(main, sub)
	if !ok {
		return 0, false
	}
	i, found := slices.BinarySearch(w.live, p)
	if !found || w.gone[i/64]&(1<<(i%64)) != 0 {
		return 0, false
	}
	return i, true
}

// Write stores puts as etcd's compare-and-swap would, one result per put: a
// put or delete whose key does not hold ModRevision (as read from the input,
// or as this writer wrote a tracked key) is a Conflict and writes nothing. A
// delete spends a revision, as etcd's does, and the output holds no trace
// of the key. Creations are not written to an output snapshot (Failed).
func (w *Writer) Write(ctx context.Context, puts []etcdscan.Put) []etcdscan.PutResult {
	w.calls.Add(1)
	res := make([]etcdscan.PutResult, len(puts))
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, p := range puts {
		r := &res[i]
		r.Key = p.Key
		if fe := w.Stopped(); fe != nil {
			r.Status, r.Err = etcdscan.Failed, fmt.Errorf("put %s: %w", p.Key, fe)
			continue
		}
		if err := ctx.Err(); err != nil {
			r.Status, r.Err = etcdscan.Failed, fmt.Errorf("put %s: %w", p.Key, err)
			continue
		}
		if p.ModRevision == 0 {
			r.Status, r.Err = etcdscan.Failed, fmt.Errorf("create %s: an output snapshot takes updates and deletes of existing keys only", p.Key)
			continue
		}
		read := p.Read
		prev, tracked := w.tracked[p.Key]
		switch {
		case w.removed[p.Key]:
			r.Status, r.Err = etcdscan.Conflict, fmt.Errorf("%s %s: key deleted since read", verbOf(p), p.Key)
			continue
		case tracked && prev.ModRevision != p.ModRevision:
			r.Status, r.Err = etcdscan.Conflict, fmt.Errorf("%s %s: key modified since read (mod revision %d, read at %d)", verbOf(p), p.Key, prev.ModRevision, p.ModRevision)
			continue
		case tracked:
			read = prev.Meta()
			w.superseded[prev.ModRevision] = true
			if p.Delete {
				// Its input record is gone already, counted as rewritten.
				w.rewritten--
			}
		case p.ModRevision > w.inRev:
			r.Status, r.Err = etcdscan.Conflict, fmt.Errorf("%s %s: key modified since read (read at mod revision %d, after the input's revision %d, and not written by this run)", verbOf(p), p.Key, p.ModRevision, w.inRev)
			continue
		default:
			idx, ok := w.liveAt(p.ModRevision, read.ModSub)
			if !ok {
				r.Status, r.Err = etcdscan.Conflict, fmt.Errorf("%s %s: key modified since read (it no longer has mod revision %d)", verbOf(p), p.Key, p.ModRevision)
				continue
			}
			w.gone[idx/64] |= 1 << (idx % 64)
			if !p.Delete {
				w.rewritten++
			}
		}
		if p.Delete {
			// Nothing is stored: the output, compacted at its revision,
			// holds no tombstone; the revision is spent as etcd's delete
			// spends one.
			w.next++
			w.deleted++
			if tracked {
				delete(w.tracked, p.Key)
				w.removed[p.Key] = true
			}
			r.Status, r.NewModRevision = etcdscan.Written, w.next
			continue
		}
		rev := w.next + 1
		kv := mvccpb.KeyValue{Key: []byte(p.Key), Value: p.Value, CreateRevision: read.CreateRevision, ModRevision: rev, Version: read.Version + 1, Lease: read.Lease}
		if err := w.append(rev, &kv); err != nil {
			fe := &etcdscan.FatalError{Cause: CauseOutput, Err: input.Errorf("%s %s: store the new values beside it: %w", input.OutputSnapshot, w.out, err)}
			w.stopped.CompareAndSwap(nil, fe)
			r.Status, r.Err = etcdscan.Failed, fmt.Errorf("put %s: %w", p.Key, fe)
			if tracked {
				delete(w.superseded, prev.ModRevision)
			}
			continue
		}
		w.next = rev
		if tracked || (w.opts.Track != nil && w.opts.Track(p.Key)) {
			w.tracked[p.Key] = etcdscan.KV{Key: p.Key, Value: slices.Clone(p.Value), ModRevision: rev, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
		}
		r.Status, r.NewModRevision = etcdscan.Written, rev
	}
	return res
}

// append writes one record to the log: its revision, its length, the
// encoded KeyValue.
func (w *Writer) append(rev int64, kv *mvccpb.KeyValue) error {
	if w.logw == nil {
		return errors.New("the writer is closed")
	}
	b, err := proto.Marshal(kv)
	if err != nil {
		return err
	}
	var hdr [12]byte
	binary.BigEndian.PutUint64(hdr[:8], uint64(rev))
	binary.BigEndian.PutUint32(hdr[8:], uint32(len(b)))
	if _, err := w.logw.Write(hdr[:]); err != nil {
		return err
	}
	_, err = w.logw.Write(b)
	return err
}

// logReader reads the log's records back in order.
type logReader struct {
	r   *bufio.Reader
	buf []byte
}

func (l *logReader) next() (rev int64, rec []byte, err error) {
	var hdr [12]byte
	if _, err := io.ReadFull(l.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[8:]))
	if cap(l.buf) < n {
		l.buf = make([]byte, n)
	}
	l.buf = l.buf[:n]
	if _, err := io.ReadFull(l.r, l.buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return int64(binary.BigEndian.Uint64(hdr[:8])), l.buf, nil
}

// verbOf names a put's operation.
func verbOf(p etcdscan.Put) string {
	if p.Delete {
		return "delete"
	}
	return "put"
}
