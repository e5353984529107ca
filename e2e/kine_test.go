package e2e

import (
	"context"
	"crypto/sha256"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/internal/testrig/testkine"
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

// sqliteNode is a k3s node on SQLite that an older kube-apiserver wrote
// (writtenSQLiteNode): its root, its database and encryption configuration,
// what was written, every object as that release served it, and the time
// from which a kube-apiserver's own writes show in managedFields
// (sameContentEvery leaves them out).
type sqliteNode struct {
	root, db, enc string
	res           *everyresource.Result
	served        map[objKey]*unstructured.Unstructured
	since         time.Time
}

// writtenSQLiteNode lays out a k3s node on SQLite under a new root
// (k3sSQLiteNode, encrypted with key1), and has the real kube-apiserver of
// release (its binary) on kine over it write one object of every resource;
// that kube-apiserver and kine are stopped when it returns.
func writtenSQLiteNode(t *testing.T, release string) sqliteNode {
	t.Helper()
	ctx := context.Background()
	n := sqliteNode{root: t.TempDir()}
	n.db, n.enc = k3sSQLiteNode(t, n.root, aescbcProvider("key1", 1))
	if err := os.WriteFile(n.db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := kinedb.Serve(ctx, kinedb.Config{Database: n.db, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	old := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, release),
		EtcdURL:              srv.Endpoint,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: n.enc,
	})
	if n.res, err = everyresource.Create(ctx, old.ClientConfig, everyresource.Options{}); err != nil {
		t.Fatalf("kube-apiserver %s on kine: create one object of every resource: %v", release, err)
	}
	t.Logf("kube-apiserver %s on kine wrote one object of each of %d resource versions", release, len(n.res.Objects))
	// Every object as that release serves it, to compare with what a later
	// one serves after the migration (writes from here on, by a
	// kube-apiserver itself, show in managedFields at since or later).
	n.since = time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(n.since))
	n.served = snapshot(t, old.ClientConfig, servedResources(t, old.ClientConfig))
	old.Stop()
	srv.Close()
	return n
}

// TestK3sSQLite: the previous release's real kube-apiserver on kine over
// SQLite (kine as a library, as k3s runs it) writes one object of every
// resource, encrypted with key1; it is stopped and the key rotated. The
// tool, finding the datastore as on a k3s node, reads it through kine:
// verify says it is stale (exit 3) and every object readable; inventory,
// inspect and plan (its writes timed on its own copy) read it without
// changing the node's file by a byte; plan proceeds. migrate writes it
// through kine (exit 0; verify then exit 0);
// rollback --run puts back every key of the kine table as it was (value and
// lease); migrated again, the linked release's kube-apiserver on kine with
// key2 alone serves every object as the previous release served it, and a
// no-op update of each keeps its resourceVersion. A copy of the file (k3s's
// documented backup) is read as --snapshot-file and never written.
func TestK3sSQLite(t *testing.T) {
	ctx := context.Background()
	node := writtenSQLiteNode(t, modbuild.PreviousKubernetes)
	root, db, enc, res, served, since := node.root, node.db, node.enc, node.res, node.served, node.since

	// A backup as k3s's documentation takes one: the database's files
	// copied, k3s stopped (its last transactions may still be in
	// state.db-wal, which SQLite reads beside the file of the same name).
	backup := filepath.Join(t.TempDir(), "state.db.bak")
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(db + suffix)
		if os.IsNotExist(err) && suffix != "" {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(backup+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
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
	if after := fileSum(t, db); before != after {
		t.Error("the read-only commands changed the node's SQLite database")
	}
	rows := testkine.Latest(t, db)

	// plan proceeds, judging the datastore's room on its own filesystem,
	// and times migrate's writes on its own copy of the datastore: the
	// node's file unchanged.
	if out, stderr, code := runTool(t, append([]string{"plan"}, tool...)...); code != 0 || !strings.Contains(out+stderr, "SQLite has no quota: the run keeps the database") || !strings.Contains(out+stderr, "the datastore "+db+" (") || !strings.Contains(out, "written to plan's private copy of the datastore") {
		t.Errorf("plan on kine: exit %d, want 0, the datastore's room named and the writes timed on its copy\n%s%s", code, out, stderr)
	}
	if after := fileSum(t, db); before != after {
		t.Error("plan changed the node's SQLite database")
	}
	// migrate writes the node's file through kine: the undo's snapshot a
	// copy of it, verified by 'runs --verify'.
	migrateKine := func() {
		t.Helper()
		out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...)
		if code != 0 || !strings.Contains(out+stderr, "no other process holds the SQLite datastore "+db+" open") {
			t.Fatalf("migrate on kine: exit %d, want 0 and the datastore's holders checked\n%s%s", code, out, stderr)
		}
	}
	migrateKine()
	if out, stderr, code := runTool(t, "runs", "--verify"); code != 0 || !strings.Contains(out, "0001-migrate") {
		t.Errorf("runs --verify after migrate on kine: exit %d, want 0 and the run listed\n%s%s", code, out, stderr)
	}
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Stale != 0 {
		t.Errorf("verify after migrate on kine: exit %d, %+v; want %d, none stale", code, rep.Summary, verify.ExitCurrent)
	}
	// The run undone: every key of the kine table as it was, value and
	// lease (kine appends a row per write: its latest row per key compared).
	if out, stderr, code := runTool(t, "rollback", "--node-root", root, "--run", "0001-migrate"); code != 0 {
		t.Fatalf("rollback --run 0001-migrate on kine: exit %d\n%s%s", code, out, stderr)
	}
	sameRows(t, testkine.Latest(t, db), rows)

	// Migrated again, then the linked release's kube-apiserver on kine with
	// key2 alone reads every object, and a no-op update of each keeps its
	// resourceVersion.
	migrateKine()
	writeK3sEncryption(t, enc, aescbcProvider("key2", 2))
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Unreadable != 0 {
		t.Errorf("verify with key2 alone after migrate on kine: exit %d, %+v; want %d", code, rep.Summary, verify.ExitCurrent)
	}
	srv2, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	linkedServesEvery(t, srv2.Endpoint, enc, "SQLite", res, served, since)
	srv2.Close()
	// The backup below is under key1: the configuration of the rotation again.
	writeK3sEncryption(t, enc, aescbcProvider("key2", 2), aescbcProvider("key1", 1))

	// The backup, as --snapshot-file: read through kine as the node's is.
	file := []string{"--snapshot-file", backup, "--encryption-provider-config", enc, "--runtime-config", betaAPIs, "--target-version", currentMinor}
	if rep, code := verifyJSON(t, file); code != verify.ExitStale || rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
		t.Errorf("verify --snapshot-file of the SQLite backup: exit %d, %+v; want %d, every object read, at least %d stale", code, rep.Summary, verify.ExitStale, len(res.Objects))
	}
	_, stderr, code = runTool(t, append([]string{"migrate", "--output-snapshot", filepath.Join(t.TempDir(), "out")}, file...)...)
	if code != 1 || !strings.Contains(stderr, "migrate of "+backup+", a SQLite database") {
		t.Errorf("migrate of the SQLite backup: exit %d, want 1 and a refusal naming it\n%s", code, stderr)
	}
}

