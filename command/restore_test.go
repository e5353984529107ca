package command

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testsnap"
	"kube-etcd-migrate/restore"
)

// TestRestoreCLI: restore's refusals leave etcd byte for byte as it was: no
// selector (exit 2), a truncated backup (one line, exit 1), a backup key the
// configuration lacks (named, exit 1); --dry-run lists the plan and writes
// nothing; the run creates the Secrets, prints no value, and rollback --run
// removes them.
func TestRestoreCLI(t *testing.T) {
	ctx := context.Background()
	c, oldCfg, backup := appBackup(t)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	good, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cli.Delete(ctx, "/registry/secrets/app/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	before := c.Raw()
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37", "--liveness-window", "1s"}
	sel := []string{"--namespace", "app", "--resource", "secrets"}

	if code, _, stderr := runCLI(t, append([]string{"restore", "--snapshot-file", backup}, conn...)...); code != exitUsage || !strings.Contains(stderr, "select what to restore") {
		t.Errorf("no selector: exit %d, %s", code, stderr)
	}
	truncated := testsnap.Damage(t, t.TempDir(), good).Truncated
	code, _, stderr := runCLI(t, append(append([]string{"restore", "--snapshot-file", truncated}, sel...), conn...)...)
	if code != exitError || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, truncated) || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("truncated backup: exit %d, want 1 on one line naming it:\n%s", code, stderr)
	}
	c.RequireBack(before)
	code, _, stderr = runCLI(t, append(append([]string{"restore", "--snapshot-file", backup}, sel...), conn...)...)
	if code != exitError || !strings.Contains(stderr, "aescbc:key1 (e.g. /registry/secrets/app/a)") || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("the backup's key missing: exit %d, want 1 naming aescbc:key1:\n%s", code, stderr)
	}
	c.RequireBack(before)

	args := append(append([]string{"restore", "--snapshot-file", backup, "--backup-encryption-provider-config", oldCfg}, sel...), conn...)
	code, out, stderr := runCLI(t, append(args, "--dry-run", "-o", "json")...)
	var plan restore.Result
	if code != exitOK || json.Unmarshal([]byte(out), &plan) != nil || plan.Create != 2 || !plan.DryRun {
		t.Fatalf("--dry-run: exit %d, plan %+v\n%s%s", code, plan, out, stderr)
	}
	c.RequireBack(before)

	code, out, stderr = runCLI(t, args...)
	if code != exitOK || !strings.Contains(out, "create 2, overwrite 0, same 0, exists 0") || !strings.Contains(out, "written 2") {
		t.Fatalf("restore: exit %d\n%s%s", code, out, stderr)
	}
	// The keys the backup needs are said on stderr before the first write
	// (the run's "wrote" lines come after).
	if i := strings.Index(stderr, "preflight: the backup's values read with"); i < 0 || !strings.Contains(stderr[i:], "aescbc:key1") {
		t.Errorf("the backup's keys not said before the first write:\n%s", stderr)
	}
	if strings.Contains(out+stderr, appSecret) {
		t.Errorf("a decrypted value was printed")
	}
	if v, _, _ := c.Get("/registry/secrets/app/a"); !strings.HasPrefix(string(v), "k8s:enc:aescbc:v1:key2:") {
		t.Errorf("restored secret not under today's key2")
	}
	if code, out, stderr := runCLI(t, "runs", "--verify"); code != exitOK || !strings.Contains(out, "0001-restore") {
		t.Errorf("runs --verify: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, append(args, "--dry-run")...)
	if code != exitOK || !strings.Contains(out, "same 2") {
		t.Errorf("again: exit %d, want both same\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--run", "0001-restore", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--liveness-window", "1s")
	if code != exitOK {
		t.Fatalf("rollback: exit %d\n%s%s", code, out, stderr)
	}
	c.RequireBack(before)
}

// TestRestoreIntoSQLite: restore finds the live cluster on the node as
// every command does (its --snapshot-file is the backup, not the cluster):
// on a k3s node on SQLite it writes the node's datastore through kine,
// under today's key, and rollback --run removes what it created; the kine
// table's other rows are left as they were.
func TestRestoreIntoSQLite(t *testing.T) {
	c, oldCfg, backup := appBackup(t)
	ns, _, _ := c.Get("/registry/namespaces/app")

	// The k3s node: its datastore holds the Namespace, not the Secrets;
	// its configuration encrypts Secrets with key2.
	root, db := k3sSQLiteNode(t, key2Secrets, func(kc *clientv3.Client) {
		testkine.Create(t, kc, "/registry/namespaces/app", string(ns), 0)
	})
	before := testkine.Latest(t, db)

	state := filepath.Join(t.TempDir(), "state")
	code, out, stderr := runCLI(t, "restore", "--node-root", root, "--state-dir", state, "--target-version", "1.37",
		"--snapshot-file", backup, "--backup-encryption-provider-config", oldCfg, "--namespace", "app", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out, "create 2, overwrite 0, same 0, exists 0") || !strings.Contains(stderr, "writing k3s's SQLite datastore "+db) {
		t.Fatalf("restore into the SQLite datastore: exit %d\n%s%s", code, out, stderr)
	}
	if strings.Contains(out+stderr, appSecret) {
		t.Errorf("a decrypted value was printed")
	}
	after := testkine.Latest(t, db)
	for _, name := range []string{"a", "b"} {
		if v := after["/registry/secrets/app/"+name]; !strings.Contains(v, "value 6B38733A656E633A6165736362633A76313A6B6579323A") { // k8s:enc:aescbc:v1:key2:
			t.Errorf("restored secret %s: %.80s, want it under today's key2", name, v)
		}
	}
	code, out, stderr = runCLI(t, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-restore")
	if code != exitOK {
		t.Fatalf("rollback --run 0001-restore on SQLite: exit %d\n%s%s", code, out, stderr)
	}
	if got := testkine.Latest(t, db); !maps.Equal(got, before) {
		t.Errorf("after the rollback the datastore holds %d keys, want the %d it held before: %v", len(got), len(before), slices.Collect(maps.Keys(got)))
	}
}

// appSecret is the value of the Secrets of appBackup.
const appSecret = "correct-horse-battery"

// appBackup is an etcd with the Namespace app and its Secrets a and b
// (appSecret) under aescbc key1 (oldCfg), and its backup (etcd's snapshot).
func appBackup(t *testing.T) (c *testcluster.Cluster, oldCfg, backup string) {
	t.Helper()
	c = testcluster.New(t, testetcd.Options{})
	oldCfg = c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.Put("/registry/namespaces/app", schema.GroupResource{Resource: "namespaces"}, &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app"}}, "", "", "")
	for _, name := range []string{"a", "b"} {
		c.Put("/registry/secrets/app/"+name, testcluster.SecretsGR, testcluster.Secret("app", name, appSecret), "", "", oldCfg)
	}
	backup = filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(context.Background(), c.Cli, backup); err != nil {
		t.Fatal(err)
	}
	return c, oldCfg, backup
}
