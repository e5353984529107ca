package snapshotdb

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// The page structure of the database, checked before bbolt walks it. bbolt
// trusts its file: a branch page that refers to itself or to a page above it
// sends a cursor down forever (the stack of pages it keeps growing until
// memory runs out), a page referred to twice makes every walk read a subtree
// again (exponentially often, for a chain of them), a key out of order makes
// a lookup miss a record a pass over the records found; and its own
// consistency check (Tx.Check) recurses without bound (a loop overflows the
// stack, which kills the process) and runs in a goroutine of its own, where a
// fault of a mapping cannot be caught. So the pages are walked here first,
// read with pread, never through a mapping: every page reached from the root
// bucket once, each in the database, of the type its parent needs, its
// elements, keys and values inside it, its keys in order and within the range
// its parent gives it, and the free list's pages in the database and not in
// use. The work is one read of each page and the memory a page's element
// table, whatever the file holds.
//
// What is read is bbolt's on-disk format, which bbolt does not export
// (go.etcd.io/bbolt/internal/common: Page, branchPageElement,
// leafPageElement, InBucket, Meta), in the byte order of the machine, as
// bbolt reads it.

// The layout of bbolt's pages.
const (
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	elementSize      = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	bucketHeaderSize = 16 // root u64, sequence u64

	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01

	noFreelist = ^uint64(0)
	// maxKeySize is the longest key bbolt writes (bbolt.MaxKeySize).
	maxKeySize = 32768
	// wholePage is the largest page (with its overflow) read at once; a
	// larger one is read piece by piece.
	wholePage = 1 << 20
)

var native = binary.NativeEndian

// pageWalk is one walk of a database's pages.
type pageWalk struct {
	f        *os.File
	path     string
	pageSize int64
	pages    uint64   // the database's high water mark: pages [0, pages) exist
	seen     []uint64 // a bit per page: reached (or listed free)
	stack    []pendingPage
}

// pendingPage is a page still to be read and the range of the keys its
// parent gives it, as their places in the file (a length -1: no bound).
type pendingPage struct {
	id           uint64
	loOff, hiOff int64
	loLen, hiLen int
}

// checkPages walks the pages of the database at path, whose meta page with
// transaction txID bbolt chose (its checksum checked); pageSize is its page
// size, size the bytes of the database the file holds.
func checkPages(path string, txID uint64, pageSize int, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return FileError(path, "%v", err)
	}
	defer f.Close()
	w := &pageWalk{f: f, path: path, pageSize: int64(pageSize)}
	return w.run(txID, size)
}

func (w *pageWalk) damaged(format string, args ...any) error {
	return damaged(w.path, format, args...)
}

func (w *pageWalk) run(txID uint64, size int64) error {
	root, freelist, err := w.meta(txID, size)
	if err != nil {
		return err
	}
	w.seen = make([]uint64, (w.pages+63)/64)
	w.mark(0)
	w.mark(1)
	var free []uint64
	if freelist != noFreelist {
		if free, err = w.freelist(freelist); err != nil {
			return err
		}
	}
	if err := w.push(pendingPage{id: root, loLen: -1, hiLen: -1}, "the root bucket"); err != nil {
		return err
	}
	for len(w.stack) > 0 {
		p := w.stack[len(w.stack)-1]
		w.stack = w.stack[:len(w.stack)-1]
		if err := w.page(p); err != nil {
			return err
		}
	}
	for _, id := range free {
		if id < 2 || id >= w.pages {
			return w.damaged("its free list names page %d, outside the database's %d pages", id, w.pages)
		}
		if w.marked(id) {
			return w.damaged("page %d is both free and in use", id)
		}
		w.mark(id)
	}
	return nil
}