// sameRows fails the test for every key whose latest kine row (value and
// lease) after the rollback differs from before the migration, and every
// key there now that was not then.
func sameRows(t *testing.T, got, want map[string]string) {
	t.Helper()
	if maps.Equal(got, want) {
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("after the rollback, %s: %.60q, want %.60q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("after the rollback, %s is there, which was not before the migration", k)
		}
	}
}

// linkedServesEvery starts the linked release's kube-apiserver on the kine
// endpoint with the encryption configuration enc, and checks that it serves
// every object res wrote as the previous release served it (served, at
// since) and that a no-op update of each keeps its resourceVersion
// (servesEvery); on names the datastore in the messages.
func linkedServesEvery(t *testing.T, endpoint, enc, on string, res *everyresource.Result, served map[objKey]*unstructured.Unstructured, since time.Time) {
	t.Helper()
	linked := apiservertest.Start(t, apiservertest.Options{EtcdURL: endpoint, RuntimeConfig: betaAPIs, EncryptionConfigPath: enc})
	defer linked.Stop()
	servesEvery(t, linked.ClientConfig, currentMinor, on, res, served, since)
}

// servesEvery checks that the kube-apiserver behind cfg, already started on
// kine (release, e.g. "1.36", names it; on names the datastore), serves every
// object res wrote as an older release served it (served, at since: nothing
// lost or changed) and that a no-op update of each keeps its
// resourceVersion. It returns how many objects the no-op update checked per
// resource.
func servesEvery(t *testing.T, cfg *rest.Config, release, on string, res *everyresource.Result, served map[objKey]*unstructured.Unstructured, since time.Time) map[schema.GroupResource]int {
	t.Helper()
	owned := apiserverOwned{}
	for _, o := range res.Objects {
		if o.GVR.GroupResource() == storageVersion {
			owned[o.Name] = true
		}
	}
	sameContentEvery(t, cfg, served, owned, true, since)
	checked := noOpUpdateEvery(t, cfg, owned)
	n := 0
	for _, c := range checked {
		n += c
	}
	if n < len(res.Objects)/2 {
		t.Errorf("a no-op update of %d objects through kube-apiserver %s on kine over %s, of the %d written: too few checked", n, release, on, len(res.Objects))
	}
	t.Logf("kube-apiserver %s on kine over %s, key2 alone: %d objects of %d resources unchanged by a no-op update", release, on, n, len(checked))
	return checked
}
