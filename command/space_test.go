package command

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// etcdBeside writes etcd's static-pod manifest beside kube-apiserver's (as
// kubeadm does), its --data-dir /var/lib/etcd a hostPath volume of
// hostDataDir.
func etcdBeside(t *testing.T, apiserverManifest, hostDataDir string) {
	t.Helper()
	pod := testcluster.KubeadmEtcdPod(hostDataDir)
	if err := os.WriteFile(filepath.Join(filepath.Dir(apiserverManifest), "etcd.yaml"), []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freeOn(t *testing.T, dir string) int64 {
	t.Helper()
	var s syscall.Statfs_t
	if err := syscall.Statfs(dir, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Bavail) * int64(s.Bsize)
}

// TestEtcdGrowthOnTheStateDirsFilesystem: etcd's data directory and the
// state directory on one small filesystem (kubeadm's /var): with room for
// the undo but not for etcd's growth beside it (its WAL and database, for
// the run and for a rollback of it), migrate with the kube-apiserver
// manifest (etcd's beside it names --data-dir) is refused before any write,
// naming etcd's growth, etcd byte for byte as it was; the plan says the
// same. Without a manifest (etcd's data directory unknown, said so) the
// same space passes.
func TestEtcdGrowthOnTheStateDirsFilesystem(t *testing.T) {
	fsDir := smallFilesystem(t, 256<<20)
	c := testcluster.New(t, testetcd.Options{Dir: filepath.Join(fsDir, "etcd")})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(100, oldCfg)
	manifest := kubeadmManifest(t, c.Srv.Endpoint)
	etcdBeside(t, manifest, filepath.Join(fsDir, "etcd", "data"))
	// 100 MiB left: the undo and the margin fit, etcd's WAL segments of the
	// run and of its rollback beside them do not.
	if err := os.WriteFile(filepath.Join(fsDir, "filler"), make([]byte, freeOn(t, fsDir)-100<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(fsDir, "state")
	before, rev := c.Raw(), c.Revision()
	args := []string{"--liveness-window", "500ms", "--state-dir", state, "--apiserver-manifest", manifest, "--encryption-provider-config", newCfg, "--target-version", "1.37"}

	code, out, _ := runCLI(t, append([]string{"plan"}, args...)...)
	if code != exitError || !strings.Contains(out, "BLOCKER (disk space): not enough disk space on the filesystem of "+fsDir) || !strings.Contains(out, "etcd's WAL of the run") {
		t.Fatalf("plan: exit %d\n%s", code, out)
	}
	code, out, stderr := runCLI(t, append([]string{"migrate"}, args...)...)
	t.Logf("%s", stderr)
	if code != exitError || !strings.Contains(stderr, "not enough disk space on the filesystem of "+filepath.Join(state, "runs", "0001-migrate")) {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"etcd's database growth from the run", "etcd's WAL of the run", "a rollback's own snapshot", "etcd's WAL of the rollback", "nothing was written"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not say %q", want)
		}
	}
	if c.Revision() != rev {
		t.Fatalf("etcd's revision moved from %d to %d", rev, c.Revision())
	}
	for k, v := range c.Raw() {
		if before[k] != v {
			t.Fatalf("%s changed", k)
		}
	}
	// etcd's data directory unknown: the undo alone is counted, and fits.
	noManifest := []string{"migrate", "--liveness-window", "500ms", "--state-dir", state, "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	code, out, stderr = runCLI(t, noManifest...)
	if code != exitOK || !strings.Contains(out+stderr, "etcd's data directory on this host: unknown") {
		t.Fatalf("migrate without etcd's manifest: exit %d\n%s%s", code, out, stderr)
	}
}

// TestRollbackUndoDir: a rollback's own undo kept with --undo-dir: the runs
// it undoes are read from --state-dir, the rollback is recorded there with
// its journal and snapshot in DIR/ID (runs lists them), and rolling the
// rollback back (its run ID, --state-dir as before) puts the migration's
// values back byte for byte.
func TestRollbackUndoDir(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(50, oldCfg)
	original := c.Raw()
	state := testcluster.StateDir(t)
	elsewhere := filepath.Join(t.TempDir(), "undo")
	conn := []string{"--endpoints", c.Srv.Endpoint, "--liveness-window", "500ms"}
	if code, out, stderr := runCLI(t, append([]string{"migrate", "--encryption-provider-config", newCfg, "--target-version", "1.37"}, conn...)...); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	migrated := c.Raw()

	code, out, stderr := runCLI(t, append([]string{"rollback", "--run", "0001-migrate", "--undo-dir", elsewhere, "--encryption-provider-config", newCfg}, conn...)...)
	if code != exitOK {
		t.Fatalf("rollback --undo-dir: exit %d\n%s%s", code, out, stderr)
	}
	own := filepath.Join(elsewhere, "0002-rollback")
	if !strings.Contains(stderr, "run 0002-rollback: recorded in "+filepath.Join(state, "runs", "0002-rollback")+"; its undo is kept in "+own) {
		t.Errorf("the rollback does not say where it is recorded and where its undo is:\n%s", stderr)
	}
	for _, f := range []string{undo.JournalFile, undo.SnapshotFile} {
		if fi, err := os.Stat(filepath.Join(own, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("the rollback's %s in --undo-dir: %v %v", f, fi, err)
		}
		if _, err := os.Stat(filepath.Join(state, "runs", "0002-rollback", f)); err == nil {
			t.Errorf("the rollback's %s is in its run directory too", f)
		}
	}
	if fi, err := os.Stat(own); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("--undo-dir's run directory: %v %v, want mode 0700", fi, err)
	}
	for k, v := range original {
		if c.Raw()[k] != v {
			t.Fatalf("%s not rolled back", k)
		}
	}

	code, out, stderr = runCLI(t, "runs", "-o", "json")
	var listed struct {
		Runs []undo.Record `json:"runs"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Runs) != 2 {
		t.Fatalf("runs: exit %d\n%s%s", code, out, stderr)
	}
	if r := listed.Runs[1]; r.ID != "0002-rollback" || r.Journal != filepath.Join(own, undo.JournalFile) || r.Snapshot != filepath.Join(own, undo.SnapshotFile) {
		t.Fatalf("runs lists the rollback as %+v", r)
	}

	// The rollback itself is undone from the state directory's record.
	if code, out, stderr := runCLI(t, append([]string{"rollback", "--run", "0002-rollback", "--encryption-provider-config", newCfg}, conn...)...); code != exitOK {
		t.Fatalf("rollback of the rollback: exit %d\n%s%s", code, out, stderr)
	}
	for k, v := range migrated {
		if c.Raw()[k] != v {
			t.Fatalf("%s is not back to what the migration wrote", k)
		}
	}
}

// TestRollbackRefusedForRoomThenUndoDir: the state directory's filesystem
// has room for a rollback's record but not for its own undo: the rollback
// is refused before any write, naming --undo-dir as the remedy (not another
// --state-dir, which would lose the runs); with --undo-dir on another
// filesystem it runs, still finding the run in --state-dir.
func TestRollbackRefusedForRoomThenUndoDir(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(200, oldCfg)
	original := c.Raw()
	fsDir := smallFilesystem(t, 96<<20)
	state := filepath.Join(fsDir, "state")
	conn := []string{"--endpoints", c.Srv.Endpoint, "--liveness-window", "500ms", "--state-dir", state}
	if code, out, stderr := runCLI(t, append([]string{"migrate", "--encryption-provider-config", newCfg, "--target-version", "1.37"}, conn...)...); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	// The margin and 64 KiB left: a record fits, a snapshot does not.
	if err := os.WriteFile(filepath.Join(fsDir, "filler"), make([]byte, freeOn(t, fsDir)-guard.DiskMargin-64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	migrated, rev := c.Raw(), c.Revision()
	code, out, stderr := runCLI(t, append([]string{"rollback", "--run", "1", "--encryption-provider-config", newCfg}, conn...)...)
	if code != exitError || !strings.Contains(stderr, "not enough disk space on the filesystem of "+state) ||
		!strings.Contains(stderr, "or give a --undo-dir on another filesystem (the runs undone are still read from --state-dir)") {
		t.Fatalf("rollback on a full state directory: exit %d\n%s%s", code, out, stderr)
	}
	if c.Revision() != rev {
		t.Fatalf("etcd's revision moved: %d -> %d", rev, c.Revision())
	}
	for k, v := range migrated {
		if c.Raw()[k] != v {
			t.Fatalf("%s changed", k)
		}
	}
	code, out, stderr = runCLI(t, append([]string{"rollback", "--run", "1", "--undo-dir", filepath.Join(t.TempDir(), "undo"), "--encryption-provider-config", newCfg}, conn...)...)
	if code != exitOK {
		t.Fatalf("rollback --undo-dir: exit %d\n%s%s", code, out, stderr)
	}
	for k, v := range original {
		if c.Raw()[k] != v {
			t.Fatalf("%s not rolled back", k)
		}
	}
}
