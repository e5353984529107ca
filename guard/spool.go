package guard

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// SpoolMax is the most a run holds on disk of what it decided while its
// first write waits (Spool): at the 15 s liveness window's end, the
// decisions of some 50,000 secrets of 2 KB.
const SpoolMax = 256 << 20

// Spool keeps batches of a run's decided writes on disk while its first
// write waits (the liveness window, the undo's snapshot), so that the
// reading and deciding go on meanwhile; once the first write may go, Drain
// hands them back in the order they came. Its file is in the run directory
// and is removed as soon as it is created: it holds values as they were
// stored and as they will be written, and nothing of it outlives the
// process, however the run ends (the disk it took is freed when the
// process closes it or exits). It takes batches up to its room, then
// refuses every one (Add), as it does after a write to it failed: the
// caller then sends them itself.
type Spool[T any] struct {
	f       *os.File
	enc     *gob.Encoder // into buf (a T that is not selfCoded)
	buf     bytes.Buffer
	room    int64 // bytes it may take
	size    int64 // bytes written to f (every batch whole)
	batches int
	failed  bool
	// self: T encodes itself (selfCoded): each batch is its length, then
	// its items' encodings (appendBatch), into out.
	self bool
	out  []byte
}

// OpenSpool creates a spool of at most room bytes in dir.
func OpenSpool[T any](dir string, room int64) (*Spool[T], error) {
	f, _, err := openUnlinked(dir, "spool")
	if err != nil {
		return nil, err
	}
	s := &Spool[T]{f: f, room: min(room, SpoolMax), self: isSelfCoded[T]()}
	if !s.self {
		s.enc = gob.NewEncoder(&s.buf)
	}
	return s, nil
}

// selfCoded is what a type does (on its pointer) to be kept in a Spool or
// a Backlog by an encoding of its own instead of gob's: AppendSpooled
// appends its encoding to b (an error: it cannot be kept), ReadSpooled
// decodes it from the start of b and returns what follows; what it decoded
// may hold b's bytes (each batch is read into a buffer of its own).
type selfCoded interface {
	AppendSpooled(b []byte) ([]byte, error)
	ReadSpooled(b []byte) ([]byte, error)
}

func isSelfCoded[T any]() bool {
	_, ok := any((*T)(nil)).(selfCoded)
	return ok
}

