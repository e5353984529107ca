package e2e

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/internal/testrig/testpg"
	"kube-etcd-migrate/verify"
)

// k3sServerNode lays out a k3s server node under root whose datastore is
// the database server's database dsn, a postgres:// or mysql://
// datastore-endpoint (k3s pkg/cli/cmds/server.go: datastore-endpoint;
// pkg/daemons/control hands it to kine), with secrets encryption as
// k3sSQLiteNode's.
func k3sServerNode(t *testing.T, root, dsn string, providers ...string) (enc string) {
	t.Helper()
	_, enc = k3sSQLiteNode(t, root, providers...)
	config := fmt.Sprintf("secrets-encryption: true\ndatastore-endpoint: %q\n", dsn)
	if err := os.WriteFile(filepath.Join(root, "etc/rancher/k3s/config.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return enc
}

// kineTable is kine's table in the database db as it is, row by row (every
// column, in id order, "|" between them): the name as text, the numbers
// in decimal, value and old_value in hex.
func kineTable(t *testing.T, db *sql.DB) []string {
	t.Helper()
	defer db.Close()
	rs, err := db.Query("SELECT id, name, created, deleted, create_revision, prev_revision, lease, value, old_value FROM kine ORDER BY id")
	if err != nil {
		t.Fatalf("reading kine's table: %v", err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		vals := make([]any, 9)
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			switch b := v.(type) {
			case []byte:
				if i >= 7 {
					row[i] = hex.EncodeToString(b)
				} else {
					row[i] = string(b) // the name, or a number as MySQL's text protocol sends it
				}
			default:
				row[i] = fmt.Sprint(v)
			}
		}
		out = append(out, strings.Join(row, "|"))
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestK3sServer: as TestK3sSQLite, on k3s's PostgreSQL and MySQL
// datastores — a real PostgreSQL server (Debian's package) and a real
// MariaDB server (Debian's mariadb-server), kine on each as k3s runs it.
// The previous release's kube-apiserver writes one object of every
// resource under key1. While that "k3s" still runs, verify reads the
// database (exit 3) without a write of its own, and migrate is refused,
// naming the other client, the table unchanged row for row. With it
// stopped and the key rotated: plan proceeds and says to take a dump
// (pg_dump, mysqldump); migrate rewrites (exit 0; runs --verify and verify
// exit 0); rollback --run puts back every key's latest row (value and
// lease); migrated again, the linked release's kube-apiserver on kine with
// key2 alone serves every object as the previous release served it, and a
// no-op update of each keeps its resourceVersion.
func TestK3sServer(t *testing.T) {
	for _, tc := range []struct {
		kind   string                                     // as the tool names it
		start  func(testing.TB) string                    // a fresh server: its database's datastore-endpoint
		open   func(testing.TB, string) *sql.DB           // database/sql on the datastore-endpoint's database
		latest func(testing.TB, string) map[string]string // every key's latest row (value and lease)
		dump   string                                     // the dump plan says to take
		// password is the datastore-endpoint's password, which must be
		// printed nowhere: not by migrate, refused or run, nor by inventory
		// (which must not print the whole datastore-endpoint either).
		password func(testing.TB, string) string
		// otherSessions: how migrate refused beside k3s's kine names it,
		// besides "stop" ("": nothing more checked).
		otherSessions string
	}{
		{kind: "PostgreSQL", start: testpg.Start, open: testpg.Open, latest: testkine.PGLatest, dump: "pg_dump", password: testpg.Password},
		{kind: "MySQL", start: testmysql.Start, open: testmysql.Open, latest: testkine.MySQLLatest, dump: "mysqldump",
			password: testmysql.Password, otherSessions: "has other sessions: session "},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			ctx := context.Background()
			dsn := tc.start(t)
			root := t.TempDir()
			enc := k3sServerNode(t, root, dsn, aescbcProvider("key1", 1))
			k3s := testkine.ServeK3s(t, dsn)
			old := apiserverproc.Start(t, apiserverproc.Options{
				Binary:               olderAPIServer(t, modbuild.PreviousKubernetes),
				EtcdURL:              k3s.Endpoint,
				RuntimeConfig:        betaAPIs,
				EncryptionConfigPath: enc,
			})
			res, err := everyresource.Create(ctx, old.ClientConfig, everyresource.Options{})
			if err != nil {
				t.Fatalf("kube-apiserver %s on kine over %s: create one object of every resource: %v", modbuild.PreviousKubernetes, tc.kind, err)
			}
			t.Logf("kube-apiserver %s on kine over %s wrote one object of each of %d resource versions", modbuild.PreviousKubernetes, tc.kind, len(res.Objects))
			since := time.Now().Truncate(time.Second).Add(time.Second)
			time.Sleep(time.Until(since))
			served := snapshot(t, old.ClientConfig, servedResources(t, old.ClientConfig))
			old.Stop()

			printed := func(string) bool { return false }
			if tc.password != nil {
				password := tc.password(t, dsn)
				printed = func(s string) bool { return strings.Contains(s, password) }
			}
			table := func() []string { return kineTable(t, tc.open(t, dsn)) }
			tool := []string{"--node-root", root, "--runtime-config", betaAPIs, "--target-version", currentMinor}
			// With k3s's kine still connected: read, never written; a write refused.
			before := table()
			writeK3sEncryption(t, enc, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
			if rep, code := verifyJSON(t, tool); code != verify.ExitStale || rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
				t.Errorf("verify of the %s datastore after the key rotation: exit %d, %+v; want %d (stale), every object read", tc.kind, code, rep.Summary, verify.ExitStale)
			}
			if out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...); code != 1 || !strings.Contains(stderr, "stop") || !strings.Contains(stderr, tc.otherSessions) || printed(out+stderr) {
				t.Errorf("migrate while k3s's kine is connected to the database: exit %d, want 1 and the other client named\n%s%s", code, out, stderr)
			}
			// k3s's kine itself may delete the stopped kube-apiserver's lease in
			// /registry/masterleases/ meanwhile (its TTL expiry): a row appended.
			if got := table(); len(got) < len(before) || !slices.Equal(got[:len(before)], before) {
				t.Errorf("verify, and migrate refused, changed kine's table: %d rows, %d before", len(got), len(before))
			} else {
				for _, r := range got[len(before):] {
					if f := strings.Split(r, "|"); !strings.HasPrefix(f[1], "/registry/masterleases/") || f[3] != "1" {
						t.Errorf("verify, or migrate refused, added a row to kine's table: %.80s", r)
					}
				}
			}
			k3s.Stop()

			before = table()
			_, stderr, code := runTool(t, append([]string{"inventory"}, tool[:2]...)...)
			if code != 0 || !strings.Contains(stderr, tc.kind+" through kine") || strings.Contains(stderr, dsn) || printed(stderr) {
				t.Errorf("inventory: exit %d, want 0 and the datastore named without its DSN\n%s", code, stderr)
			}
			out, stderr, code := runTool(t, "inspect", "--node-root", root, "-o", "json", "/registry/secrets/everyresource/secret1")
			if code != 0 || !strings.Contains(out, `"kind": "Secret"`) || !strings.Contains(out, `"key1"`) {
				t.Errorf("inspect of a Secret: exit %d, want 0, the object and the key that decrypted it\n%s\n%s", code, out, stderr)
			}
			if out, stderr, code := runTool(t, append([]string{"plan"}, tool...)...); code != 0 || !strings.Contains(out+stderr, tc.kind+" has no quota") || !strings.Contains(out+stderr, tc.dump) {
				t.Errorf("plan on %s: exit %d, want 0, its room and the dump to take named\n%s%s", tc.kind, code, out, stderr)
			}
			if got := table(); !slices.Equal(got, before) {
				t.Errorf("inventory, inspect and plan changed kine's table: %d rows, %d before", len(got), len(before))
			}
			rows := tc.latest(t, dsn)

			migrateKine := func() {
				t.Helper()
				out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...)
				if code != 0 || !strings.Contains(out+stderr, "its journal") || printed(out+stderr) {
					t.Fatalf("migrate on %s: exit %d, want 0 and its undo named\n%s%s", tc.kind, code, out, stderr)
				}
			}
			migrateKine()
			if out, stderr, code := runTool(t, "runs", "--verify"); code != 0 || !strings.Contains(out, "0001-migrate") {
				t.Errorf("runs --verify after migrate on %s: exit %d, want 0 and the run listed\n%s%s", tc.kind, code, out, stderr)
			}
			if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Stale != 0 {
				t.Errorf("verify after migrate on %s: exit %d, %+v; want %d, none stale", tc.kind, code, rep.Summary, verify.ExitCurrent)
			}
			if out, stderr, code := runTool(t, "rollback", "--node-root", root, "--run", "0001-migrate"); code != 0 {
				t.Fatalf("rollback --run 0001-migrate on %s: exit %d\n%s%s", tc.kind, code, out, stderr)
			}
			sameRows(t, tc.latest(t, dsn), rows)

			migrateKine()
			writeK3sEncryption(t, enc, aescbcProvider("key2", 2))
			if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Unreadable != 0 {
				t.Errorf("verify with key2 alone after migrate on %s: exit %d, %+v; want %d", tc.kind, code, rep.Summary, verify.ExitCurrent)
			}
			k3s = testkine.ServeK3s(t, dsn)
			linkedServesEvery(t, k3s.Endpoint, enc, tc.kind, res, served, since)
			k3s.Stop()
		})
	}
}
