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
	"kube-etcd-migrate/internal/testrig/testmysql"
)

// databaseServers are the database servers a k3s or RKE2 datastore is kept
// in that the tool serves through kine (kine's pgsql and mysql drivers).
var databaseServers = []string{"PostgreSQL", "MySQL"}

// serverNode is a k3s server node whose datastore is a real database
// server's (k3sPostgresNode, k3sMySQLNode): kind is "PostgreSQL" or
// "MySQL", dump the dump its operator is told to take first; table and
// latest read kine's table there (every row; each key's latest row).
type serverNode struct {
	kind, dump, root, dsn, password string
	table                           func(testing.TB) []string
	latest                          func(testing.TB) map[string]string
}

func k3sServerNode(t *testing.T, kind, encryption string, seed func(*clientv3.Client)) serverNode {
	t.Helper()
	n := serverNode{kind: kind}
	switch kind {
	case "PostgreSQL":
		n.root, n.dsn = k3sPostgresNode(t, encryption, seed)
		u, err := url.Parse(n.dsn)
		if err != nil {
			t.Fatal(err)
		}
		n.password, _ = u.User.Password()
		n.dump = "pg_dump"
		n.table = func(t testing.TB) []string { return testkine.PGTable(t, n.dsn) }
		n.latest = func(t testing.TB) map[string]string { return testkine.PGLatest(t, n.dsn) }
	case "MySQL":
		n.root, n.dsn = k3sMySQLNode(t, encryption, seed)
		n.password = testmysql.Password(t, n.dsn)
		n.dump = "mysqldump"
		n.table = func(t testing.TB) []string { return testkine.MySQLTable(t, n.dsn) }
		n.latest = func(t testing.TB) map[string]string { return testkine.MySQLLatest(t, n.dsn) }
	default:
		t.Fatalf("no database server %q", kind)
	}
	if n.password == "" {
		t.Fatalf("the %s test server's DSN has no password", kind)
	}
	return n
}

// TestServerWriteRefusals: on a k3s node whose datastore is PostgreSQL or
// MySQL, what a writing run there does not have is refused before anything
// is written, naming the database without its password: --snapshot (no
// snapshot of a database server: the journal is the undo, the dump to take
// named), the storage version migration flags and --compact-history. The
// kine table is unchanged row for row.
func TestServerWriteRefusals(t *testing.T) {
	for _, kind := range databaseServers {
		t.Run(kind, func(t *testing.T) {
			n := k3sServerNode(t, kind, "", nil)
			before := n.table(t)
			state := filepath.Join(t.TempDir(), "state")
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"--snapshot", filepath.Join(t.TempDir(), "snap.db")}, "error: --snapshot: a " + kind + " datastore (the database kine on "},
				{[]string{"--snapshot", filepath.Join(t.TempDir(), "snap.db")}, "take a dump of the database first (" + n.dump + "), and leave out --snapshot"},
				{[]string{"--compact-history"}, "error: --compact-history: not supported on a " + kind + " datastore served through kine (the database kine on "},
				{[]string{"--requested"}, "error: --requested: not supported on a " + kind + " datastore"},
				{[]string{"--record"}, "error: --record: not supported on a " + kind + " datastore"},
			} {
				code, out, stderr := runCLI(t, append([]string{"migrate", "--node-root", n.root, "--target-version", "1.37", "--state-dir", state}, tc.args...)...)
				if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(out+stderr, n.password) {
					t.Errorf("migrate %s on %s: exit %d, want %d and %q, no password\n%s", tc.args[0], kind, code, exitUsage, tc.want, stderr)
				}
			}
			if after := n.table(t); !slices.Equal(after, before) {
				t.Errorf("a refused command changed the kine table:\n%q\nwas\n%q", after, before)
			}
		})
	}
}

