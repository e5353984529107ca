package command

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
)

// k3sMySQLNode lays out a k3s server node whose datastore-endpoint is a
// real MariaDB server's database (testmysql, on a unix socket), kine's
// datastore made and seeded in it as kube-apiserver writes
// (testkine.SeedMySQL); encryption, when set, is k3s's secrets-encryption
// configuration. It returns the node's root and the datastore-endpoint.
func k3sMySQLNode(t *testing.T, encryption string, seed func(*clientv3.Client)) (root, ep string) {
	t.Helper()
	ep = testmysql.Start(t)
	testkine.SeedMySQL(t, ep, seed)
	root = t.TempDir()
	config := fmt.Sprintf("datastore-endpoint: %q\n", ep)
	if encryption != "" {
		config += "secrets-encryption: true\n"
		nodeWrite(t, root, "/var/lib/rancher/k3s/server/cred/encryption-config.json", []byte(encryption))
	}
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte(config))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/token", nil)
	return root, ep
}

// TestMySQLWriteRefusals: on a k3s node whose datastore is MySQL (MariaDB),
// what a writing run there does not have is refused before anything is
// written, naming the database without its password: --snapshot (no
// snapshot of a database server: the journal is the undo; mysqldump named),
// the storage version migration flags and --compact-history. plan names
// the dump to take (mysqldump) and reads without writing. A wrong
// password, a database without kine's table and a server that does not
// answer are each one line naming the datastore, exit 1, nothing written.
// The kine table is unchanged row for row throughout.
func TestMySQLWriteRefusals(t *testing.T) {
	root, ep := k3sMySQLNode(t, "", nil)
	before := testkine.MySQLTable(t, ep)
	state := filepath.Join(t.TempDir(), "state")
	password := testmysql.Password(t, ep)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--snapshot", filepath.Join(t.TempDir(), "snap.db")}, "error: --snapshot: a MySQL datastore (the database kine on "},
		{[]string{"--snapshot", filepath.Join(t.TempDir(), "snap.db")}, "take a dump of the database first (mysqldump), and leave out --snapshot"},
		{[]string{"--compact-history"}, "error: --compact-history: not supported on a MySQL datastore served through kine (the database kine on "},
		{[]string{"--requested"}, "error: --requested: not supported on a MySQL datastore"},
		{[]string{"--record"}, "error: --record: not supported on a MySQL datastore"},
	} {
		code, out, stderr := runCLI(t, append([]string{"migrate", "--node-root", root, "--target-version", "1.37", "--state-dir", state}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(out+stderr, password) {
			t.Errorf("migrate %s on MySQL: exit %d, want %d and %q, no password\n%s", tc.args[0], code, exitUsage, tc.want, stderr)
		}
	}
	code, out, stderr := runCLI(t, "plan", "--node-root", root, "--target-version", "1.37", "--state-dir", state)
	if code != exitOK || !strings.Contains(out+stderr, "MySQL has no snapshot the tool can take; take a dump of the database first (the MySQL database kine on ") ||
		!strings.Contains(out+stderr, "mysqldump --single-transaction") || !strings.Contains(out+stderr, "MySQL has no quota") || strings.Contains(out+stderr, password) {
		t.Errorf("plan on MySQL: exit %d, want 0, mysqldump named, no password\n%s%s", code, out, stderr)
	}
	for _, args := range [][]string{{"verify", "--target-version", "1.37"}, {"inventory"}} {
		if code, out, stderr := runCLI(t, append(args, "--node-root", root)...); code != exitOK || strings.Contains(out+stderr, password) || !strings.Contains(out+stderr, "nothing is written to it") {
			t.Errorf("%s on MySQL: exit %d\n%s%s", args[0], code, out, stderr)
		}
	}
	// Bad input: one line naming the datastore, without the password.
	testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "CREATE DATABASE empty", "GRANT ALL ON empty.* TO '"+testmysql.User+"'@'localhost'")
	for name, tc := range map[string]struct{ endpoint, want string }{
		"wrong password": {strings.Replace(ep, password, "Wr0ngPw", 1), "error: the MySQL datastore kine on "},
		"no kine table":  {strings.Replace(ep, "/"+testmysql.Database, "/empty", 1), "no kine table: not a k3s or RKE2 datastore"},
		"no server":      {"mysql://k3s:" + password + "@tcp(127.0.0.1:1)/kubernetes", "error: the MySQL datastore kubernetes on 127.0.0.1:1: connecting: "},
	} {
		bad := t.TempDir()
		nodeWrite(t, bad, "/etc/rancher/k3s/config.yaml", fmt.Appendf(nil, "datastore-endpoint: %q\n", tc.endpoint))
		nodeWrite(t, bad, "/var/lib/rancher/k3s/server/token", nil)
		for _, args := range [][]string{{"inventory"}, {"migrate", "--target-version", "1.37", "--state-dir", filepath.Join(t.TempDir(), "state")}} {
			code, out, stderr := runCLI(t, append(append([]string(nil), args...), "--node-root", bad)...)
			i := strings.Index(stderr, "error: ")
			if code != exitError || i < 0 || !strings.Contains(stderr, tc.want) || strings.Contains(out+stderr, password) || strings.Contains(out+stderr, "Wr0ngPw") || strings.Count(strings.TrimSpace(stderr[i:]), "\n") != 0 {
				t.Errorf("%s, %s: exit %d, want %d and one line %q, no password\n%s%s", name, args[0], code, exitError, tc.want, out, stderr)
			}
		}
	}
	if after := testkine.MySQLTable(t, ep); !slices.Equal(after, before) {
		t.Errorf("a refused or reading command changed the kine table:\n%q\nwas\n%q", after, before)
	}
}

// TestMySQLQuarantine: on a k3s node on MySQL, quarantine removes a Secret
// no key of the configuration decrypts, its undo the journal alone (no
// snapshot recorded: runs --verify passes), and its rollback puts the
// Secret back, value and lease, from that journal.
func TestMySQLQuarantine(t *testing.T) {
	const key = "/registry/secrets/default/lost"
	lost := "k8s:enc:aescbc:v1:key9:" + strings.Repeat("\x07", 48) // key9: in no configuration
	root, ep := k3sMySQLNode(t, key2Secrets, func(c *clientv3.Client) {
		testkine.Create(t, c, key, lost, 3600)
	})
	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "quarantine", "--node-root", root, "--state-dir", state, "--reason", "undecryptable", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out+stderr, "no other client is connected to the MySQL datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
		t.Fatalf("quarantine on MySQL: exit %d, want 0, the database's clients checked and the journal its undo\n%s%s", code, out, stderr)
	}
	if strings.Contains(out+stderr, testmysql.Password(t, ep)) {
		t.Errorf("the database's password was printed")
	}
	if v, ok := testkine.MySQLLatest(t, ep)[key]; ok {
		t.Fatalf("after quarantine, %s is still there: %s", key, v)
	}
	if code, out, stderr := runCLI(t, "runs", "--state-dir", state, "--verify"); code != exitOK || !strings.Contains(out, "0001-quarantine") {
		t.Errorf("runs --verify of the quarantine on MySQL: exit %d, want 0\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-quarantine")
	if code != exitOK {
		t.Fatalf("rollback of the quarantine on MySQL: exit %d\n%s%s", code, out, stderr)
	}
	if got, want := testkine.MySQLLatest(t, ep)[key], fmt.Sprintf("lease 3600, value %X", lost); got != want {
		t.Errorf("after the rollback, %s: %.80q, want %.80q", key, got, want)
	}
}

// TestRestoreIntoMySQL: as TestRestoreIntoPostgres, on a k3s node whose
// datastore is MySQL: restore finds the database as every command does,
// checks that no other client is connected to it, creates the backup's
// Secrets under today's key2 (no value printed, the password neither), its
// undo the journal alone; runs --verify passes, and rollback --run removes
// what it created, every other key as it was (value and lease).
func TestRestoreIntoMySQL(t *testing.T) {
	c, oldCfg, backup := appBackup(t)
	ns, _, _ := c.Get("/registry/namespaces/app")
	root, ep := k3sMySQLNode(t, key2Secrets, func(kc *clientv3.Client) {
		testkine.Create(t, kc, "/registry/namespaces/app", string(ns), 0)
		testkine.Create(t, kc, "/registry/configmaps/app/kept", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"kept","namespace":"app"}}`, 3600)
	})
	password := testmysql.Password(t, ep)
	before := testkine.MySQLLatest(t, ep)

	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "restore", "--node-root", root, "--state-dir", state, "--target-version", "1.37",
		"--snapshot-file", backup, "--backup-encryption-provider-config", oldCfg, "--namespace", "app", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out, "create 2, overwrite 0, same 0, exists 0") ||
		!strings.Contains(out+stderr, "no other client is connected to the MySQL datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
		t.Fatalf("restore into the MySQL datastore: exit %d, want 0, two Secrets created, the database's clients checked and the journal its undo\n%s%s", code, out, stderr)
	}
	if strings.Contains(out+stderr, appSecret) || password == "" || strings.Contains(out+stderr, password) {
		t.Errorf("a decrypted value or the database's password was printed (or testmysql's endpoint has none)")
	}
	after := testkine.MySQLLatest(t, ep)
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
		t.Errorf("runs --verify of the restore on MySQL: exit %d, want 0\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-restore")
	if code != exitOK {
		t.Fatalf("rollback --run 0001-restore on MySQL: exit %d\n%s%s", code, out, stderr)
	}
	if got := testkine.MySQLLatest(t, ep); !maps.Equal(got, before) {
		t.Errorf("after the rollback the datastore holds %d keys, want the %d it held before: %v", len(got), len(before), slices.Collect(maps.Keys(got)))
	}
}
