package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/verify"
	"kube-etcd-migrate/writerun"
)

var plainBinary struct {
	once sync.Once
	dir  string
	path string
	out  []byte
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if plainBinary.dir != "" {
		os.RemoveAll(plainBinary.dir)
	}
	os.Exit(code)
}

// toolBinary is the binary built from this module, once per test binary.
func toolBinary(t *testing.T) string {
	t.Helper()
	plainBinary.once.Do(func() {
		plainBinary.dir, plainBinary.err = os.MkdirTemp("", "kem-command-test-")
		if plainBinary.err != nil {
			return
		}
		plainBinary.path = filepath.Join(plainBinary.dir, "kube-etcd-migrate")
		plainBinary.out, plainBinary.err = exec.Command("go", "build", "-o", plainBinary.path, "..").CombinedOutput()
	})
	if plainBinary.err != nil {
		t.Fatalf("go build: %v\n%s", plainBinary.err, plainBinary.out)
	}
	return plainBinary.path
}

// killMidRun starts the binary with args and SIGKILLs it once etcd has seen
// `after` writes under /registry/ since rev; it returns the revision etcd was
// at when the process was dead.
func killMidRun(t *testing.T, c *testcluster.Cluster, after int, args ...string) {
	t.Helper()
	killMidRunOf(t, toolBinary(t), c, after, args...)
}

