package dropbehind

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeback starts writing the range to disk without waiting for it.
func writeback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// drop drops the range from the page cache; with wait, it first waits for
// its writeback (pages still dirty or under writeback would be kept).
func drop(f *os.File, off, n int64, wait bool) {
	if wait {
		_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	}
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}
