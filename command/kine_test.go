package command

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/plan"
)

// TestSQLiteSignals: SIGINT while verify reads a SQLite datastore's copy
// (a backup given as --snapshot-file), once (it stops) or twice (it exits
// at once), leaves nothing in $TMPDIR — the copy holds the cluster's
// values — and the backup unchanged.
func TestSQLiteSignals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s")
	if err := os.Mkdir(sock, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: sock})
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20000 {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/configmaps/default/cm-%05d", i), strings.Repeat("v", 500)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	s.Close()
	backup := filepath.Join(dir, "backup.db")
	if err := kinedb.Copy(ctx, db, backup); err != nil {
		t.Fatal(err)
	}
	before := sum256(t, backup)
	bin := toolBinary(t)
	for _, signals := range []int{1, 2} {
		tmp := t.TempDir()
		cmd := exec.Command(bin, "verify", "--snapshot-file", backup)
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		stderr := &lockedBuffer{}
		code := runInterrupted(t, cmd, stderr, "through kine", signals, 5*time.Millisecond)
		t.Logf("%d signal(s): exit %d", signals, code)
		// 1 (interrupted), 130 (second signal); 0, 3 or 4 if it finished first.
		if code != 1 && code != exitSignal && code != 0 && code != 3 && code != 4 {
			t.Errorf("%d signal(s): exit %d, stderr %q", signals, code, stderr.String())
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("%d signal(s), exit %d: left in $TMPDIR: %v (stderr %s)", signals, code, left, stderr.String())
		}
	}
	if sum256(t, backup) != before {
		t.Error("the backup changed")
	}

	// Which of the ways out a run takes depends on when the signals land;
	// the one that skips the deferred calls (os.Exit at the second) removes
	// the copy through removeKineDirs.
	t.Setenv("TMPDIR", t.TempDir())
	cfg, err := etcdOptions{}.config()
	if err != nil {
		t.Fatal(err)
	}
	k, err := serveKine(ctx, io.Discard, "verify", &kineStore{db: backup, name: backup}, false, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	removeKineDirs()
	if _, err := os.Stat(k.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removeKineDirs left %s: %v", k.dir, err)
	}
	k.close()
}

// TestSQLiteWriteRefusals: on a k3s node on SQLite, what a writing run
// there does not have is refused with one line naming the flag or the
// process, the datastore unchanged: --compact-history, --requested and
// --record (usage, exit 2); a process holding the database open (k3s
// running: exit 1, named).
func TestSQLiteWriteRefusals(t *testing.T) {
	root, db := k3sSQLiteNode(t, "", nil)
	before := testkine.Table(t, db)
	state := filepath.Join(t.TempDir(), "state")
	for _, flag := range []string{"--compact-history", "--requested", "--record"} {
		code, _, stderr := runCLI(t, "migrate", "--node-root", root, "--target-version", "1.37", "--state-dir", state, flag)
		if want := "error: " + flag + ": not supported on a SQLite datastore served through kine (" + db + ")"; code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("migrate %s on SQLite: exit %d, want %d and %q\n%s", flag, code, exitUsage, want, stderr)
		}
	}
	holder := exec.Command("sh", "-c", `exec 3<"$0"; exec sleep 30`, db)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ps, _ := kinedb.Holders(db); len(ps) > 0 {
			break
		}
	}
	code, _, stderr := runCLI(t, "migrate", "--node-root", root, "--state-dir", state, "--target-version", "1.37")
	if want := fmt.Sprintf("sleep (pid %d): stop it first", holder.Process.Pid); code != exitError || !strings.Contains(stderr, "kine datastore "+db+" is open in") || !strings.Contains(stderr, want) {
		t.Errorf("migrate with the datastore held open: exit %d, want %d and %q\n%s", code, exitError, want, stderr)
	}
	if after := testkine.Table(t, db); !slices.Equal(after, before) {
		t.Errorf("a refused command changed the kine table:\n%q\nwas\n%q", after, before)
	}
	if runs, err := os.ReadDir(state); err == nil && len(runs) > 0 {
		t.Errorf("a refused command left files in the state directory: %v", runs)
	}
}

// TestSQLiteQuarantine: on a k3s node on SQLite, quarantine removes a
// Secret no key of the configuration decrypts (written through kine as
// kube-apiserver writes it), and its rollback puts it back, value and
// lease, from the run's journal.
func TestSQLiteQuarantine(t *testing.T) {
	const key = "/registry/secrets/default/lost"
	lost := "k8s:enc:aescbc:v1:key9:" + strings.Repeat("\x07", 48) // key9: in no configuration
	root, db := k3sSQLiteNode(t, key2Secrets, func(c *clientv3.Client) {
		testkine.Create(t, c, key, lost, 3600)
	})
	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "quarantine", "--node-root", root, "--state-dir", state, "--reason", "undecryptable", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out+stderr, "no other process holds the SQLite datastore "+db+" open") {
		t.Fatalf("quarantine on SQLite: exit %d, want 0 and the datastore's holders checked\n%s%s", code, out, stderr)
	}
	if v, ok := testkine.Latest(t, db)[key]; ok {
		t.Fatalf("after quarantine, %s is still there: %s", key, v)
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-quarantine")
	if code != exitOK {
		t.Fatalf("rollback of the quarantine on SQLite: exit %d\n%s%s", code, out, stderr)
	}
	if got, want := testkine.Latest(t, db)[key], fmt.Sprintf("lease 3600, value %X", lost); got != want {
		t.Errorf("after the rollback, %s: %.80q, want %.80q", key, got, want)
	}
}

