package dropbehind

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident is how many bytes of the file at path are in the page cache.
func resident(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += page
		}
	}
	return n
}

func write(t *testing.T, path string, size int64, through func(*os.File) interface{ Write([]byte) (int, error) }) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := through(f)
	chunk := bytes.Repeat([]byte{0x5a}, 1<<20)
	for written := int64(0); written < size; written += int64(len(chunk)) {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestWrittenFileLeavesThePageCache: a file of 8 windows written through a
// Writer keeps at most about two windows in the page cache, where the same
// file written the ordinary way stays there whole; a synced file handed to
// Drop leaves it. The bytes are the same either way.
func TestWrittenFileLeavesThePageCache(t *testing.T) {
	dir := t.TempDir()
	const size = 8 * Window
	plain := filepath.Join(dir, "plain")
	write(t, plain, size, func(f *os.File) interface{ Write([]byte) (int, error) } { return f })
	if r := resident(t, plain); r < size/2 {
		t.Skipf("a file just written keeps only %d of its %d bytes in this machine's page cache: nothing to drop", r, size)
	}
	dropped := filepath.Join(dir, "dropped")
	write(t, dropped, size, func(f *os.File) interface{ Write([]byte) (int, error) } { return New(f) })
	if r := resident(t, dropped); r > 3*Window {
		t.Fatalf("written through a Writer, %d MiB of %d MiB stay in the page cache", r>>20, size>>20)
	}
	a, _ := os.ReadFile(plain)
	b, _ := os.ReadFile(dropped)
	if !bytes.Equal(a, b) {
		t.Fatal("the file written through a Writer differs")
	}

	f, err := os.OpenFile(plain, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	Drop(f, 0, 0)
	if r := resident(t, plain); r > Window/8 {
		t.Fatalf("after Drop, %d MiB of a synced file stay in the page cache", r>>20)
	}
}
