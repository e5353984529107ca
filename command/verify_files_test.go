package command

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testsnap"
	"kube-etcd-migrate/verify"
)

// retirementCluster is a cluster whose secrets go through a key1 -> key2
// rotation, with its three EncryptionConfigurations: key1 only (before),
// key2 then key1 (during), key2 only (once key1 is gone).
func retirementCluster(t *testing.T) (c *testcluster.Cluster, before, during, after string) {
	c = testcluster.New(t, testetcd.Options{})
	before = c.EncryptionConfig("key1.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	during = c.EncryptionConfig("key2-key1.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	after = c.EncryptionConfig("key2-only.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	return c, before, during, after
}

func putSecret(c *testcluster.Cluster, name, cfg string) int64 {
	return c.Put("/registry/secrets/ns1/"+name, testcluster.SecretsGR, testcluster.Secret("ns1", name, "pw-"+name), "", "", cfg)
}

func saveSnapshot(t *testing.T, c *testcluster.Cluster, path string) string {
	t.Helper()
	if err := etcdscan.Snapshot(context.Background(), c.Cli, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVerifySnapshotFilesKeyRetirement: a directory of three backups (etcd's
// own snapshots) taken during a key1 -> key2 rotation, one of them with a
// secret still under key1. verify over the directory with the configuration
// without key1 names that file and key1 (exit 4) and passes the other two;
// a file that is no snapshot is skipped, a damaged one is named (exit 1);
// the flag repeated or comma-separated reads the same files; once the
// backup is re-encrypted (migrate --snapshot-file --output-snapshot
// --encryption-only) the gate passes.
func TestVerifySnapshotFilesKeyRetirement(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	c, before, during, keyless := retirementCluster(t)
	dir := t.TempDir()
	putSecret(c, "s0", during)
	putSecret(c, "s1", during)
	a := saveSnapshot(t, c, filepath.Join(dir, "etcd-1.db"))
	putSecret(c, "s2", before) // written before the rotation reached it
	b := saveSnapshot(t, c, filepath.Join(dir, "etcd-2.db"))
	putSecret(c, "s2", during) // rotated
	third := saveSnapshot(t, c, filepath.Join(dir, "etcd-3.db"))
	testsnap.Write(t, dir, "SHA256SUMS", []byte("not a snapshot\n"))

	verifyJSON := func(args ...string) (int, filesReport, string) {
		t.Helper()
		code, out, stderr := runCLI(t, append([]string{"verify", "-o", "json"}, args...)...)
		var r filesReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("verify %v: exit %d, not JSON: %v\n%s%s", args, code, err, out, stderr)
		}
		return code, r, stderr
	}
	exits := func(r filesReport) map[string]int {
		m := map[string]int{}
		for _, f := range r.Files {
			m[filepath.Base(f.Path)] = f.Exit
		}
		return m
	}

	code, r, stderr := verifyJSON("--snapshot-file", dir, "--encryption-provider-config", keyless)
	want := map[string]int{"SHA256SUMS": -1, "etcd-1.db": 0, "etcd-2.db": 4, "etcd-3.db": 0}
	if code != exitUnreadable || r.ExitCode != exitUnreadable || fmt.Sprint(exits(r)) != fmt.Sprint(want) {
		t.Fatalf("verify DIR without key1: exit %d, files %v; want 4, %v\n%s", code, exits(r), want, stderr)
	}
	for _, f := range r.Files {
		switch filepath.Base(f.Path) {
		case "etcd-2.db":
			if fmt.Sprint(f.NeedsKeys) != "[aescbc:key1]" || f.Summary.Unreadable != 1 || len(f.UnreadableKeys) != 1 || f.UnreadableKeys[0].Key != "/registry/secrets/ns1/s2" {
				t.Errorf("%s: needs %v, %+v, unreadable %v; want aescbc:key1 for /registry/secrets/ns1/s2", f.Path, f.NeedsKeys, f.Summary, f.UnreadableKeys)
			}
			if !slicesHas(f.Encryption, verify.EncryptionCount{Encryption: "aescbc:key1", State: verify.EncryptionUnreadable, Objects: 1}) ||
				!slicesHas(f.Encryption, verify.EncryptionCount{Encryption: "aescbc:key2", State: verify.EncryptionFirst, Objects: 2}) {
				t.Errorf("%s: encryption %+v", f.Path, f.Encryption)
			}
		case "etcd-3.db":
			if !slicesHas(f.Encryption, verify.EncryptionCount{Encryption: "aescbc:key2", State: verify.EncryptionFirst, Objects: 3}) || len(f.NeedsKeys) != 0 {
				t.Errorf("%s: encryption %+v, needs %v", f.Path, f.Encryption, f.NeedsKeys)
			}
		}
	}
	if !strings.Contains(r.Verdict, "1 file(s) need a key this configuration does not have: "+b+" (aescbc:key1)") {
		t.Errorf("verdict %q does not name %s and key1", r.Verdict, b)
	}

	// The table: the file's line says which key, the verdict names it.
	code, out, _ := runCLI(t, "verify", "--snapshot-file", dir, "--encryption-provider-config", keyless)
	if code != exitUnreadable || !regexpLine(out, b, "aescbc:key1=1 (unreadable), aescbc:key2=2 (first)") || !strings.Contains(out, "VERDICT: 1 file(s) need a key this configuration does not have: "+b+" (aescbc:key1)") {
		t.Errorf("table: exit %d\n%s", code, out)
	}

	// With key1 still configured second: everything readable, etcd-2.db stale.
	code, r, _ = verifyJSON("--snapshot-file", dir, "--encryption-provider-config", during, "--encryption-only")
	if code != exitStale || fmt.Sprint(exits(r)) != fmt.Sprint(map[string]int{"SHA256SUMS": -1, "etcd-1.db": 0, "etcd-2.db": 3, "etcd-3.db": 0}) {
		t.Errorf("verify DIR with key1 second: exit %d, %v; want 3", code, exits(r))
	}

	// A list: comma-separated and repeated.
	if code, r, _ := verifyJSON("--snapshot-file", a+","+third, "--encryption-provider-config", keyless); code != exitOK || len(r.Files) != 2 {
		t.Errorf("verify A,C: exit %d, %d file(s); want 0, 2", code, len(r.Files))
	}
	if code, r, _ := verifyJSON("--snapshot-file", a, "--snapshot-file", b, "--encryption-provider-config", keyless); code != exitUnreadable || len(r.Files) != 2 {
		t.Errorf("verify A B: exit %d, %d file(s); want 4, 2", code, len(r.Files))
	}

	// Re-encrypt the backup that needs key1, put it in its place.
	out2 := filepath.Join(t.TempDir(), "etcd-2.key2.db")
	code, stdout, stderr := runCLI(t, "migrate", "--snapshot-file", b, "--output-snapshot", out2, "--encryption-provider-config", during,
		"--encryption-only", "--journal", filepath.Join(t.TempDir(), "journal"), "--target-version", "1.37")
	if code != exitOK {
		t.Fatalf("migrate --snapshot-file --encryption-only: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := os.Rename(out2, b); err != nil {
		t.Fatal(err)
	}
	// A damaged backup is named, exit 1: nothing is known of what it needs.
	good, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	damaged := testsnap.Write(t, dir, "etcd-4.db", good[:len(good)/2])
	code, r, stderr = verifyJSON("--snapshot-file", dir, "--encryption-provider-config", keyless)
	if code != exitError || !strings.Contains(r.Verdict, "could not be read") || !strings.Contains(r.Verdict, damaged) || !strings.Contains(stderr, "snapshot file "+damaged) {
		t.Errorf("with a damaged file: exit %d, verdict %q; want 1 naming %s\n%s", code, r.Verdict, damaged, stderr)
	}
	if err := os.Remove(damaged); err != nil {
		t.Fatal(err)
	}
	code, r, stderr = verifyJSON("--snapshot-file", dir, "--encryption-provider-config", keyless)
	if code != exitOK || fmt.Sprint(exits(r)) != fmt.Sprint(map[string]int{"SHA256SUMS": -1, "etcd-1.db": 0, "etcd-2.db": 0, "etcd-3.db": 0}) {
		t.Errorf("after the re-encryption: exit %d, %v; want 0\n%s", code, exits(r), stderr)
	}

	// Usage: a directory without a snapshot, --revision with several files.
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", t.TempDir(), "--encryption-provider-config", keyless); code != exitError || !strings.Contains(stderr, "no etcd snapshot (or SQLite database) in this directory") {
		t.Errorf("empty directory: exit %d %q", code, stderr)
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", dir, "--revision", "3"); code != exitUsage {
		t.Errorf("--revision with a directory: exit %d, want 2", code)
	}
}

// TestCompactDefragDropsOldCiphertext is the runbook's last step before a
// key leaves the configuration: after the rotation, etcd's history still
// holds the old ciphertext (a snapshot read at the older revision needs
// key1); compaction at the current revision and defragmentation leave no
// revision and no byte of the database under key1.
func TestCompactDefragDropsOldCiphertext(t *testing.T) {
	c, before, during, keyless := retirementCluster(t)
	ctx := context.Background()
	old := putSecret(c, "s0", before)
	putSecret(c, "s0", during) // the rotation's rewrite
	dir := t.TempDir()
	key1 := []byte("k8s:enc:aescbc:v1:key1:")

	pre := saveSnapshot(t, c, filepath.Join(dir, "before-compaction.db"))
	if b, _ := os.ReadFile(pre); !bytes.Contains(b, key1) {
		t.Fatal("the snapshot before compaction holds no value under key1: the test proves nothing")
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", pre, "--encryption-provider-config", keyless); code != exitOK {
		t.Fatalf("latest revision: exit %d, want 0", code)
	}
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", pre, "--encryption-provider-config", keyless, "--revision", fmt.Sprint(old)); code != exitUnreadable {
		t.Fatalf("revision %d (before the rewrite): exit %d, want 4: history needs key1\n%s", old, code, stderr)
	}

	// etcdctl compact REV; etcdctl defrag.
	if _, err := c.Cli.Compact(ctx, c.Revision(), clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cli.Defragment(ctx, c.Srv.Endpoint); err != nil {
		t.Fatal(err)
	}
	post := saveSnapshot(t, c, filepath.Join(dir, "after-defrag.db"))
	if b, _ := os.ReadFile(post); bytes.Contains(b, key1) {
		t.Error("after compaction and defragmentation the database still holds bytes under key1")
	}
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", post, "--encryption-provider-config", keyless, "--revision", fmt.Sprint(old)); code != exitError || !strings.Contains(stderr, "compacted") {
		t.Errorf("revision %d after compaction: exit %d, want 1 (compacted)\n%s", old, code, stderr)
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", post, "--encryption-provider-config", keyless); code != exitOK {
		t.Errorf("after compaction: exit %d, want 0", code)
	}
}

func slicesHas(s []verify.EncryptionCount, v verify.EncryptionCount) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// regexpLine: some line of out starts with prefix and contains part.
func regexpLine(out, prefix, part string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, part) {
			return true
		}
	}
	return false
}

// TestVerifySnapshotFilesKMS is (c) step 7's gate: a KMS v2 key rotation,
// two backups, the first from before it. With the old key version still in
// the plugin, each file's values go through the configured plugin: the old
// backup's are "later" (exit 3), the new one's "first"; once the plugin no
// longer has the old version, the gate names the old backup (exit 4).
func TestVerifySnapshotFilesKMS(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	kms := fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 1s}\n", plugin.Endpoint())
	cfg := c.EncryptionConfig("enc.yaml", kms, testcluster.Identity)
	dir := t.TempDir()
	putSecret(c, "s0", cfg)
	old := saveSnapshot(t, c, filepath.Join(dir, "etcd-1.db"))
	if err := plugin.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	rotated := c.EncryptionConfig("enc-rotated.yaml", kms, testcluster.Identity) // loaded afresh: sees kek-2
	putSecret(c, "s0", rotated)
	putSecret(c, "s1", rotated)
	saveSnapshot(t, c, filepath.Join(dir, "etcd-2.db"))

	code, out, stderr := runCLI(t, "verify", "--snapshot-file", dir, "--encryption-provider-config", cfg, "--encryption-only")
	if code != exitStale || !regexpLine(out, old, "kms2:vault=1 (later)") || !regexpLine(out, filepath.Join(dir, "etcd-2.db"), "kms2:vault=2 (first)") {
		t.Errorf("old key version still in the plugin: exit %d, want 3, etcd-1.db later, etcd-2.db first\n%s%s", code, out, stderr)
	}
	plugin.ForgetKeyID("kek-1")
	code, out, stderr = runCLI(t, "verify", "--snapshot-file", dir, "--encryption-provider-config", cfg, "--encryption-only")
	if code != exitUnreadable || !strings.Contains(out, "VERDICT: 1 file(s) need a key this configuration does not have: "+old+" (kms2:vault)") || !regexpLine(out, filepath.Join(dir, "etcd-2.db"), "kms2:vault=2 (first)") {
		t.Errorf("old key version gone: exit %d, want 4 naming %s\n%s%s", code, old, out, stderr)
	}
}
