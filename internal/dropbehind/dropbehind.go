// Package dropbehind writes the large files a run makes and does not read
// again (the undo's snapshot of etcd, its journal) without leaving them in
// the page cache. On a control plane the page cache holds etcd's own
// database, which etcd reads through its mapping: a snapshot of an 8 GiB
// database written the ordinary way takes as much of the cache again and
// evicts etcd's pages, which etcd then faults back in from disk while the run
// writes to it. A Writer starts the writeback of what it wrote every window
// of bytes and drops from the cache what an earlier window wrote once it is
// on disk, so the file never holds more than about two windows of the
// cache; Drop does the same for a file already synced. Both are advice to
// the kernel: where it is not taken (another system, a filesystem without
// it) the file is written as before, and durability is still the caller's
// fsync.
package dropbehind

import (
	"io"
	"os"
)

// Window is how much a Writer writes between two writebacks.
const Window = 32 << 20

// Writer writes to a file from its current offset on, dropping behind it.
type Writer struct {
	f       *os.File
	start   int64 // the file's offset when the Writer was made
	written int64 // bytes written through it
	begun   int64 // written bytes whose writeback has begun
	dropped int64 // written bytes dropped from the cache
}

// New writes to f, which it neither syncs nor closes.
func New(f *os.File) *Writer {
	start, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		start = 0
	}
	return &Writer{f: f, start: start}
}

// Write writes p to the file; every Window bytes it starts the writeback of
// the window just written and drops the one before it.
func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.written += int64(n)
	if w.written-w.begun >= Window {
		writeback(w.f, w.start+w.begun, w.written-w.begun)
		if w.begun > w.dropped {
			drop(w.f, w.start+w.dropped, w.begun-w.dropped, true)
			w.dropped = w.begun
		}
		w.begun = w.written
	}
	return n, err
}

// Drop asks the kernel to drop length bytes of f from off (length 0: to its
// end) from the page cache: the pages already on disk go, the others stay.
func Drop(f *os.File, off, length int64) { drop(f, off, length, false) }
