package command

import (
	"fmt"
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

// TestMySQLReadsAndBadInput: on a k3s node whose datastore is MySQL
// (MariaDB), plan names the dump to take (mysqldump) and reads without
// writing, as verify and inventory do (TestServerWriteRefusals has what a
// writing run there refuses). A wrong password, a database without kine's
// table and a server that does not answer are each one line naming the
// datastore, exit 1, nothing written. The kine table is unchanged row for
// row throughout.
func TestMySQLReadsAndBadInput(t *testing.T) {
	root, ep := k3sMySQLNode(t, "", nil)
	before := testkine.MySQLTable(t, ep)
	state := filepath.Join(t.TempDir(), "state")
	password := testmysql.Password(t, ep)
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
