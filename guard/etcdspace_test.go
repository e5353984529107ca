package guard

import (
	"context"
	"errors"
	"fmt"
	"kube-etcd-migrate/undo"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// etcdManifest writes etcd's static-pod manifest as kubeadm does, its
// /var/lib/etcd a hostPath volume of hostDataDir, beside a kube-apiserver
// manifest path in dir; it returns that path.
func etcdManifest(t *testing.T, dir, hostDataDir string) string {
	t.Helper()
	manifests := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	pod := testcluster.KubeadmEtcdPod(hostDataDir)
	if err := os.WriteFile(filepath.Join(manifests, "etcd.yaml"), []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(manifests, "kube-apiserver.yaml")
}

func device(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return uint64(st.Dev)
}

// TestEtcdGrowthCountedWhereItsDataIs: with a real etcd whose data
// directory (found through its manifest) is on the state directory's
// filesystem (the same device ID, as /var/lib/etcd and
// /var/lib/kube-etcd-migrate on a kubeadm node), the room a run needs there
// is its undo, etcd's growth, and a rollback's own undo with etcd's growth
// from it: a filesystem with room for the undo alone is refused, naming
// etcd's growth. With the state directory on another filesystem (/dev/shm,
// another device), each filesystem is asked for its own share only.
func TestEtcdGrowthCountedWhereItsDataIs(t *testing.T) {
	tmp := t.TempDir()
	srv := testetcd.StartT(t, testetcd.Options{Dir: filepath.Join(tmp, "etcd")})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/secrets/ns/s-%03d", i), strings.Repeat("v", 2000)); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := filepath.Join(tmp, "etcd", "data")
	apiserver := etcdManifest(t, tmp, dataDir)
	etcd := FindEtcdData(apiserver, EtcdData{})
	if etcd.Dir != dataDir || !strings.Contains(etcd.Source, "etcd.yaml") {
		t.Fatalf("etcd's data directory: %+v, want %s from its manifest", etcd, dataDir)
	}
	if none := FindEtcdData(filepath.Join(t.TempDir(), "kube-apiserver.yaml"), EtcdData{}); none.Dir != "" || !strings.HasPrefix(none.Source, "unknown: ") {
		t.Fatalf("no etcd manifest: %+v", none)
	}
	// An installer's layout that names the data directory (k3s has no etcd
	// manifest) wins over any manifest; one not on this host is unknown.
	k3s := EtcdData{Dir: dataDir, Source: "k3s's data-dir"}
	if got := FindEtcdData(filepath.Join(t.TempDir(), "kube-apiserver.yaml"), k3s); got != k3s {
		t.Fatalf("the installer's data directory: %+v, want %+v", got, k3s)
	}
	if gone := FindEtcdData(apiserver, EtcdData{Dir: filepath.Join(tmp, "nowhere"), Source: "k3s's data-dir"}); gone.Dir != "" || !strings.Contains(gone.Source, "k3s's data-dir") {
		t.Fatalf("an installer's data directory not on this host: %+v", gone)
	}
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}

	state := undo.StateDir(filepath.Join(tmp, "state"))
	if err := os.MkdirAll(filepath.Join(string(state), "runs", "0001-migrate"), 0o700); err != nil {
		t.Fatal(err)
	}
	if device(t, string(state)) != device(t, dataDir) {
		t.Fatal("the temporary directories are on two filesystems: the test needs one")
	}
	run := filepath.Join(string(state), "runs", "0001-migrate")
	space := RunSpace{
		Snapshot: filepath.Join(run, undo.SnapshotFile), Journal: filepath.Join(run, undo.JournalFile), JournalBytes: 2 * st.DBSizeInUse,
		Writes: st.DBSizeInUse, StateDir: state, RollbackWrites: st.DBSizeInUse, RollbackJournalBytes: 2 * st.DBSizeInUse,
		Etcd: etcd, Status: st, Quota: DefaultQuotaBackendBytes,
	}
	undoOnly := space
	undoOnly.Etcd = EtcdData{}
	sum := func(needs []DiskNeed) (n int64) {
		for _, d := range needs {
			n += d.Bytes
		}
		return n
	}
	room := sum(undoOnly.Needs()) + DiskMargin
	if grow := sum(space.Needs()) - sum(undoOnly.Needs()); grow < 2*WALSegment {
		t.Fatalf("etcd's growth counted %d bytes, want at least a WAL segment for the run and one for its rollback", grow)
	}
	free := func(string) (int64, error) { return room, nil }
	if _, err := checkDiskSpace(undoOnly.Needs(), free); err != nil {
		t.Fatalf("the undo alone in exactly its room: %v", err)
	}
	_, err = checkDiskSpace(space.Needs(), free)
	var se *DiskSpaceError
	if !errors.As(err, &se) {
		t.Fatalf("with etcd's growth on the same filesystem: %v, want a DiskSpaceError", err)
	}
	for _, want := range []string{"snapshot ", "journal ", "etcd's database growth from the run", "etcd's WAL of the run", "a rollback's own snapshot", "a rollback's own journal", "etcd's WAL of the rollback", "or give a state directory on another filesystem"} {
		if !strings.Contains(se.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, se)
		}
	}
	lines, err := checkDiskSpace(space.Needs(), func(string) (int64, error) { return sum(space.Needs()) + DiskMargin, nil })
	if err != nil || len(lines) != 1 || !strings.Contains(lines[0], "etcd's data directory is on it too") {
		t.Fatalf("one filesystem, etcd's and the undo's: %q %v", lines, err)
	}

	// The state directory on another filesystem: each is asked for its own.
	shm, err := os.MkdirTemp("/dev/shm", "kem-state-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.RemoveAll(shm)
	if device(t, shm) == device(t, dataDir) {
		t.Skip("/dev/shm is not another filesystem here")
	}
	elsewhere := space
	elsewhere.StateDir = undo.StateDir(shm)
	elsewhere.Snapshot, elsewhere.Journal = filepath.Join(shm, undo.SnapshotFile), filepath.Join(shm, undo.JournalFile)
	var etcdShare, undoShare int64
	for _, n := range elsewhere.Needs() {
		if n.Etcd {
			etcdShare += n.Bytes
		} else {
			undoShare += n.Bytes
		}
	}
	lines, err = checkDiskSpace(elsewhere.Needs(), func(string) (int64, error) { return max(etcdShare, undoShare) + DiskMargin, nil })
	if err != nil || len(lines) != 2 {
		t.Fatalf("two filesystems, each with room for its own share: %q %v", lines, err)
	}
	_, err = checkDiskSpace(elsewhere.Needs(), func(dir string) (int64, error) {
		if dir == dataDir {
			return etcdShare + DiskMargin - 1, nil
		}
		return undoShare + DiskMargin, nil
	})
	if !errors.As(err, &se) || se.Dir != dataDir || !strings.Contains(se.Error(), "etcd itself needs it") {
		t.Fatalf("etcd's filesystem short of its growth: %v", err)
	}
}

// TestEtcdGrowth: the database grows past its free pages, up to the
// quota; the WAL by whole segments.
func TestEtcdGrowth(t *testing.T) {
	st := etcdscan.StatusInfo{DBSize: 100 << 20, DBSizeInUse: 60 << 20, Free: 40 << 20}
	for _, tc := range []struct {
		writes, quota, db, wal int64
	}{
		{writes: 10 << 20, quota: 2 << 30, db: 0, wal: WALSegment},
		{writes: 50 << 20, quota: 2 << 30, db: 10 << 20, wal: WALSegment},
		{writes: 200 << 20, quota: 2 << 30, db: 160 << 20, wal: 4 * WALSegment},
		{writes: 200 << 20, quota: 150 << 20, db: 50 << 20, wal: 4 * WALSegment},
		{writes: 0, quota: 2 << 30, db: 0, wal: 0},
	} {
		db, wal := EtcdGrowth(tc.writes, st, tc.quota)
		if db != tc.db || wal != tc.wal {
			t.Errorf("writes %d quota %d: db %d wal %d, want %d %d", tc.writes, tc.quota, db, wal, tc.db, tc.wal)
		}
	}
}