// killMidRunOf is killMidRun of the binary bin.
func killMidRunOf(t *testing.T, bin string, c *testcluster.Cluster, after int, args ...string) {
	t.Helper()
	rev := c.Revision()
	cmd := exec.Command(bin, args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writes := 0
	for resp := range c.Cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if writes += len(resp.Events); writes >= after {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatalf("the run finished before it was killed (%d writes seen); stderr:\n%s", writes, errb.String())
	}
	if writes < after {
		t.Fatalf("only %d writes seen before the run ended; stderr:\n%s", writes, errb.String())
	}
}

func fileSHA(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestUndoAcrossReruns is the undo an operator relies on when a migration
// fails part-way: migrate with no undo flag keeps a journal and a snapshot in
// its run directory; it is killed mid-run, rerun and killed again, then run
// once more to completion. Each run has its own directory and snapshot, and
// the first run's snapshot (the state before any write) is never touched.
// `rollback --run` of the first run, after a dry run that writes nothing,
// puts every key back byte for byte as it was before the first run.
func TestUndoAcrossReruns(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 1500
	c.SeedMany(n, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	t.Setenv(undo.EnvStateDir, state)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	// The killed runs rewrite secrets (to key2); the last run rewrites them again (key3).
	slow := append([]string{"migrate", "--liveness-window", "500ms", "--writers", "1", "--batch-ops", "1", "--resource", "secrets"}, conn...)

	killMidRun(t, c, 100, slow...)
	first := filepath.Join(state, "runs", "0001-migrate")
	snap1 := filepath.Join(first, undo.SnapshotFile)
	sum1 := fileSHA(t, snap1)
	if fi, err := os.Stat(filepath.Join(first, undo.JournalFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("first run's journal: %v %v", fi, err)
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory: %v %v, want mode 0700", fi, err)
	}
	killMidRun(t, c, 100, slow...)
	// The third run rotates once more (key3): it rewrites every key, those the
	// killed runs wrote too, so that undoing the runs in the wrong order fails.
	conn[3] = c.EncryptionConfig("newer.yaml", testcluster.AESCBC("key3", 3), testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	code, out, stderr := runCLI(t, append([]string{"migrate", "--liveness-window", "500ms"}, conn...)...)
	if code != exitOK {
		t.Fatalf("third migrate: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "run 0003-migrate: its undo is kept in "+filepath.Join(state, "runs", "0003-migrate")) {
		t.Errorf("migrate does not say where its undo is:\n%s", stderr)
	}
	if code, out, stderr := runCLI(t, append([]string{"verify"}, conn...)...); code != exitOK {
		t.Fatalf("verify after the migration: exit %d\n%s%s", code, out, stderr)
	}

	// The runs as an operator lists them: two killed, one finished, each with its snapshot.
	code, out, stderr = runCLI(t, "runs", "-o", "json")
	if code != exitOK {
		t.Fatalf("runs: exit %d\n%s%s", code, out, stderr)
	}
	var listed struct {
		Runs []writerun.RunView `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("runs -o json: %v\n%s", err, out)
	}
	if len(listed.Runs) != 3 || listed.Runs[0].Finished() || listed.Runs[1].Finished() || !listed.Runs[2].Finished() || *listed.Runs[2].ExitCode != 0 || listed.Runs[2].KeysWritten == 0 {
		t.Fatalf("runs: %s", out)
	}
	for _, r := range listed.Runs {
		if !r.SnapshotTaken || !r.JournalKept {
			t.Errorf("run %s: snapshot taken %v, journal kept %v", r.ID, r.SnapshotTaken, r.JournalKept)
		}
		// What removing the run's files would free, as the files are.
		if r.SnapshotBytes == 0 || r.SnapshotBytes != guard.FileSize(r.Snapshot) || r.JournalBytes == 0 || r.JournalBytes != guard.FileSize(r.Journal) {
			t.Errorf("run %s: snapshot %d bytes (file %d), journal %d bytes (file %d)", r.ID, r.SnapshotBytes, guard.FileSize(r.Snapshot), r.JournalBytes, guard.FileSize(r.Journal))
		}
	}
	if code, out, _ := runCLI(t, "runs"); code != exitOK || !strings.Contains(out, listed.Runs[0].Snapshot+" ("+textfmt.Bytes(listed.Runs[0].SnapshotBytes)+")") {
		t.Errorf("runs does not show the first snapshot's size:\n%s", out)
	}
	// The first snapshot is the state before any write: every object stale.
	code, out, _ = runCLI(t, "verify", "--snapshot-file", snap1, "--encryption-provider-config", conn[3], "--target-version", "1.37", "-o", "json")
	var rep verify.Report
	if code != exitStale || json.Unmarshal([]byte(out), &rep) != nil || rep.Summary.Stale != 2*n {
		t.Fatalf("verify of the first run's snapshot: exit %d, %+v\n%s", code, rep.Summary, out)
	}

	// A dry run of the rollback writes nothing.
	rev := c.Revision()
	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", conn[3], "--run", "0001-migrate", "--dry-run")
	if code != exitOK || !strings.Contains(out, "would restore") || c.Revision() != rev {
		t.Fatalf("rollback --dry-run: exit %d, revision %d -> %d\n%s%s", code, rev, c.Revision(), out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", conn[3], "--run", "1", "--liveness-window", "500ms")
	if code != exitOK {
		t.Fatalf("rollback: exit %d\n%s%s", code, out, stderr)
	}
	c.RequireBack(before)
	if fileSHA(t, snap1) != sum1 {
		t.Fatal("the first run's snapshot changed")
	}
	recs, err := undo.StateDir(state).List()
	if err != nil || len(recs) != 4 || recs[3].Command != "rollback" || strings.Join(recs[3].Undoes, ",") != "0003-migrate,0002-migrate,0001-migrate" {
		t.Fatalf("runs after the rollback: %+v %v", recs, err)
	}
}

// TestRollbackRefusesARemovedRun: an operator removes a run directory by hand
// (to free its snapshot's disk space) while an earlier run is still the one to
// undo. What the removed run wrote has no undo left, so `rollback --run` of the
// earlier run — which would put back only that run's keys and exit 0 — is
// refused before any write, naming the missing run and the ways back; etcd is
// left byte for byte. `runs` shows the gap, and the removed run's number is
// never given again.
func TestRollbackRefusesARemovedRun(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(1500, oldCfg)
	state := testcluster.StateDir(t)
	t.Setenv(undo.EnvStateDir, state)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37", "--liveness-window", "500ms"}
	// Run 1 is killed part-way; run 2, the rerun, rewrites the rest: keys run 1 did not write.
	killMidRun(t, c, 100, append([]string{"migrate", "--writers", "1", "--batch-ops", "1", "--resource", "secrets"}, conn...)...)
	if code, out, stderr := runCLI(t, append([]string{"migrate"}, conn...)...); code != exitOK {
		t.Fatalf("the rerun: exit %d\n%s%s", code, out, stderr)
	}
	second := filepath.Join(state, "runs", "0002-migrate")
	if err := os.RemoveAll(second); err != nil {
		t.Fatal(err)
	}

	before, rev := c.Raw(), c.Revision()
	for _, dry := range [][]string{{"--dry-run"}, nil} {
		code, out, stderr := runCLI(t, append([]string{"rollback", "--endpoints", c.Srv.Endpoint, "--run", "1", "--liveness-window", "500ms"}, dry...)...)
		if code != exitError || !strings.Contains(stderr, "run 0002-migrate is missing from "+filepath.Join(state, "runs")) ||
			!strings.Contains(stderr, "run 0001-migrate's snapshot "+filepath.Join(state, "runs", "0001-migrate", undo.SnapshotFile)) {
			t.Fatalf("rollback %v of run 1 with run 2 removed: exit %d, want %d naming the missing run and run 1's snapshot\n%s%s", dry, code, exitError, out, stderr)
		}
	}
	if c.Revision() != rev {
		t.Fatalf("the refused rollback wrote: revision %d -> %d", rev, c.Revision())
	}
	after := c.Raw()
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s changed", k)
		}
	}

	code, out, stderr := runCLI(t, "runs")
	if code != exitOK || !strings.Contains(out, "missing: 0002-migrate (run directory removed, its undo with it") {
		t.Fatalf("runs: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "runs", "-o", "json")
	var listed struct {
		Missing []undo.MissingRun `json:"missing"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Missing) != 1 || listed.Missing[0].ID != "0002-migrate" || listed.Missing[0].WroteNothing {
		t.Fatalf("runs -o json: exit %d\n%s%s", code, out, stderr)
	}
	// The next writing run is 0003, not a second 0002.
	if code, out, stderr := runCLI(t, append([]string{"migrate"}, conn...)...); code != exitOK || !strings.Contains(stderr, "run 0003-migrate") {
		t.Fatalf("the next migrate: exit %d, want it numbered 0003\n%s%s", code, out, stderr)
	}
}

// smallFilesystem mounts a tmpfs of size bytes (the test needs root, as the
// tool does on a control-plane node) and unmounts it at the end.
func smallFilesystem(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mount a tmpfs (CI runs as root): %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here (not root?): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	return dir
}

// TestFullDiskRefusedBeforeAnyWrite: a state directory on a full filesystem
// (the one /var/lib/etcd is often on) refuses migrate before its first write,
// with one line giving the room needed and the room found; etcd is left byte
// for byte. With room made, the same command runs.
func TestFullDiskRefusedBeforeAnyWrite(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(200, oldCfg)
	fsDir := smallFilesystem(t, 96<<20)
	filler := filepath.Join(fsDir, "filler")
	if err := os.WriteFile(filler, make([]byte, 95<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(fsDir, "state")
	before, rev := c.Raw(), c.Revision()
	args := []string{"migrate", "--liveness-window", "500ms", "--state-dir", state, "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	code, out, stderr := runCLI(t, args...)
	if code != exitError || !strings.Contains(stderr, "not enough disk space on the filesystem of "+filepath.Join(state, "runs", "0001-migrate")) || !strings.Contains(stderr, "nothing was written") {
		t.Fatalf("migrate on a full disk: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("%s", stderr)
	if strings.Count(strings.TrimPrefix(stderr[strings.Index(stderr, "error: "):], "error: "), "\n") != 1 {
		t.Errorf("the refusal is not one line:\n%s", stderr)
	}
	if c.Revision() != rev {
		t.Fatalf("etcd's revision moved from %d to %d: something was written", rev, c.Revision())
	}
	for k, v := range c.Raw() {
		if before[k] != v {
			t.Fatalf("%s changed", k)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := runCLI(t, args...); code != exitOK {
		t.Fatalf("migrate with room: exit %d\n%s%s", code, out, stderr)
	}
}

// TestOneWritingRunAtATime: while a run holds the state directory, another
// writing run is refused before any write, naming the holder.
func TestOneWritingRunAtATime(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.SeedMany(5, oldCfg)
	state := testcluster.StateDir(t)
	held, err := undo.StateDir(state).Open()
	if err != nil {
		t.Fatal(err)
	}
	rev := c.Revision()
	code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37")
	if code != exitError || !strings.Contains(stderr, "is in use by another run (pid ") || !strings.Contains(stderr, "nothing was written") || c.Revision() != rev {
		t.Fatalf("migrate beside a held state directory: exit %d, revision %d -> %d\n%s%s", code, rev, c.Revision(), out, stderr)
	}
	held.Close()
	if code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("migrate once released: exit %d\n%s%s", code, out, stderr)
	}
}

// TestRollbackRefusesLiveAPIServer: rollback watches etcd as migrate does: a
// kube-apiserver renewing its identity lease (its node's clock 10 minutes
// slow) refuses it before any write, naming the lease; with the apiserver
// stopped the same rollback restores every key.
func TestRollbackRefusesLiveAPIServer(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.SeedMany(20, oldCfg)
	before := c.Raw()
	if code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	migrated := c.Raw()
	lease := "/registry/leases/kube-system/apiserver-cp1"
	stop := c.Renewer(t, "apiserver-cp1", "cp-1", -10*time.Minute)
	code, out, stderr := runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "1s")
	stop()
	if code != exitError || !strings.Contains(stderr, "a kube-apiserver is alive") || !strings.Contains(stderr, "cp-1: "+lease) {
		t.Fatalf("rollback beside a live kube-apiserver: exit %d\n%s%s", code, out, stderr)
	}
	for k, v := range c.Raw() {
		if k != lease && migrated[k] != v {
			t.Fatalf("%s changed: the refused rollback wrote", k)
		}
	}
	if _, err := c.Cli.Delete(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms"); code != exitOK {
		t.Fatalf("rollback with the apiserver stopped: exit %d\n%s%s", code, out, stderr)
	}
	after := c.Raw()
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s: not back byte for byte", k)
		}
	}
}

// TestRollbackOfQuarantineAndOfItself: quarantine keeps its undo in a run
// directory; rollback --run puts the removed key back byte for byte (a
// creation the rollback journals), and a rollback of that rollback removes it
// again: every writing run, rollback included, can be undone.
func TestRollbackOfQuarantineAndOfItself(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	key := "/registry/example.com/gizmos/default/g1"
	value := []byte(`{"apiVersion":"example.com/v1","kind":"Gizmo","metadata":{"name":"g1","namespace":"default"}}` + "\n")
	c.PutRaw(key, value)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--liveness-window", "500ms"}
	if code, out, stderr := runCLI(t, append([]string{"quarantine", "--reason", "orphaned"}, conn...)...); code != exitOK {
		t.Fatalf("quarantine: exit %d\n%s%s", code, out, stderr)
	}
	if c.Raw()[key] != "" {
		t.Fatalf("%s not removed", key)
	}
	if code, out, stderr := runCLI(t, append([]string{"rollback", "--run", "0001-quarantine"}, conn...)...); code != exitOK || !strings.Contains(out, "restored 1,") {
		t.Fatalf("rollback of the quarantine: exit %d\n%s%s", code, out, stderr)
	}
	if v, _, _ := c.Get(key); !bytes.Equal(v, value) {
		t.Fatalf("%s not back byte for byte: %q", key, v)
	}
	if code, out, stderr := runCLI(t, append([]string{"rollback", "--run", "0002-rollback"}, conn...)...); code != exitOK || !strings.Contains(out, "restored 1,") {
		t.Fatalf("rollback of the rollback: exit %d\n%s%s", code, out, stderr)
	}
	if c.Raw()[key] != "" {
		t.Fatalf("%s still there after the rollback of its restore", key)
	}
}
