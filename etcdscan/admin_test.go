package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"kube-etcd-migrate/internal/testetcd"
)

func TestStatusSnapshotCompactRevision(t *testing.T) {
	s, c := startClient(t, testetcd.Options{})
	ctx := context.Background()
	putKeys(t, c, "/registry/pods/", 50)

	st, err := Status(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if st.DBSize <= 0 || st.DBSizeInUse <= 0 || st.DBSizeInUse > st.DBSize || st.Leader == 0 || !strings.HasPrefix(st.Version, "3.6.") {
		t.Fatalf("status %+v", st)
	}
	alarms, err := Alarms(ctx, c)
	if err != nil || len(alarms) != 0 {
		t.Fatalf("alarms on a healthy server: %v %v", alarms, err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "before-migrate.db")
	if err := Snapshot(ctx, c, path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 4096 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot file: %d bytes, mode %v", fi.Size(), fi.Mode().Perm())
	}
	// The snapshot is a bbolt database holding every revision written so far.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("snapshot is not a bbolt database: %v", err)
	}
	revs := 0
	if err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return errors.New("no key bucket")
		}
		revs = b.Stats().KeyN
		return nil
	}); err != nil || revs < 50 {
		t.Fatalf("snapshot holds %d revisions (%v), want >= 50", revs, err)
	}
	db.Close()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("snapshot left temporary files: %v", entries)
	}

	if rev, err := CompactRevision(ctx, c); err != nil || rev != 0 {
		t.Fatalf("never compacted: %d %v", rev, err)
	}
	cur, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, cur-17); err != nil {
		t.Fatal(err)
	}
	putKeys(t, c, "/registry/more/", 3)
	if rev, err := CompactRevision(ctx, c); err != nil || rev != cur-17 {
		t.Fatalf("compacted at %d: got %d %v", cur-17, rev, err)
	}
}

func TestAlarmsNoSpace(t *testing.T) {
	_, c := startClient(t, testetcd.Options{QuotaBackendBytes: 2 << 20})
	ctx := context.Background()
	big := strings.Repeat("x", 128<<10)
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		_, err = c.Put(ctx, fmt.Sprintf("/registry/big/%d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 2 MiB quota: %v", err)
	}
	alarms, err := Alarms(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms) != 1 || !strings.HasPrefix(alarms[0], "NOSPACE on member ") {
		t.Fatalf("alarms %q", alarms)
	}
}
