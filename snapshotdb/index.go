package snapshotdb

import (
	"bufio"
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
	"sync/atomic"

	"go.etcd.io/etcd/server/v3/storage/mvcc"
)

// The key index: which record of each key is the newest at or below one
// revision, in key order. etcd's key bucket is ordered by revision, so the
// index is built in one pass over it as an external sort: the records are
// collected in runs of bounded memory (a byte arena of keys and a fixed-size
// entry per record), each run sorted by key, cut to the newest record of each
// key and, when more records follow, spilled to a temporary file; the runs are
// then merged, the newest run's record of a key winning, into the index (a
// second temporary file, or memory when a single run held every record). A
// tombstone hides the key's older records and is dropped once nothing older
// can follow. Both files are unlinked as soon as they are created: nothing is
// left behind, whatever ends the process.

// runBytes bounds the memory of a run: two thirds for its keys' bytes, a
// third for its records (recordCost each), allocated once and reused by every
// run. A variable for the tests.
var runBytes = 8 << 20

// recordCost is what a record of a run costs beyond its key's bytes.
const recordCost = 32

// blockLen is how many index records share one entry of the index's sparse
// table of contents (the first key of each block, kept in memory); each block
// starts afresh, without a shared prefix, so that a read can start there.
const blockLen = 512

// fanIn bounds the runs merged at once (each merged through a buffer): past
// it, the oldest runs are merged into one first. A variable for the tests.
var fanIn = 128

// entry is a record of a run: its key (in the run's arena) and revision.
type entry struct {
	off, n    uint32
	main, sub int64
	tomb      bool
}

// run collects records in revision order, in bounded memory.
type run struct {
	arena []byte
	recs  []entry
}

// newRun allocates a run of runBytes, or less for a database of dataSize
// bytes (no more keys' bytes than that, nor more records than a record of
// etcd's key bucket, at least 16 bytes with its revision, can fill).
func newRun(dataSize int64) run {
	keys := int(min(int64(runBytes*2/3), dataSize))
	recs := int(min(int64(runBytes/3/recordCost), dataSize/16))
	return run{arena: make([]byte, 0, max(keys, 1<<10)), recs: make([]entry, 0, max(recs, 64))}
}

// size is the memory the run's records take, at most the encoding of their
// index (a key's bytes and at most 30 of varints each).
func (b *run) size() int { return len(b.arena) + len(b.recs)*recordCost }

// fits says whether a record of key fits: the run never grows.
func (b *run) fits(key []byte) bool {
	return len(b.recs) < cap(b.recs) && len(b.arena)+len(key) <= cap(b.arena)
}

func (b *run) add(key []byte, main, sub int64, tomb bool) {
	b.recs = append(b.recs, entry{off: uint32(len(b.arena)), n: uint32(len(key)), main: main, sub: sub, tomb: tomb})
	b.arena = append(b.arena, key...)
}

func (b *run) key(e entry) []byte { return b.arena[e.off : e.off+e.n] }

func (b *run) reset() { b.arena, b.recs = b.arena[:0], b.recs[:0] }

// sort orders the records by key, keeps the newest of each key and, when
// oldest (no older record of any key can follow), drops the tombstones.
func (b *run) sort(oldest bool) {
	slices.SortFunc(b.recs, func(x, y entry) int {
		if c := bytes.Compare(b.key(x), b.key(y)); c != 0 {
			return c
		}
		if x.main != y.main {
			return compareInt(x.main, y.main)
		}
		return compareInt(x.sub, y.sub)
	})
	out := b.recs[:0]
	for i, e := range b.recs {
		if i+1 < len(b.recs) && bytes.Equal(b.key(e), b.key(b.recs[i+1])) {
			continue // an older record of the key
		}
		if e.tomb && oldest {
			continue
		}
		out = append(out, e)
	}
	b.recs = out
}

