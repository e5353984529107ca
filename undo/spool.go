package undo

import (
	"bufio"
	"bytes"
	"encoding/gob"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	enc     *gob.Encoder // into buf
	buf     bytes.Buffer
	room    int64 // bytes it may take
	size    int64 // bytes written to f (every batch whole)
	batches int
	failed  bool
}

// OpenSpool creates a spool of at most room bytes in dir.
func OpenSpool[T any](dir string, room int64) (*Spool[T], error) {
	f, err := os.CreateTemp(dir, ".spool-*")
	if err != nil {
		return nil, fmt.Errorf("spool in %s: %w", dir, err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("spool %s: %w", filepath.Base(f.Name()), err)
	}
	s := &Spool[T]{f: f, room: min(room, SpoolMax)}
	s.enc = gob.NewEncoder(&s.buf)
	return s, nil
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
	s.buf.Reset()
	if err := s.enc.Encode(batch); err != nil {
		s.failed = true
		return false
	}
	if s.size+int64(s.buf.Len()) > s.room {
		s.failed = true
		return false
	}
	n, err := s.f.WriteAt(s.buf.Bytes(), s.size)
	if err != nil || n != s.buf.Len() {
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
	dec := gob.NewDecoder(bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 1<<20))
	for i := 0; i < s.batches; i++ {
		var batch []T
		if err := dec.Decode(&batch); err != nil {
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

// Close frees the spool's disk.
func (s *Spool[T]) Close() error {
	if s == nil {
		return nil
	}
	return s.f.Close()
}