// meta reads the meta page bbolt chose, of transaction txID with its
// checksum right (the FNV-1a of the fields before it, as bbolt checks it):
// the root bucket's page, the free list's page (noFreelist: none) and the
// number of pages.
func (w *pageWalk) meta(txID uint64, size int64) (root, freelist uint64, err error) {
	for i := int64(0); i < 2; i++ {
		b := make([]byte, pageHeaderSize+64)
		if _, err := w.f.ReadAt(b, i*w.pageSize); err != nil {
			continue
		}
		m := b[pageHeaderSize:]
		h := fnv.New64a()
		h.Write(m[:56])
		if native.Uint64(m[48:]) != txID || native.Uint64(m[56:]) != h.Sum64() {
			continue
		}
		root, freelist, w.pages = native.Uint64(m[16:]), native.Uint64(m[32:]), native.Uint64(m[40:])
		if w.pages < 2 || w.pages > uint64(size/w.pageSize) {
			return 0, 0, w.damaged("its meta page %d says it has %d pages of %d bytes, the file holds %d bytes", i, w.pages, w.pageSize, size)
		}
		return root, freelist, nil
	}
	return 0, 0, w.damaged("no meta page of its transaction %d", txID)
}

func (w *pageWalk) mark(id uint64)        { w.seen[id/64] |= 1 << (id % 64) }
func (w *pageWalk) marked(id uint64) bool { return w.seen[id/64]&(1<<(id%64)) != 0 }

// push queues page p, reached from what; a page reached twice is a loop
// or a shared subtree.
func (w *pageWalk) push(p pendingPage, what string) error {
	if p.id < 2 || p.id >= w.pages {
		return w.damaged("%s refers to page %d, not a page of its tree (2 to %d)", what, p.id, w.pages-1)
	}
	if w.marked(p.id) {
		return w.damaged("page %d is reached twice (%s refers to it again): its pages loop or are shared", p.id, what)
	}
	w.mark(p.id)
	w.stack = append(w.stack, p)
	return nil
}

// pageSpan is one page and its overflow, read whole when small, else piece
// by piece.
type pageSpan struct {
	w        *pageWalk
	id       uint64
	off, len int64
	buf      []byte
}

// within checks that the n bytes at rel are in the span.
func (s *pageSpan) within(rel, n int64) error {
	if rel < 0 || n < 0 || rel > s.len || n > s.len-rel {
		return s.w.damaged("page %d: an element points past its end", s.id)
	}
	return nil
}

// at is n bytes of the span at rel.
func (s *pageSpan) at(rel, n int64) ([]byte, error) {
	if err := s.within(rel, n); err != nil {
		return nil, err
	}
	if s.buf != nil {
		return s.buf[rel : rel+n], nil
	}
	b := make([]byte, n)
	if _, err := s.w.f.ReadAt(b, s.off+rel); err != nil {
		return nil, s.w.readError(err)
	}
	return b, nil
}

func (w *pageWalk) readError(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return FileError(w.path, "truncated while it was being read")
	}
	return FileError(w.path, "read: %v", err)
}

// key reads the key at (off, n) of the file; nil for no bound (n < 0).
func (w *pageWalk) key(off int64, n int) ([]byte, error) {
	if n < 0 {
		return nil, nil
	}
	b := make([]byte, n)
	if _, err := w.f.ReadAt(b, off); err != nil {
		return nil, w.readError(err)
	}
	return b, nil
}