func compareInt(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// write writes the run's records to w.
func (b *run) write(w *recWriter) error {
	for _, e := range b.recs {
		if err := w.write(b.key(e), e.main, e.sub, e.tomb); err != nil {
			return err
		}
	}
	return w.w.Flush()
}

// recWriter encodes records: the length of the prefix shared with the
// previous key, the rest of the key, the main revision, and the sub revision
// shifted left with the tombstone in its low bit, as varints. With toc, every
// blockLen records start afresh and are listed in the table of contents.
type recWriter struct {
	w    *bufio.Writer
	off  int64 // bytes written
	n    int64 // records written
	prev []byte
	toc  *[]block
	buf  [3 * binary.MaxVarintLen64]byte
}

// block is an entry of an index's table of contents.
type block struct {
	first string
	off   int64
}

func (w *recWriter) write(key []byte, main, sub int64, tomb bool) error {
	shared := 0
	if w.toc != nil && w.n%blockLen == 0 {
		*w.toc = append(*w.toc, block{first: string(key), off: w.off})
	} else {
		for shared < len(key) && shared < len(w.prev) && key[shared] == w.prev[shared] {
			shared++
		}
	}
	t := uint64(0)
	if tomb {
		t = 1
	}
	b := binary.AppendUvarint(w.buf[:0], uint64(shared))
	b = binary.AppendUvarint(b, uint64(len(key)-shared))
	n1, err := w.w.Write(b)
	if err != nil {
		return err
	}
	n2, err := w.w.Write(key[shared:])
	if err != nil {
		return err
	}
	b = binary.AppendUvarint(w.buf[:0], uint64(main))
	b = binary.AppendUvarint(b, uint64(sub)<<1|t)
	n3, err := w.w.Write(b)
	if err != nil {
		return err
	}
	w.off += int64(n1 + n2 + n3)
	w.n++
	w.prev = append(w.prev[:0], key...)
	return nil
}

// recReader decodes what a recWriter wrote.
type recReader struct {
	r         *bufio.Reader
	key       []byte // the current record's: valid until the next call of next
	main, sub int64
	tomb      bool
}

var errDamagedIndex = errors.New("damaged temporary index")

// next reads the next record; false at the end.
func (r *recReader) next() (bool, error) {
	shared, err := binary.ReadUvarint(r.r)
	if err == io.EOF {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	rest, err := binary.ReadUvarint(r.r)
	if err != nil || shared > uint64(len(r.key)) || rest > 1<<30 {
		return false, errDamagedIndex
	}
	r.key = slices.Grow(r.key[:shared], int(rest))[:int(shared)+int(rest)]
	if _, err := io.ReadFull(r.r, r.key[shared:]); err != nil {
		return false, errDamagedIndex
	}
	main, err := binary.ReadUvarint(r.r)
	if err != nil {
		return false, errDamagedIndex
	}
	sub, err := binary.ReadUvarint(r.r)
	if err != nil {
		return false, errDamagedIndex
	}
	r.main, r.sub, r.tomb = int64(main), int64(sub>>1), sub&1 == 1
	return true, nil
}

// span is a run's bytes in the spill file.
type span struct{ off, n int64 }

// tempFile creates an unlinked file in $TMPDIR (the tool's temporary
// directory): it takes disk only while open, and is never left behind.
func tempFile() (*os.File, error) {
	f, err := os.CreateTemp("", "kube-etcd-migrate-index-")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// spill is the runs written so far, in one temporary file.
type spill struct {
	f    *os.File
	w    *bufio.Writer
	off  int64
	runs []span
}

func newSpill() (*spill, error) {
	f, err := tempFile()
	if err != nil {
		return nil, err
	}
	return &spill{f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
}

func (s *spill) close() {
	if s != nil && s.f != nil {
		s.f.Close()
		s.f = nil
	}
}

// writer starts a new run at the end of the file.
func (s *spill) writer() *recWriter { return &recWriter{w: s.w, off: 0} }

// add records the run w wrote (flushed) as the newest.
func (s *spill) add(w *recWriter) {
	s.runs = append(s.runs, span{off: s.off, n: w.off})
	s.off += w.off
}

// cursor reads one run in a merge; idx orders the runs, oldest first.
type cursor struct {
	recReader
	idx int
}

// cursors is the merge's heap: the smallest key first, of equal keys the
// newest run's.
type cursors []*cursor

func (h cursors) Len() int { return len(h) }
func (h cursors) Less(i, j int) bool {
	if c := bytes.Compare(h[i].key, h[j].key); c != 0 {
		return c < 0
	}
	return h[i].idx > h[j].idx
}
func (h cursors) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *cursors) Push(x any)   { *h = append(*h, x.(*cursor)) }
func (h *cursors) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// merge merges runs of src (oldest first, the oldest of all among them) into
// w: the newest record of each key, tombstones dropped.
func merge(ctx context.Context, src io.ReaderAt, runs []span, w *recWriter) error {
	bufSize := min(max(runBytes/(len(runs)+1), 4<<10), 256<<10)
	h := make(cursors, 0, len(runs))
	for i, s := range runs {
		c := &cursor{recReader: recReader{r: bufio.NewReaderSize(io.NewSectionReader(src, s.off, s.n), bufSize)}, idx: i}
		ok, err := c.next()
		if err != nil {
			return err
		}
		if ok {
			h = append(h, c)
		}
	}
	heap.Init(&h)
	var last []byte
	for n := 0; len(h) > 0; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		c := h[0]
		if n == 0 || !bytes.Equal(c.key, last) {
			last = append(last[:0], c.key...)
			if !c.tomb {
				if err := w.write(c.key, c.main, c.sub, false); err != nil {
					return err
				}
			}
		}
		ok, err := c.next()
		if err != nil {
			return err
		}
		if ok {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
	}
	return w.w.Flush()
}

// index is the keys that exist at rev, in key order, each with the revision
// of its record: in memory or in an unlinked temporary file, with a table of
// contents in memory. It is shared by the reads at its revision: refs counts
// its holders (the File's cache is one), the last to let go closes its file.
type index struct {
	path string // the snapshot file's
	rev  int64
	data io.ReaderAt
	size int64
	keys int64
	file *os.File // nil when in memory
	toc  []block
	refs atomic.Int32
}

func (x *index) release() {
	if x != nil && x.refs.Add(-1) == 0 && x.file != nil {
		x.file.Close()
	}
}

// each calls fn with the keys of [lo, end) ("" end: no end) in order, and
// their record's revision; key is valid during the call only.
func (x *index) each(ctx context.Context, lo, end string, fn func(key []byte, rev mvcc.Revision) error) error {
	if len(x.toc) == 0 {
		return nil
	}
	// The last block whose first key is at most lo.
	i, found := slices.BinarySearchFunc(x.toc, lo, func(b block, k string) int {
		switch {
		case b.first < k:
			return -1
		case b.first > k:
			return 1
		}
		return 0
	})
	if !found {
		i--
	}
	i = max(i, 0)
	off := x.toc[i].off
	r := recReader{r: bufio.NewReaderSize(io.NewSectionReader(x.data, off, x.size-off), 64<<10)}
	for n := 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		ok, err := r.next()
		if err != nil {
			return FileError(x.path, "reading the index of its keys (a temporary file in %s): %v", os.TempDir(), err)
		}
		if !ok {
			return nil
		}
		if string(r.key) < lo {
			continue
		}
		if end != "" && string(r.key) >= end {
			return nil
		}
		if err := fn(r.key, mvcc.Revision{Main: r.main, Sub: r.sub}); err != nil {
			return err
		}
	}
}

// count counts the keys of [lo, end).
func (x *index) count(ctx context.Context, lo, end string) (int64, error) {
	if lo == "" && end == "" {
		return x.keys, nil
	}
	var n int64
	err := x.each(ctx, lo, end, func([]byte, mvcc.Revision) error {
		n++
		return nil
	})
	return n, err
}

// indexError names the file and where its index was being written.
func (f *File) indexError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return FileError(f.Info.Path, "indexing its keys in temporary files in %s ($TMPDIR): %v", os.TempDir(), err)
}

// build makes the index of the keys at rev: one pass over the records at or
// below rev, in revision order, then a merge of the runs it spilled (none
// when one run holds them all).
func (f *File) build(ctx context.Context, r *reader, rev int64) (*index, error) {
	f.passes.Add(1)
	b := newRun(f.dataSize)
	var sp *spill
	defer func() { sp.close() }()
	flush := func() error {
		if sp == nil {
			var err error
			if sp, err = newSpill(); err != nil {
				return f.indexError(err)
			}
		}
		b.sort(len(sp.runs) == 0)
		w := sp.writer()
		if err := b.write(w); err != nil {
			return f.indexError(err)
		}
		sp.add(w)
		f.spills.Add(1)
		b.reset()
		return nil
	}
	err := f.walk(ctx, r, rev, func(key []byte, rb mvcc.BucketKey, tomb bool) error {
		if !b.fits(key) && len(b.recs) > 0 {
			if err := flush(); err != nil {
				return err
			}
		}
		b.add(key, rb.Main, rb.Sub, tomb) // a key longer than the arena: the run grows for it
		return nil
	})
	if err != nil {
		return nil, err
	}
	x := &index{path: f.Info.Path, rev: rev}
	var toc []block
	if sp == nil {
		// One run held every record: the index in memory.
		b.sort(true)
		var buf bytes.Buffer
		buf.Grow(b.size()) // the index's whole size: no copy as it grows
		w := &recWriter{w: bufio.NewWriter(&buf), toc: &toc}
		if err := b.write(w); err != nil {
			return nil, f.indexError(err)
		}
		x.data, x.size, x.keys, x.toc = bytes.NewReader(buf.Bytes()), int64(buf.Len()), w.n, toc
		return x, nil
	}
	if len(b.recs) > 0 {
		if err := flush(); err != nil {
			return nil, err
		}
	}
	b = run{} // its memory for the merge's buffers
	for len(sp.runs) > fanIn {
		// The oldest runs into one, the oldest still.
		w := sp.writer()
		if err := merge(ctx, sp.f, sp.runs[:fanIn], w); err != nil {
			return nil, f.indexError(err)
		}
		merged := span{off: sp.off, n: w.off}
		sp.off += w.off
		sp.runs = append([]span{merged}, sp.runs[fanIn:]...)
	}
	out, err := tempFile()
	if err != nil {
		return nil, f.indexError(err)
	}
	w := &recWriter{w: bufio.NewWriterSize(out, 256<<10), toc: &toc}
	if err := merge(ctx, sp.f, sp.runs, w); err != nil {
		out.Close()
		return nil, f.indexError(err)
	}
	x.data, x.size, x.keys, x.toc, x.file = out, w.off, w.n, toc, out
	return x, nil
}

// walk calls fn with every record at or below rev, in revision order: its
// key (valid during the call only), revision and whether it is a tombstone.
func (f *File) walk(ctx context.Context, r *reader, rev int64, fn func(key []byte, rb mvcc.BucketKey, tomb bool) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := r.bucket().Cursor()
	n := 0
	for k, v := c.First(); k != nil; k, v = c.Next() {
		bk := mvcc.BytesToBucketKey(k)
		if bk.Main > rev {
			break
		}
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		key, err := recordKey(v)
		if err != nil {
			return damaged(f.Info.Path, "key record %s: %v", keyHex(k), err)
		}
		if err := fn(key, bk, mvcc.IsTombstone(k)); err != nil {
			return err
		}
	}
	return nil
}
