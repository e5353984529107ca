package snapshotdb

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/etcdscan"
)

// TestTruncatedWhileRead: a file truncated under a reader, whose next read of
// the mapping is a SIGBUS, is an error naming the file and saying it was
// truncated, not a crash.
func TestTruncatedWhileRead(t *testing.T) {
	base := readFuzzBase(t, 0)
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := os.WriteFile(path, base, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pages := 0
	_, err = f.Scan(context.Background(), etcdscan.ScanOptions{Prefixes: []string{"/registry/"}, PageSize: 2}, func([]etcdscan.KV) error {
		if pages++; pages == 1 {
			// Two pages left: every record is past the end now.
			if err := os.Truncate(path, 2*4096); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	})
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if !strings.HasPrefix(msg, "snapshot file "+path+": changed while it was being read: truncated from ") || strings.Contains(msg, "\n") {
		t.Errorf("scan of a file truncated under it: %q (after %d pages)", msg, pages)
	}
}

// TestChangedOrDamaged: a record not found again, or a fault, in a file that
// nothing changed since it was opened is its damage; in one whose size,
// modification time or identity changed, the change.
func TestChangedOrDamaged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "db")
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	opened, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what, want string) {
		t.Helper()
		msg := changedOrDamaged(path, opened, "no record at revision %d", 5).Error()
		if !strings.HasPrefix(msg, "snapshot file "+path+": "+want) {
			t.Errorf("%s: %q, want it to start %q", what, msg, want)
		}
	}
	check("unchanged", "damaged database: no record at revision 5; the file is damaged: use another copy")
	if err := os.Chtimes(path, time.Now(), opened.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	check("modified", "changed while it was being read (modified at ")
	if err := os.WriteFile(path+".new", []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path+".new", time.Now(), opened.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	check("replaced", "changed while it was being read (modified at ")
	if err := os.Truncate(path, 4); err != nil {
		t.Fatal(err)
	}
	check("truncated", "changed while it was being read: truncated from 10 to 4 bytes")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	check("removed", "changed while it was being read: ")
}
