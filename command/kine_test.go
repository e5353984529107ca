package command

import (
	"context"
	"errors"
	"fmt"
	"io"
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