// appendBatch appends batch's length, then each item's encoding; T is
// selfCoded.
func appendBatch[T any](b []byte, batch []T) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(batch)))
	for i := range batch {
		var err error
		if b, err = any(&batch[i]).(selfCoded).AppendSpooled(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

// readBatch decodes what appendBatch encoded, the whole of b; the items
// may hold b's bytes.
func readBatch[T any](b []byte) ([]T, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, fmt.Errorf("a batch of %d items in %d bytes", n, len(b))
	}
	b = b[k:]
	batch := make([]T, n)
	for i := range batch {
		var err error
		if b, err = any(&batch[i]).(selfCoded).ReadSpooled(b); err != nil {
			return nil, err
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d bytes after the batch", len(b))
	}
	return batch, nil
}

// Add keeps batch, whose items take about cost bytes, and says so; false when
// the spool has no room for it or a write to it failed (nothing of batch
// is kept: the caller sends it). batch is encoded: the spool keeps no
// reference to it.
func (s *Spool[T]) Add(batch []T, cost int64) bool {
	// Once it refused a batch it takes no other: the batches come back in
	// the order they came (and the encoder may have sent with the refused
	// one a type that the file lacks).
	if s.failed || s.size+cost > s.room {
		s.failed = true
		return false
	}
	var enc []byte
	if s.self {
		var hdr [8]byte
		out, err := appendBatch(append(s.out[:0], hdr[:]...), batch)
		if err != nil {
			s.failed = true
			return false
		}
		binary.BigEndian.PutUint64(out[:8], uint64(len(out)-8))
		if cap(out) <= 4<<20 {
			s.out = out[:0] // a large batch's buffer is not kept
		}
		enc = out
	} else {
		s.buf.Reset()
		if err := s.enc.Encode(batch); err != nil {
			s.failed = true
			return false
		}
		enc = s.buf.Bytes()
	}
	if s.size+int64(len(enc)) > s.room {
		s.failed = true
		return false
	}
	n, err := s.f.WriteAt(enc, s.size)
	if err != nil || n != len(enc) {
		// A short write (a full disk): what is kept ends where it did.
		s.failed = true
		return false
	}
	s.size += int64(n)
	s.batches++
	return true
}

// Batches is the number of batches kept.
func (s *Spool[T]) Batches() int { return s.batches }

// Drain calls fn with every batch kept, oldest first, then empties the
// spool; fn's error stops it. A batch that does not read back (the disk
// failed under it) is an error, naming the spool.
func (s *Spool[T]) Drain(fn func([]T) error) error {
	var dec *gob.Decoder
	if !s.self {
		dec = gob.NewDecoder(bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 1<<20))
	}
	var off int64
	for i := 0; i < s.batches; i++ {
		var batch []T
		var err error
		if s.self {
			batch, off, err = s.read(off)
		} else {
			err = dec.Decode(&batch)
		}
		if err != nil {
			return fmt.Errorf("spool of the decisions held while the first write waited: batch %d of %d does not read back: %w", i+1, s.batches, err)
		}
		if err := fn(batch); err != nil {
			return err
		}
	}
	s.batches, s.size = 0, 0
	s.failed = true // its encoder's types were sent: take nothing more
	if err := s.f.Truncate(0); err != nil {
		return fmt.Errorf("spool of the decisions held while the first write waited: %w", err)
	}
	return nil
}

// read reads back the batch of a self-coded T at off, into a buffer of its
// own (its items hold its bytes), and returns the next one's offset.
func (s *Spool[T]) read(off int64) ([]T, int64, error) {
	var hdr [8]byte
	if _, err := s.f.ReadAt(hdr[:], off); err != nil {
		return nil, off, err
	}
	n := int64(binary.BigEndian.Uint64(hdr[:]))
	if n <= 0 || off+8+n > s.size {
		return nil, off, fmt.Errorf("a length of %d bytes, %d written after it", n, s.size-off-8)
	}
	raw := make([]byte, n)
	if _, err := s.f.ReadAt(raw, off+8); err != nil {
		return nil, off, err
	}
	batch, err := readBatch[T](raw)
	return batch, off + 8 + n, err
}

// Close frees the spool's disk.
func (s *Spool[T]) Close() error {
	if s == nil {
		return nil
	}
	return s.f.Close()
}

// BacklogMax is the most a run keeps on disk of what it decided while its
// writers had no room for it (Backlog): some 290,000 decisions of secrets
// of 1.8 KB, a million objects read and decided ahead of the writes.
const BacklogMax = 1 << 30

// Backlog is a queue on disk of the batches a run decided while its
// writers had no room for them (a compaction's wait for room below etcd's
// quota, a slow commit), so that the reading and deciding go on meanwhile
// on the cores the writes leave idle, as a Spool does before the first
// write; unlike a Spool it is read from while it is added to. Batches come
// back in the order they came. Like a Spool, its file is removed from the
// run directory as soon as it is created and nothing of it outlives the
// process; its space is given back whenever it is emptied. Push refuses a
// batch past its room, or after a write to it failed (the caller then
// sends the batch itself); a batch that does not read back is an error.
// Push and Pop may be called from different goroutines.
type Backlog[T any] struct {
	mu      sync.Mutex
	f       *os.File
	name    string
	room    int64
	head    int64 // the next batch to read
	tail    int64 // where the next batch is written
	batches int
	failed  bool
	pushed  int // batches taken in all
	buf     bytes.Buffer
	hdr     [8]byte
	rbuf    []byte
	// One gob stream for every batch: enc writes into buf, dec reads each
	// batch's bytes from src (a bytes.Reader is an io.ByteReader: gob reads
	// no further than the batch). Both were primed at the start with an
	// empty batch, so that the types' descriptions are in neither file nor
	// batch (a batch refused after it was encoded takes nothing from the
	// stream the others need), and a batch is its value alone.
	enc *gob.Encoder
	dec *gob.Decoder
	src bytes.Reader
	// self: T encodes itself (selfCoded, appendBatch) into out: no gob
	// stream.
	self bool
	out  []byte
}

// OpenBacklog creates a backlog of at most room bytes (and BacklogMax) in dir.
func OpenBacklog[T any](dir string, room int64) (*Backlog[T], error) {
	f, name, err := openUnlinked(dir, "backlog")
	if err != nil {
		return nil, err
	}
	b := &Backlog[T]{f: f, name: name, room: min(room, BacklogMax), self: isSelfCoded[T]()}
	if b.self {
		return b, nil
	}
	b.enc = gob.NewEncoder(&b.buf)
	b.dec = gob.NewDecoder(&b.src)
	if err := b.enc.Encode([]T{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("backlog %s: %w", name, err)
	}
	b.src.Reset(b.buf.Bytes())
	var primed []T
	if err := b.dec.Decode(&primed); err != nil || b.src.Len() != 0 {
		f.Close()
		return nil, fmt.Errorf("backlog %s: its encoding does not read back: %v", name, err)
	}
	b.buf.Reset()
	return b, nil
}

// openUnlinked creates a file .what-* in dir and removes its name at once:
// the open file is the only way to it, and its disk is freed when the
// process closes it or exits. It returns the file and the name it had.
func openUnlinked(dir, what string) (*os.File, string, error) {
	f, err := os.CreateTemp(dir, "."+what+"-*")
	if err != nil {
		return nil, "", fmt.Errorf("%s in %s: %w", what, dir, err)
	}
	name := filepath.Base(f.Name())
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, "", fmt.Errorf("%s %s: %w", what, name, err)
	}
	return f, name, nil
}

// Push keeps batch and says so; false when the backlog has no room for it
// now or a write to it failed (it then takes nothing more). Each batch is
// a length, then its gob in the backlog's one stream.
func (b *Backlog[T]) Push(batch []T) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed {
		return false
	}
	var enc []byte
	if b.self {
		out, err := appendBatch(append(b.out[:0], b.hdr[:]...), batch)
		if err != nil {
			b.failed = true
			return false
		}
		if cap(out) <= 4<<20 {
			b.out = out[:0] // a large batch's buffer is not kept
		}
		enc = out
	} else {
		b.buf.Reset()
		b.buf.Write(b.hdr[:])
		if err := b.enc.Encode(batch); err != nil {
			b.failed = true
			return false
		}
		enc = b.buf.Bytes()
	}
	n := int64(len(enc))
	if b.tail+n > b.room {
		return false
	}
	binary.BigEndian.PutUint64(enc[:8], uint64(n-8))
	w, err := b.f.WriteAt(enc, b.tail)
	if err != nil || int64(w) != n {
		// A short write (a full disk): what is kept ends where it did.
		b.failed = true
		return false
	}
	b.tail += n
	b.batches++
	b.pushed++
	if b.buf.Cap() > 4<<20 {
		b.buf = bytes.Buffer{} // a large batch's buffer is not kept
	}
	return true
}