// page reads page p: its header, then its elements.
func (w *pageWalk) page(p pendingPage) error {
	var h [pageHeaderSize]byte
	off := int64(p.id) * w.pageSize
	if _, err := w.f.ReadAt(h[:], off); err != nil {
		return w.readError(err)
	}
	id, flags, count, overflow := native.Uint64(h[0:]), native.Uint16(h[8:]), int(native.Uint16(h[10:])), uint64(native.Uint32(h[12:]))
	if id != p.id {
		return w.damaged("page %d says it is page %d", p.id, id)
	}
	if overflow >= w.pages-p.id {
		return w.damaged("page %d overflows past the database's %d pages", p.id, w.pages)
	}
	for i := uint64(1); i <= overflow; i++ {
		if w.marked(p.id + i) {
			return w.damaged("page %d overflows into page %d, which is in use", p.id, p.id+i)
		}
		w.mark(p.id + i)
	}
	s := &pageSpan{w: w, id: p.id, off: off, len: int64(overflow+1) * w.pageSize}
	if s.len <= wholePage {
		s.buf = make([]byte, s.len)
		if _, err := w.f.ReadAt(s.buf, off); err != nil {
			return w.readError(err)
		}
	}
	lo, err := w.key(p.loOff, p.loLen)
	if err != nil {
		return err
	}
	hi, err := w.key(p.hiOff, p.hiLen)
	if err != nil {
		return err
	}
	switch flags {
	case branchPageFlag:
		return w.branch(s, count, p, lo, hi)
	case leafPageFlag:
		return w.leaf(s, count, lo, hi, true)
	}
	return w.damaged("page %d is of type %#x, neither a branch nor a leaf", p.id, flags)
}

// elements reads the element table of a page of count elements.
func (w *pageWalk) elements(s *pageSpan, count int) ([]byte, error) {
	return s.at(pageHeaderSize, int64(count)*elementSize)
}

// inOrder checks key, the i-th of its page, against the previous one and the
// page's range [lo, hi).
func (w *pageWalk) inOrder(id uint64, i int, key, prev, lo, hi []byte) error {
	switch {
	case i > 0 && bytes.Compare(prev, key) >= 0:
		return w.damaged("page %d: key %d is not after the key before it", id, i)
	case i == 0 && lo != nil && bytes.Compare(key, lo) < 0:
		return w.damaged("page %d: its first key is before the range its parent gives it", id)
	case hi != nil && bytes.Compare(key, hi) >= 0:
		return w.damaged("page %d: key %d is past the range its parent gives it", id, i)
	}
	return nil
}

func (w *pageWalk) branch(s *pageSpan, count int, p pendingPage, lo, hi []byte) error {
	if count == 0 {
		return w.damaged("branch page %d is empty", s.id)
	}
	els, err := w.elements(s, count)
	if err != nil {
		return err
	}
	// Each child's range: from its element's key to the next one's, the
	// last's to the end of this page's range; kept as places in the file.
	children := make([]pendingPage, count)
	var prev []byte
	for i := range count {
		e := els[i*elementSize:]
		pos, ksize := int64(native.Uint32(e[0:])), int64(native.Uint32(e[4:]))
		if ksize > maxKeySize {
			return w.damaged("page %d: key %d is %d bytes, more than bbolt writes", s.id, i, ksize)
		}
		rel := pageHeaderSize + int64(i)*elementSize + pos
		key, err := s.at(rel, ksize)
		if err != nil {
			return err
		}
		if err := w.inOrder(s.id, i, key, prev, lo, hi); err != nil {
			return err
		}
		prev = key
		children[i] = pendingPage{id: native.Uint64(e[8:]), loOff: s.off + rel, loLen: int(ksize), hiOff: p.hiOff, hiLen: p.hiLen}
		if i > 0 {
			children[i-1].hiOff, children[i-1].hiLen = children[i].loOff, children[i].loLen
		}
	}
	// Pushed last first: read in key order.
	for i := count - 1; i >= 0; i-- {
		if err := w.push(children[i], fmt.Sprintf("branch page %d", s.id)); err != nil {
			return err
		}
	}
	return nil
}

