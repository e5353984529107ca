package command

import (
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testpg"
)

// k3sPostgresNode lays out a k3s server node whose datastore-endpoint is a
// real PostgreSQL server's database (testpg), kine's datastore made and
// seeded in it as kube-apiserver writes (testkine.SeedPG); encryption, when
// set, is k3s's secrets-encryption configuration. It returns the node's
// root and the database's DSN.
func k3sPostgresNode(t *testing.T, encryption string, seed func(*clientv3.Client)) (root, dsn string) {
	t.Helper()
	dsn = testpg.Start(t)
	testkine.SeedPG(t, dsn, seed)
	root = t.TempDir()
	config := fmt.Sprintf("datastore-endpoint: %q\n", dsn)
	if encryption != "" {
		config += "secrets-encryption: true\n"
		nodeWrite(t, root, "/var/lib/rancher/k3s/server/cred/encryption-config.json", []byte(encryption))
	}
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte(config))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/token", nil)
	return root, dsn
}

// TestPostgresWriteRefusals: on a k3s node whose datastore is PostgreSQL,
// what a writing run there does not have is refused before anything is
// written, naming the database without its password: --snapshot (no
// snapshot of a database server: the journal is the undo), the storage
// version migration flags and --compact-history. The kine table is
// unchanged row for row.
func TestPostgresWriteRefusals(t *testing.T) {
	root, dsn := k3sPostgresNode(t, "", nil)
	before := testkine.PGTable(t, dsn)
	state := filepath.Join(t.TempDir(), "state")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	password, ok := u.User.Password()
	if !ok || password == "" {
		t.Fatalf("testpg's DSN has no password")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--snapshot", filepath.Join(t.TempDir(), "snap.db")}, "error: --snapshot: a PostgreSQL datastore (the database kine on "},
		{[]string{"--compact-history"}, "error: --compact-history: not supported on a PostgreSQL datastore served through kine (the database kine on "},
		{[]string{"--requested"}, "error: --requested: not supported on a PostgreSQL datastore"},
		{[]string{"--record"}, "error: --record: not supported on a PostgreSQL datastore"},
	} {
		code, out, stderr := runCLI(t, append([]string{"migrate", "--node-root", root, "--target-version", "1.37", "--state-dir", state}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(out+stderr, password) {
			t.Errorf("migrate %s on PostgreSQL: exit %d, want %d and %q, no password\n%s", tc.args[0], code, exitUsage, tc.want, stderr)
		}
	}
	if after := testkine.PGTable(t, dsn); !slices.Equal(after, before) {
		t.Errorf("a refused command changed the kine table:\n%q\nwas\n%q", after, before)
	}
}

// TestPostgresQuarantine: on a k3s node on PostgreSQL, quarantine removes
// a Secret no key of the configuration decrypts, its undo the journal alone
// (no snapshot recorded: runs --verify passes), and its rollback puts the
// Secret back, value and lease, from that journal.
func TestPostgresQuarantine(t *testing.T) {
	const key = "/registry/secrets/default/lost"
	lost := "k8s:enc:aescbc:v1:key9:" + strings.Repeat("\x07", 48) // key9: in no configuration
	root, dsn := k3sPostgresNode(t, key2Secrets, func(c *clientv3.Client) {
		testkine.Create(t, c, key, lost, 3600)
	})
	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "quarantine", "--node-root", root, "--state-dir", state, "--reason", "undecryptable", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out+stderr, "no other client is connected to the PostgreSQL datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
		t.Fatalf("quarantine on PostgreSQL: exit %d, want 0, the database's clients checked and the journal its undo\n%s%s", code, out, stderr)
	}
	if v, ok := testkine.PGLatest(t, dsn)[key]; ok {
		t.Fatalf("after quarantine, %s is still there: %s", key, v)
	}
	if code, out, stderr := runCLI(t, "runs", "--state-dir", state, "--verify"); code != exitOK || !strings.Contains(out, "0001-quarantine") {
		t.Errorf("runs --verify of the quarantine on PostgreSQL: exit %d, want 0\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-quarantine")
	if code != exitOK {
		t.Fatalf("rollback of the quarantine on PostgreSQL: exit %d\n%s%s", code, out, stderr)
	}
	if got, want := testkine.PGLatest(t, dsn)[key], fmt.Sprintf("lease 3600, value %X", lost); got != want {
		t.Errorf("after the rollback, %s: %.80q, want %.80q", key, got, want)
	}
}

// TestRestoreIntoPostgres: as TestRestoreIntoSQLite, on a k3s node whose
// datastore is PostgreSQL: restore finds the database as every command does,
// checks that no other client is connected to it, creates the backup's
// Secrets under today's key2 (no value printed, the password neither), its
// undo the journal alone; runs --verify passes, and rollback --run removes
// what it created, every other key as it was (value and lease).
func TestRestoreIntoPostgres(t *testing.T) {
	c, oldCfg, backup := appBackup(t)
	ns, _, _ := c.Get("/registry/namespaces/app")
	root, dsn := k3sPostgresNode(t, key2Secrets, func(kc *clientv3.Client) {
		testkine.Create(t, kc, "/registry/namespaces/app", string(ns), 0)
		testkine.Create(t, kc, "/registry/configmaps/app/kept", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"kept","namespace":"app"}}`, 3600)
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	before := testkine.PGLatest(t, dsn)

	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "restore", "--node-root", root, "--state-dir", state, "--target-version", "1.37",
		"--snapshot-file", backup, "--backup-encryption-provider-config", oldCfg, "--namespace", "app", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out, "create 2, overwrite 0, same 0, exists 0") ||
		!strings.Contains(out+stderr, "no other client is connected to the PostgreSQL datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
		t.Fatalf("restore into the PostgreSQL datastore: exit %d, want 0, two Secrets created, the database's clients checked and the journal its undo\n%s%s", code, out, stderr)
	}
	if strings.Contains(out+stderr, appSecret) || password == "" || strings.Contains(out+stderr, password) {
		t.Errorf("a decrypted value or the database's password was printed (or testpg's DSN has none)")
	}
	after := testkine.PGLatest(t, dsn)
	for _, name := range []string{"a", "b"} {
		if v := after["/registry/secrets/app/"+name]; !strings.Contains(v, "value 6B38733A656E633A6165736362633A76313A6B6579323A") { // k8s:enc:aescbc:v1:key2:
			t.Errorf("restored secret %s: %.80s, want it under today's key2", name, v)
		}
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("restore changed %s: %.80q, was %.80q", k, after[k], v)
		}
	}
	if code, out, stderr := runCLI(t, "runs", "--state-dir", state, "--verify"); code != exitOK || !strings.Contains(out, "0001-restore") {
		t.Errorf("runs --verify of the restore on PostgreSQL: exit %d, want 0\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-restore")
	if code != exitOK {
		t.Fatalf("rollback --run 0001-restore on PostgreSQL: exit %d\n%s%s", code, out, stderr)
	}
	if got := testkine.PGLatest(t, dsn); !maps.Equal(got, before) {
		t.Errorf("after the rollback the datastore holds %d keys, want the %d it held before: %v", len(got), len(before), slices.Collect(maps.Keys(got)))
	}
}
