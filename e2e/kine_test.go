package e2e

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/verify"
)

// k3sSQLiteNode lays out a k3s server node under root as k3s v1.37 does
// for its default datastore (k3s pkg/cluster and pkg/daemons/control: no
// etcd directory, no cluster-init: kine over DATA/server/db/state.db;
// secrets-encryption: the encryption configuration at
// DATA/server/cred/encryption-config.json), with providers as that
// configuration's, and returns the database file.
func k3sSQLiteNode(t *testing.T, root string, providers ...string) (db, enc string) {
	t.Helper()
	data := filepath.Join(root, "var/lib/rancher/k3s/server")
	for _, d := range []string{filepath.Join(root, "etc/rancher/k3s"), filepath.Join(data, "db"), filepath.Join(data, "cred")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/rancher/k3s/config.yaml"), []byte("secrets-encryption: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	enc = filepath.Join(data, "cred/encryption-config.json")
	writeK3sEncryption(t, enc, providers...)
	return filepath.Join(data, "db/state.db"), enc
}

func writeK3sEncryption(t *testing.T, path string, providers ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: ['*.*']\n  providers:\n")
	for _, p := range providers {
		b.WriteString(p)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestK3sSQLite: the previous release's real kube-apiserver on kine over
// SQLite (kine as a library, as k3s runs it) writes one object of every
// resource, encrypted with key1; it is stopped and the key rotated. The
// tool, finding the datastore as on a k3s node, reads it through kine:
// verify says it is stale (exit 3) and every object readable; inventory and
// plan read it too; the node's database file is not changed by a byte.
// migrate is refused with the reason, the file unchanged. A copy of the
// file (k3s's documented backup) is read the same way as --snapshot-file.
func TestK3sSQLite(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	db, enc := k3sSQLiteNode(t, root, aescbcProvider("key1", 1))
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	old := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, modbuild.PreviousKubernetes),
		EtcdURL:              srv.Endpoint,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: enc,
	})
	res, err := everyresource.Create(ctx, old.ClientConfig, everyresource.Options{})
	if err != nil {
		t.Fatalf("kube-apiserver %s on kine: create one object of every resource: %v", modbuild.PreviousKubernetes, err)
	}
	t.Logf("kube-apiserver %s on kine wrote one object of each of %d resource versions", modbuild.PreviousKubernetes, len(res.Objects))
	old.Stop()
	srv.Close()

	// A backup as k3s's documentation takes one: the file copied, k3s stopped.
	backup := filepath.Join(t.TempDir(), "state.db.bak")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backup, b, 0o600); err != nil {
		t.Fatal(err)
	}

	writeK3sEncryption(t, enc, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
	before := fileSum(t, db)
	tool := []string{"--node-root", root, "--runtime-config", betaAPIs, "--target-version", currentMinor}
	rep, code := verifyJSON(t, tool)
	if code != verify.ExitStale {
		t.Fatalf("verify of the SQLite datastore after the key rotation: exit %d, want %d (stale)", code, verify.ExitStale)
	}
	if rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
		t.Errorf("verify: %+v; want every object read, at least the %d written stale (key1)", rep.Summary, len(res.Objects))
	}
	_, stderr, code := runTool(t, append([]string{"inventory"}, tool[:2]...)...)
	if code != 0 || !strings.Contains(stderr, "SQLite through kine") {
		t.Errorf("inventory: exit %d, want 0 and the datastore named\n%s", code, stderr)
	}
	// One Secret, decrypted with key1 (the copy kine serves, read at its
	// revision), its data redacted.
	out, stderr, code := runTool(t, "inspect", "--node-root", root, "-o", "json", "/registry/secrets/everyresource/secret1")
	if code != 0 || !strings.Contains(out, `"kind": "Secret"`) || !strings.Contains(out, `"key1"`) {
		t.Errorf("inspect of a Secret: exit %d, want 0, the object and the key that decrypted it\n%s\n%s", code, out, stderr)
	}
	for _, cmd := range []string{"plan", "migrate"} {
		_, stderr, code := runTool(t, append([]string{cmd}, tool...)...)
		if code != 1 || !strings.Contains(stderr, db) || !strings.Contains(stderr, "not supported") {
			t.Errorf("%s on kine: exit %d, want 1 and a refusal naming %s\n%s", cmd, code, db, stderr)
		}
	}
	if after := fileSum(t, db); before != after {
		t.Error("the tool changed the node's SQLite database")
	}

	// The backup, as --snapshot-file: read through kine as the node's is.
	file := []string{"--snapshot-file", backup, "--encryption-provider-config", enc, "--runtime-config", betaAPIs, "--target-version", currentMinor}
	if rep, code := verifyJSON(t, file); code != verify.ExitStale || rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
		t.Errorf("verify --snapshot-file of the SQLite backup: exit %d, %+v; want %d, every object read, at least %d stale", code, rep.Summary, verify.ExitStale, len(res.Objects))
	}
	_, stderr, code = runTool(t, append([]string{"migrate", "--output-snapshot", filepath.Join(t.TempDir(), "out")}, file...)...)
	if code != 1 || !strings.Contains(stderr, "migrate of "+backup+", a SQLite database") {
		t.Errorf("migrate of the SQLite backup: exit %d, want 1 and a refusal naming it\n%s", code, stderr)
	}
	if runs, err := os.ReadDir(testcluster.StateDir(t)); err == nil && len(runs) > 0 {
		t.Errorf("a refused command left files in the state directory: %v", runs)
	}
}
