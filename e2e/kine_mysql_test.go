package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/verify"
)

// myTable is kine's table in the MySQL database of endpoint as it is, row
// by row (every column, in id order).
func myTable(t *testing.T, endpoint string) []string {
	t.Helper()
	db := testmysql.Open(t, endpoint)
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
				if i == 1 { // the name: text
					row[i] = string(b)
				} else if i >= 7 {
					row[i] = hex.EncodeToString(b)
				} else {
					row[i] = string(b) // a number, as MySQL's text protocol sends it
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

// TestK3sMySQL: as TestK3sPostgres, on k3s's MySQL datastore — a real
// MariaDB server (Debian's mariadb-server), kine on it as k3s runs it. The
// previous release's kube-apiserver writes one object of every resource
// under key1. While that "k3s" still runs, verify reads the database (exit
// 3) without a write of its own, and migrate is refused, naming the other
// client, the table unchanged row for row. With it stopped and the key
// rotated: plan proceeds and says to take a dump (mysqldump); migrate
// rewrites (exit 0; runs --verify and verify exit 0); rollback --run puts
// back every key's latest row (value and lease); migrated again, the
// linked release's kube-apiserver on kine with key2 alone serves every
// object as the previous release served it, and a no-op update of each
// keeps its resourceVersion.
func TestK3sMySQL(t *testing.T) {
	ctx := context.Background()
	ep := testmysql.Start(t)
	root := t.TempDir()
	enc := k3sServerNode(t, root, ep, aescbcProvider("key1", 1))
	k3s := testkine.ServeK3s(t, ep)
	old := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, modbuild.PreviousKubernetes),
		EtcdURL:              k3s.Endpoint,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: enc,
	})
	res, err := everyresource.Create(ctx, old.ClientConfig, everyresource.Options{})
	if err != nil {
		t.Fatalf("kube-apiserver %s on kine over MySQL: create one object of every resource: %v", modbuild.PreviousKubernetes, err)
	}
	t.Logf("kube-apiserver %s on kine over MySQL wrote one object of each of %d resource versions", modbuild.PreviousKubernetes, len(res.Objects))
	since := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(since))
	served := snapshot(t, old.ClientConfig, servedResources(t, old.ClientConfig))
	old.Stop()

	password := testmysql.Password(t, ep)
	tool := []string{"--node-root", root, "--runtime-config", betaAPIs, "--target-version", currentMinor}
	// With k3s's kine still connected: read, never written; a write refused.
	table := myTable(t, ep)
	writeK3sEncryption(t, enc, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
	if rep, code := verifyJSON(t, tool); code != verify.ExitStale || rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
		t.Errorf("verify of the MySQL datastore after the key rotation: exit %d, %+v; want %d (stale), every object read", code, rep.Summary, verify.ExitStale)
	}
	if out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...); code != 1 || !strings.Contains(stderr, "stop") || !strings.Contains(stderr, "has other sessions: session ") || strings.Contains(out+stderr, password) {
		t.Errorf("migrate while k3s's kine is connected to the database: exit %d, want 1 and the other client named\n%s%s", code, out, stderr)
	}
	// k3s's kine itself may delete the stopped kube-apiserver's lease in
	// /registry/masterleases/ meanwhile (its TTL expiry): a row appended.
	if got := myTable(t, ep); len(got) < len(table) || !slices.Equal(got[:len(table)], table) {
		t.Errorf("verify, and migrate refused, changed kine's table: %d rows, %d before", len(got), len(table))
	} else {
		for _, r := range got[len(table):] {
			if f := strings.Split(r, "|"); !strings.HasPrefix(f[1], "/registry/masterleases/") || f[3] != "1" {
				t.Errorf("verify, or migrate refused, added a row to kine's table: %.80s", r)
			}
		}
	}
	k3s.Stop()

	table = myTable(t, ep)
	_, stderr, code := runTool(t, append([]string{"inventory"}, tool[:2]...)...)
	if code != 0 || !strings.Contains(stderr, "MySQL through kine") || strings.Contains(stderr, ep) || strings.Contains(stderr, password) {
		t.Errorf("inventory: exit %d, want 0 and the datastore named without its DSN\n%s", code, stderr)
	}
	out, stderr, code := runTool(t, "inspect", "--node-root", root, "-o", "json", "/registry/secrets/everyresource/secret1")
	if code != 0 || !strings.Contains(out, `"kind": "Secret"`) || !strings.Contains(out, `"key1"`) {
		t.Errorf("inspect of a Secret: exit %d, want 0, the object and the key that decrypted it\n%s\n%s", code, out, stderr)
	}
	if out, stderr, code := runTool(t, append([]string{"plan"}, tool...)...); code != 0 || !strings.Contains(out+stderr, "MySQL has no quota") || !strings.Contains(out+stderr, "mysqldump") {
		t.Errorf("plan on MySQL: exit %d, want 0, its room and the dump to take named\n%s%s", code, out, stderr)
	}
	if got := myTable(t, ep); !slices.Equal(got, table) {
		t.Errorf("inventory, inspect and plan changed kine's table: %d rows, %d before", len(got), len(table))
	}
	rows := testkine.MySQLLatest(t, ep)

	migrateKine := func() {
		t.Helper()
		out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...)
		if code != 0 || !strings.Contains(out+stderr, "its journal") || strings.Contains(out+stderr, password) {
			t.Fatalf("migrate on MySQL: exit %d, want 0 and its undo named\n%s%s", code, out, stderr)
		}
	}
	migrateKine()
	if out, stderr, code := runTool(t, "runs", "--verify"); code != 0 || !strings.Contains(out, "0001-migrate") {
		t.Errorf("runs --verify after migrate on MySQL: exit %d, want 0 and the run listed\n%s%s", code, out, stderr)
	}
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Stale != 0 {
		t.Errorf("verify after migrate on MySQL: exit %d, %+v; want %d, none stale", code, rep.Summary, verify.ExitCurrent)
	}
	if out, stderr, code := runTool(t, "rollback", "--node-root", root, "--run", "0001-migrate"); code != 0 {
		t.Fatalf("rollback --run 0001-migrate on MySQL: exit %d\n%s%s", code, out, stderr)
	}
	sameRows(t, testkine.MySQLLatest(t, ep), rows)

	migrateKine()
	writeK3sEncryption(t, enc, aescbcProvider("key2", 2))
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Unreadable != 0 {
		t.Errorf("verify with key2 alone after migrate on MySQL: exit %d, %+v; want %d", code, rep.Summary, verify.ExitCurrent)
	}
	k3s = testkine.ServeK3s(t, ep)
	linkedServesEvery(t, k3s.Endpoint, enc, "MySQL", res, served, since)
	k3s.Stop()
}
