package undo

import (
	"os"
	"path/filepath"
	"sync"
	"time"
)

// What this process wrote of an undo, as it wrote it: a run's journal's
// checksum taken record by record as they were appended, its snapshot's as
// its stream was saved. A run's end (Seal) records them instead of reading
// the files whole again, as long as each file is still the one written
// (same size and modification time); else it reads the file.
var written sync.Map // absolute path -> writtenSum

// writtenSum is a file's checksum as written, and for a journal the keys
// its old values need (needsKnown: it was counted).
type writtenSum struct {
	sum        FileSum
	needs      []string
	needsKnown bool
	mod        time.Time
}

func sumKey(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// RememberWritten keeps the checksum of a file of an undo this process has
// just written whole (a run's snapshot, as its stream was saved): the run's
// end records it instead of reading the file again, as long as the file is
// still the one written.
func RememberWritten(path string, sum FileSum) { remember(path, writtenSum{sum: sum}) }

// ForgetWritten drops what was remembered of path (the file was removed).
func ForgetWritten(path string) { forget(path) }

// remember keeps what was written to path, now that it is whole.
func remember(path string, ws writtenSum) {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != ws.sum.Bytes {
		forget(path)
		return
	}
	ws.mod = fi.ModTime()
	written.Store(sumKey(path), ws)
}

// forget drops what was remembered of path (a writer opened it again).
func forget(path string) { written.Delete(sumKey(path)) }

// recall returns, once, what was written to path, if the file is still
// what was written.
func recall(path string) (writtenSum, bool) {
	v, ok := written.LoadAndDelete(sumKey(path))
	if !ok {
		return writtenSum{}, false
	}
	ws := v.(writtenSum)
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != ws.sum.Bytes || !fi.ModTime().Equal(ws.mod) {
		return writtenSum{}, false
	}
	return ws, true
}