// key2Secrets is an encryption configuration of Secrets under aescbc key2.
const key2Secrets = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: ['secrets']\n  providers:\n  - aescbc:\n      keys:\n      - name: key2\n        secret: AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\n  - identity: {}\n"

// k3sSQLiteNode lays out a k3s server node on SQLite under a new root as
// k3s lays it out (config.yaml; with encryption, secrets-encryption and its
// configuration at server/cred/encryption-config.json; the datastore at
// server/db/state.db, kine's table made in it), seeds the datastore through
// kine and returns the root and the database file.
func k3sSQLiteNode(t *testing.T, encryption string, seed func(*clientv3.Client)) (root, db string) {
	t.Helper()
	root = t.TempDir()
	config := "write-kubeconfig-mode: \"0644\"\n"
	if encryption != "" {
		config = "secrets-encryption: true\n"
		nodeWrite(t, root, "/var/lib/rancher/k3s/server/cred/encryption-config.json", []byte(encryption))
	}
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte(config))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/db/state.db", nil)
	db = filepath.Join(root, "/var/lib/rancher/k3s/server/db/state.db")
	testkine.Seed(t, db, seed)
	return root, db
}

// TestSQLitePlanTimesWrites: plan on a k3s node on SQLite times migrate's
// writes on its private copy of the datastore (the node's file and its
// write-ahead log unchanged byte for byte, nothing added beside them,
// nothing left in $TMPDIR): every
// stale key written there as migrate writes it, and a range at least as
// long as those writes one after another; its snapshot part is the copy's
// own VACUUM INTO, and the text says nothing of etcd's metrics.
func TestSQLitePlanTimesWrites(t *testing.T) {
	const n = 150
	root, db := k3sSQLiteNode(t, key2Secrets, func(c *clientv3.Client) {
		for i := range n {
			lease := int64(0)
			if i%4 == 0 {
				lease = 3600
			}
			name := fmt.Sprintf("s-%04d", i)
			testkine.Create(t, c, "/registry/secrets/default/"+name, `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"`+name+`","namespace":"default"},"data":{"k":"`+strings.Repeat("QUJD", 200)+`"}}`, lease)
		}
	})
	// The node's file and its write-ahead log, byte for byte. Opening a
	// database in WAL mode, even read-only (the copy's VACUUM INTO), makes
	// an empty state.db-wal and SQLite's index of it, state.db-shm, when
	// they are not there: nothing else may appear beside them.
	dir := filepath.Dir(db)
	files := func() map[string][32]byte {
		t.Helper()
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][32]byte{}
		for _, e := range es {
			if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			} else if !strings.HasSuffix(e.Name(), "-shm") && (len(b) > 0 || !strings.HasSuffix(e.Name(), "-wal")) {
				m[e.Name()] = sha256.Sum256(b)
			}
		}
		return m
	}
	before := files()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	flags := []string{"--node-root", root, "--target-version", "1.37"}
	code, out, stderr := runCLI(t, append([]string{"plan", "-o", "json"}, flags...)...)
	var p plan.Plan
	if code != exitOK || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("plan -o json on SQLite: exit %d\n%s%s", code, out, stderr)
	}
	e := p.Estimate
	ws := e.Writes
	if p.Summary.Stale != n || ws == nil || ws.Error != "" || ws.Writes != n || ws.Writers != 16 || len(ws.Rounds) != 4 || ws.Seconds <= 0 || ws.CPUSeconds <= 0 {
		t.Fatalf("plan on SQLite: %d stale, write sample %+v; want every one of the %d stale keys written to its copy, in 4 timed rounds", p.Summary.Stale, ws, n)
	}
	fastest := ws.Seconds
	for _, r := range ws.Rounds {
		fastest = min(fastest, r.Seconds)
	}
	parts := map[string]plan.EstimatePart{}
	for _, part := range e.Parts {
		parts[part.Name] = part
	}
	body, snap := parts["decisions and writes"], parts["snapshot"]
	if body.Low < fastest || e.Low < body.Low || !strings.Contains(body.Basis, "written to plan's private copy of the datastore through kine") {
		t.Errorf("the writes' part %.3f–%.3f s (range %.3f–%.3f s), want at least the sample's fastest round (%.3f s), its basis the timed writes: %s", body.Low, body.High, e.Low, e.High, fastest, body.Basis)
	}
	if snap.Low <= 0 || !strings.Contains(snap.Basis, "VACUUM INTO") {
		t.Errorf("the snapshot part %.3f–%.3f s: %s; want the copy's VACUUM INTO, timed", snap.Low, snap.High, snap.Basis)
	}
	code, out, stderr = runCLI(t, append([]string{"plan"}, flags...)...)
	t.Logf("plan on SQLite:\n%s", out)
	if code != exitOK || strings.Contains(out, "etcd's metrics") || !strings.Contains(out, "written to plan's private copy") {
		t.Errorf("plan on SQLite: exit %d, want 0, the writes timed and no word of etcd's metrics\n%s%s", code, out, stderr)
	}
	if after := files(); !maps.Equal(after, before) {
		t.Errorf("plan changed the node's datastore %s (the files of its directory, by name and sha256):\n%x\nwas\n%x", db, after, before)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("plan left its copy of the datastore in $TMPDIR: %v", left)
	}
}