// leaf checks the elements of a leaf page: keys in order, values inside the
// page, a bucket's header (and inline page) whole, its root page queued.
// An inline page (a small bucket kept in its parent's value) holds no bucket.
func (w *pageWalk) leaf(s *pageSpan, count int, lo, hi []byte, buckets bool) error {
	els, err := w.elements(s, count)
	if err != nil {
		return err
	}
	var prev []byte
	for i := range count {
		e := els[i*elementSize:]
		flags, pos, ksize, vsize := native.Uint32(e[0:]), int64(native.Uint32(e[4:])), int64(native.Uint32(e[8:])), int64(native.Uint32(e[12:]))
		if ksize > maxKeySize {
			return w.damaged("page %d: key %d is %d bytes, more than bbolt writes", s.id, i, ksize)
		}
		rel := pageHeaderSize + int64(i)*elementSize + pos
		key, err := s.at(rel, ksize)
		if err != nil {
			return err
		}
		if err := s.within(rel+ksize, vsize); err != nil {
			return err
		}
		if err := w.inOrder(s.id, i, key, prev, lo, hi); err != nil {
			return err
		}
		prev = key
		switch {
		case flags == 0:
			continue
		case flags != bucketLeafFlag:
			return w.damaged("page %d: element %d has flags %#x", s.id, i, flags)
		case !buckets:
			return w.damaged("page %d: an inline bucket holds a bucket", s.id)
		case vsize < bucketHeaderSize:
			return w.damaged("page %d: the bucket %s has a header of %d bytes", s.id, quoted(key), vsize)
		}
		v, err := s.at(rel+ksize, min(vsize, w.pageSize))
		if err != nil {
			return err
		}
		if root := native.Uint64(v); root != 0 {
			if err := w.push(pendingPage{id: root, loLen: -1, hiLen: -1}, "the bucket "+quoted(key)); err != nil {
				return err
			}
			continue
		}
		// An inline bucket: a leaf page in the value, no larger than a page.
		if vsize > w.pageSize || vsize < bucketHeaderSize+pageHeaderSize {
			return w.damaged("page %d: the inline bucket %s is %d bytes", s.id, quoted(key), vsize)
		}
		in := &pageSpan{w: w, id: s.id, off: s.off + rel + ksize + bucketHeaderSize, len: vsize - bucketHeaderSize, buf: v[bucketHeaderSize:]}
		if f := native.Uint16(in.buf[8:]); f != leafPageFlag {
			return w.damaged("page %d: the inline bucket %s is a page of type %#x, not a leaf", s.id, quoted(key), f)
		}
		if err := w.leaf(in, int(native.Uint16(in.buf[10:])), nil, nil, false); err != nil {
			return err
		}
	}
	return nil
}

// freelist reads the page ids the free list at page id holds.
func (w *pageWalk) freelist(id uint64) ([]uint64, error) {
	if id < 2 || id >= w.pages {
		return nil, w.damaged("its free list is at page %d, outside the database's %d pages", id, w.pages)
	}
	var h [pageHeaderSize + 8]byte
	off := int64(id) * w.pageSize
	if _, err := w.f.ReadAt(h[:], off); err != nil {
		return nil, w.readError(err)
	}
	flags, count, overflow := native.Uint16(h[8:]), uint64(native.Uint16(h[10:])), uint64(native.Uint32(h[12:]))
	if native.Uint64(h[0:]) != id || flags != freelistPageFlag {
		return nil, w.damaged("its free list page %d is not a free list", id)
	}
	if overflow >= w.pages-id {
		return nil, w.damaged("its free list page %d overflows past the database's %d pages", id, w.pages)
	}
	first := uint64(0)
	if count == 0xFFFF {
		// The count is the first element.
		count, first = native.Uint64(h[pageHeaderSize:]), 1
	}
	spanLen := (overflow + 1) * uint64(w.pageSize)
	if count > (spanLen-pageHeaderSize)/8-first {
		return nil, w.damaged("its free list page %d lists %d pages, more than it holds", id, count)
	}
	for i := uint64(0); i <= overflow; i++ {
		w.mark(id + i)
	}
	b := make([]byte, count*8)
	if _, err := w.f.ReadAt(b, off+pageHeaderSize+int64(first)*8); err != nil {
		return nil, w.readError(err)
	}
	ids := make([]uint64, count)
	for i := range ids {
		ids[i] = native.Uint64(b[i*8:])
	}
	return ids, nil
}
