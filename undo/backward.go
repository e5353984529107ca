package undo

import (
	"bytes"
	"io"
	"os"
)

// BackwardReader returns a file's lines from the last to the first, reading
// it a chunk at a time from the end: it holds one chunk and the line being
// assembled, never the file (a journal read by a rollback, newest record
// first).
type BackwardReader struct {
	f   *os.File
	off int64  // bytes before buf not read yet
	buf []byte // read, not yet returned
}

const backwardChunk = 1 << 20

// NewBackwardReader reads f backwards from its byte end.
func NewBackwardReader(f *os.File, end int64) *BackwardReader {
	return &BackwardReader{f: f, off: end}
}

func newBackwardReader(f *os.File) (*BackwardReader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return NewBackwardReader(f, fi.Size()), nil
}

// Next returns the previous non-empty line (valid until the next call) and its
// byte offset in the file; io.EOF before the first line.
func (b *BackwardReader) Next() ([]byte, int64, error) {
	for {
		// Drop the newline that ends the line to return.
		for len(b.buf) > 0 && b.buf[len(b.buf)-1] == '\n' {
			b.buf = b.buf[:len(b.buf)-1]
		}
		if i := bytes.LastIndexByte(b.buf, '\n'); i >= 0 {
			line := b.buf[i+1:]
			b.buf = b.buf[:i+1]
			return line, b.off + int64(i) + 1, nil
		}
		if b.off == 0 {
			if len(b.buf) == 0 {
				return nil, 0, io.EOF
			}
			line := b.buf
			b.buf = nil
			return line, 0, nil
		}
		n := min(int64(backwardChunk), b.off)
		chunk := make([]byte, n, n+int64(len(b.buf)))
		if _, err := b.f.ReadAt(chunk, b.off-n); err != nil {
			return nil, 0, err
		}
		b.off -= n
		b.buf = append(chunk, b.buf...)
	}
}