// Len is the number of batches kept and not yet read.
func (b *Backlog[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.batches
}

// Pushed is the number of batches the backlog took in all.
func (b *Backlog[T]) Pushed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pushed
}

// Pop reads back the oldest batch kept (ok false: none is), and gives the
// backlog's space back once it is empty. A batch that does not read back
// (the disk failed under it) is an error naming the backlog.
func (b *Backlog[T]) Pop() (batch []T, ok bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.batches == 0 {
		return nil, false, nil
	}
	fail := func(err error) ([]T, bool, error) {
		return nil, false, fmt.Errorf("backlog %s of the decisions held while the writes waited: batch at byte %d does not read back: %w", b.name, b.head, err)
	}
	var hdr [8]byte
	if _, err := b.f.ReadAt(hdr[:], b.head); err != nil {
		return fail(err)
	}
	n := int64(binary.BigEndian.Uint64(hdr[:]))
	if n <= 0 || b.head+8+n > b.tail {
		return fail(fmt.Errorf("a length of %d bytes, %d written after it", n, b.tail-b.head-8))
	}
	if b.self {
		// The batch holds the buffer's bytes: one of its own.
		raw := make([]byte, n)
		if _, err := b.f.ReadAt(raw, b.head+8); err != nil {
			return fail(err)
		}
		if batch, err = readBatch[T](raw); err != nil {
			return fail(err)
		}
	} else {
		if int64(cap(b.rbuf)) < n {
			b.rbuf = make([]byte, n)
		}
		raw := b.rbuf[:n]
		if _, err := b.f.ReadAt(raw, b.head+8); err != nil {
			return fail(err)
		}
		// The decoded values are copies: the buffer is read into again.
		b.src.Reset(raw)
		if err := b.dec.Decode(&batch); err != nil {
			return fail(err)
		}
		if b.src.Len() != 0 {
			return fail(fmt.Errorf("%d bytes after the batch", b.src.Len()))
		}
		if cap(b.rbuf) > 4<<20 {
			b.rbuf = nil
		}
	}
	b.head += 8 + n
	b.batches--
	if b.batches == 0 {
		b.head, b.tail = 0, 0
		if err := b.f.Truncate(0); err != nil {
			b.failed = true // what it held was read; it takes nothing more
		}
	}
	return batch, true, nil
}

// Close frees the backlog's disk.
func (b *Backlog[T]) Close() error {
	if b == nil {
		return nil
	}
	return b.f.Close()
}