// TestServerQuarantine: on a k3s node on PostgreSQL or MySQL, quarantine
// removes a Secret no key of the configuration decrypts, its undo the
// journal alone (no snapshot recorded: runs --verify passes), and its
// rollback puts the Secret back, value and lease, from that journal.
func TestServerQuarantine(t *testing.T) {
	const key = "/registry/secrets/default/lost"
	lost := "k8s:enc:aescbc:v1:key9:" + strings.Repeat("\x07", 48) // key9: in no configuration
	for _, kind := range databaseServers {
		t.Run(kind, func(t *testing.T) {
			n := k3sServerNode(t, kind, key2Secrets, func(c *clientv3.Client) {
				testkine.Create(t, c, key, lost, 3600)
			})
			state := filepath.Join(t.TempDir(), "state")
			code, out, stderr := runCLI(t, "quarantine", "--node-root", n.root, "--state-dir", state, "--reason", "undecryptable", "--resource", "secrets")
			if code != exitOK || !strings.Contains(out+stderr, "no other client is connected to the "+kind+" datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
				t.Fatalf("quarantine on %s: exit %d, want 0, the database's clients checked and the journal its undo\n%s%s", kind, code, out, stderr)
			}
			if strings.Contains(out+stderr, n.password) {
				t.Errorf("the database's password was printed")
			}
			if v, ok := n.latest(t)[key]; ok {
				t.Fatalf("after quarantine, %s is still there: %s", key, v)
			}
			if code, out, stderr := runCLI(t, "runs", "--state-dir", state, "--verify"); code != exitOK || !strings.Contains(out, "0001-quarantine") {
				t.Errorf("runs --verify of the quarantine on %s: exit %d, want 0\n%s%s", kind, code, out, stderr)
			}
			code, out, stderr = runCLI(t, "rollback", "--node-root", n.root, "--state-dir", state, "--run", "0001-quarantine")
			if code != exitOK {
				t.Fatalf("rollback of the quarantine on %s: exit %d\n%s%s", kind, code, out, stderr)
			}
			if got, want := n.latest(t)[key], fmt.Sprintf("lease 3600, value %X", lost); got != want {
				t.Errorf("after the rollback, %s: %.80q, want %.80q", key, got, want)
			}
		})
	}
}

// TestRestoreIntoServer: as TestRestoreIntoSQLite, on a k3s node whose
// datastore is PostgreSQL or MySQL: restore finds the database as every
// command does, checks that no other client is connected to it, creates the
// backup's Secrets under today's key2 (no value printed, the password
// neither), its undo the journal alone; runs --verify passes, and rollback
// --run removes what it created, every other key as it was (value and
// lease).
func TestRestoreIntoServer(t *testing.T) {
	c, oldCfg, backup := appBackup(t)
	ns, _, _ := c.Get("/registry/namespaces/app")
	for _, kind := range databaseServers {
		t.Run(kind, func(t *testing.T) {
			n := k3sServerNode(t, kind, key2Secrets, func(kc *clientv3.Client) {
				testkine.Create(t, kc, "/registry/namespaces/app", string(ns), 0)
				testkine.Create(t, kc, "/registry/configmaps/app/kept", `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"kept","namespace":"app"}}`, 3600)
			})
			before := n.latest(t)
			state := filepath.Join(t.TempDir(), "state")
			code, out, stderr := runCLI(t, "restore", "--node-root", n.root, "--state-dir", state, "--target-version", "1.37",
				"--snapshot-file", backup, "--backup-encryption-provider-config", oldCfg, "--namespace", "app", "--resource", "secrets")
			if code != exitOK || !strings.Contains(out, "create 2, overwrite 0, same 0, exists 0") ||
				!strings.Contains(out+stderr, "no other client is connected to the "+kind+" datastore kine on ") || !strings.Contains(out+stderr, "its undo is its journal") {
				t.Fatalf("restore into the %s datastore: exit %d, want 0, two Secrets created, the database's clients checked and the journal its undo\n%s%s", kind, code, out, stderr)
			}
			if strings.Contains(out+stderr, appSecret) || strings.Contains(out+stderr, n.password) {
				t.Errorf("a decrypted value or the database's password was printed")
			}
			after := n.latest(t)
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
				t.Errorf("runs --verify of the restore on %s: exit %d, want 0\n%s%s", kind, code, out, stderr)
			}
			code, out, stderr = runCLI(t, "rollback", "--node-root", n.root, "--state-dir", state, "--run", "0001-restore")
			if code != exitOK {
				t.Fatalf("rollback --run 0001-restore on %s: exit %d\n%s%s", kind, code, out, stderr)
			}
			if got := n.latest(t); !maps.Equal(got, before) {
				t.Errorf("after the rollback the datastore holds %d keys, want the %d it held before: %v", len(got), len(before), slices.Collect(maps.Keys(got)))
			}
		})
	}
}
