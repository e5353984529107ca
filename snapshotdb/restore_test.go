package snapshotdb_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testsnap"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/target"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// restoreFixture is a seeded etcd (secrets under aescbc and identity, events with
// leases, CRDs, stale versions and media types) with configmaps under every
// other provider (aesgcm, secretbox, KMS v2 through a real plugin), one under a
// key no configuration has, a delete, a delete-and-recreate and an extra
// lease, and a snapshot of it saved by etcd's own snapshot API.
type restoreFixture struct {
	c         *testcluster.Cluster
	dataDir   string
	encCfg    string // reads everything the restoreFixture wrote except the lost key
	snap      string
	rev       int64 // the snapshot's revision
	beforeDel int64 // a revision before the delete and the recreate
	deleted   string
	recreated string
	createRev int64 // the recreated key's first create revision
	leased    string
}

func base64Key(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

func aesgcm(name string, b byte) string {
	return fmt.Sprintf("  - aesgcm:\n      keys:\n      - name: %s\n        secret: %s\n", name, base64Key(b))
}

func secretbox(name string, b byte) string {
	return fmt.Sprintf("  - secretbox:\n      keys:\n      - name: %s\n        secret: %s\n", name, base64Key(b))
}

func kmsV2(name, endpoint string) string {
	return fmt.Sprintf("  - kms:\n      apiVersion: v2\n      name: %s\n      endpoint: %s\n      timeout: 10s\n", name, endpoint)
}

// indent shifts a provider snippet (written for testcluster's configs) under
// the seed's configuration layout.
func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "    " + l
		}
	}
	return strings.Join(lines, "")
}

// newRestoreFixture seeds an etcd of release version (testetcd.Options.Version) and
// saves a snapshot of it.
func newRestoreFixture(t *testing.T, version string) *restoreFixture {
	t.Helper()
	ctx := context.Background()
	dataDir := t.TempDir()
	c := testcluster.New(t, testetcd.Options{Dir: dataDir, Version: version})
	res, err := seed.Cluster(ctx, c.Cli, seed.Options{Dir: c.Dir})
	if err != nil {
		t.Fatal(err)
	}
	f := &restoreFixture{c: c, dataDir: dataDir}
	kms := kmstest.StartV2T(t, "kek-1")
	providers := map[string]string{
		"aesgcm":    aesgcm("g1", 7),
		"secretbox": secretbox("b1", 8),
		"kms":       kmsV2("kms1", kms.Endpoint()),
	}
	for _, name := range []string{"aesgcm", "secretbox", "kms"} {
		cfg := c.EncryptionConfig("write-"+name+".yaml", providers[name], testcluster.Identity)
		key := "/registry/configmaps/dr/cm-" + name
		c.Put(key, testcluster.ConfigMapsGR, testcluster.ConfigMap("dr", "cm-"+name), "", "", cfg)
	}
	lost := c.EncryptionConfig("write-lost.yaml", testcluster.AESCBC("lost", 9))
	c.Put("/registry/configmaps/dr/cm-lost-key", testcluster.ConfigMapsGR, testcluster.ConfigMap("dr", "cm-lost-key"), "", "", lost)

	// What reads all of it: the seed's rotated configuration for secrets, and
	// every provider above (not the lost key) for configmaps.
	newCfg, err := os.ReadFile(res.NewConfig)
	if err != nil {
		t.Fatal(err)
	}
	f.encCfg = filepath.Join(c.Dir, "read-all.yaml")
	all := string(newCfg) + "  - resources:\n      - configmaps\n    providers:\n" +
		indent(providers["aesgcm"]) + indent(providers["secretbox"]) + indent(providers["kms"]) + indent(testcluster.Identity)
	if err := os.WriteFile(f.encCfg, []byte(all), 0o600); err != nil {
		t.Fatal(err)
	}

	// A lease of its own (the seed's events share one of kube-apiserver's 1h+60s).
	lease, err := c.Cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	f.leased = "/registry/configmaps/dr/cm-leased"
	c.Put(f.leased, testcluster.ConfigMapsGR, testcluster.ConfigMap("dr", "cm-leased"), "", "", "", clientv3.WithLease(lease.ID))

	// History: a delete, and a delete followed by a new life of the same key.
	f.beforeDel = c.Revision()
	f.deleted = "/registry/configmaps/team-00/kube-root-ca.crt"
	f.recreated = res.SecretKey
	c.Get(f.deleted) // fails the test if the seed did not write it
	resp, err := c.Cli.Get(ctx, f.recreated)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", f.recreated, err)
	}
	f.createRev = resp.Kvs[0].CreateRevision
	for _, k := range []string{f.deleted, f.recreated} {
		if _, err := c.Cli.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	c.Put(f.recreated, testcluster.SecretsGR, testcluster.Secret("team-00", filepath.Base(f.recreated), "second-life"), "", "", res.NewConfig)

	f.snap = filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(ctx, c.Cli, f.snap); err != nil {
		t.Fatal(err)
	}
	f.rev = c.Revision()
	return f
}

func restoreFileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func open(t *testing.T, path string, opts snapshotdb.RestoreOptions) *snapshotdb.Restored {
	t.Helper()
	s, err := snapshotdb.Restore(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func setup(t *testing.T, cli *clientv3.Client, cfg pipeline.Config) *pipeline.Env {
	t.Helper()
	env, err := pipeline.Setup(context.Background(), cli, cfg)
	if err != nil {
		t.Fatalf("pipeline.Setup(%+v): %v", cfg, err)
	}
	t.Cleanup(env.Close)
	return env
}

// restoreReports are the JSON of inventory and verify, as the commands print them.
func restoreReports(t *testing.T, cli *clientv3.Client, cfg pipeline.Config) (inv, ver string, exit int) {
	t.Helper()
	ctx := context.Background()
	env := setup(t, cli, cfg)
	i, err := inventory.Run(ctx, env, inventory.Options{ShowKeys: 50}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := testsnap.ReportJSON(&b, i); err != nil {
		t.Fatal(err)
	}
	inv = b.String()
	r, err := verify.Run(ctx, env, verify.Options{ShowKeys: 50})
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := testsnap.ReportJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	return inv, b.String(), r.ExitCode()
}

func sameReports(t *testing.T, what string, liveInv, liveVer, inv, ver string) {
	t.Helper()
	if d := cmp.Diff(liveInv, inv); d != "" {
		t.Errorf("%s: inventory differs from the live etcd's (-live +file):\n%s", what, d)
	}
	if d := cmp.Diff(liveVer, ver); d != "" {
		t.Errorf("%s: verify differs from the live etcd's (-live +file):\n%s", what, d)
	}
}

// TestReadEqualsLiveEtcd: inventory and verify of the snapshot file are the
// same restoreReports, byte for byte, as against the live etcd at the snapshot's
// revision; so are they at an older revision (--revision); the file is not
// changed and the private directory is removed.
func TestReadEqualsLiveEtcd(t *testing.T) { testetcd.Each(t, testReadEqualsLiveEtcd) }

func testReadEqualsLiveEtcd(t *testing.T, version string) {
	ctx := context.Background()
	f := newRestoreFixture(t, version)
	before := restoreFileSum(t, f.snap)
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: f.encCfg}}
	liveInv, liveVer, liveExit := restoreReports(t, f.c.Cli, cfg)
	if liveExit != verify.ExitUnreadable {
		t.Fatalf("live verify exit %d, want 4 (the configmap under a lost key)", liveExit)
	}
	oldCfg := cfg
	oldCfg.Revision = f.beforeDel
	oldInv, oldVer, _ := restoreReports(t, f.c.Cli, oldCfg)

	// The live etcd moves on; the file stays at its revision.
	f.c.PutRaw("/registry/configmaps/dr/later", []byte("k8s\x00later"))
	liveLeases, err := f.c.Cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tmp := t.TempDir()
	s := open(t, f.snap, snapshotdb.RestoreOptions{TempDir: tmp})
	if s.Info.Revision != f.rev || s.Info.Hash != snapshotdb.HashVerified || s.Info.Leases != len(liveLeases.Leases) || s.Info.Leases < 2 {
		t.Errorf("Info = %+v, want revision %d, hash verified, %d leases", s.Info, f.rev, len(liveLeases.Leases))
	}
	var leased int64
	for _, l := range liveLeases.Leases {
		ttl, err := f.c.Cli.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		leased += int64(len(ttl.Keys))
	}
	if s.Info.LeasedKeys != leased {
		t.Errorf("Info.LeasedKeys = %d, want %d", s.Info.LeasedKeys, leased)
	}

	fcfg := cfg
	fcfg.SnapshotFile = f.snap
	inv, ver, exit := restoreReports(t, s.Client, fcfg)
	sameReports(t, "at the snapshot's revision", liveInv, liveVer, inv, ver)
	if exit != liveExit {
		t.Errorf("verify exit %d on the file, %d live", exit, liveExit)
	}
	fcfg.Revision = f.beforeDel
	inv, ver, _ = restoreReports(t, s.Client, fcfg)
	sameReports(t, fmt.Sprintf("--revision %d", f.beforeDel), oldInv, oldVer, inv, ver)
	if !strings.Contains(oldInv, f.deleted) && strings.Contains(liveInv, f.deleted) {
		t.Errorf("test bug: %s should be listed only before its delete", f.deleted)
	}

	// A deleted key is gone; a recreated one shows its new life.
	if g, err := s.Client.Get(ctx, f.deleted); err != nil || len(g.Kvs) != 0 {
		t.Errorf("%s: deleted before the snapshot, read from it: %v %v", f.deleted, g, err)
	}
	g, err := s.Client.Get(ctx, f.recreated)
	if err != nil || len(g.Kvs) != 1 || g.Kvs[0].CreateRevision <= f.createRev || g.Kvs[0].Version != 1 {
		t.Errorf("%s: want its second life (create revision > %d, version 1), got %v %v", f.recreated, f.createRev, g, err)
	}
	if err := s.CheckLeases(ctx, true); err != nil {
		t.Errorf("after the reads: %v", err)
	}

	// inspect: a key's lease shows its granted TTL only (a snapshot does not
	// record the time left); a deleted key is found at an older --revision.
	var out bytes.Buffer
	if err := testsnap.InspectJSON(ctx, setup(t, s.Client, pipeline.Config{SnapshotFile: f.snap, Target: target.Input{EncryptionConfig: f.encCfg}}), f.leased, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"leaseGrantedTTL": 600`) || strings.Contains(out.String(), `"leaseTTL"`) {
		t.Errorf("inspect %s on the file:\n%s", f.leased, out.String())
	}
	out.Reset()
	if err := testsnap.InspectJSON(ctx, setup(t, s.Client, pipeline.Config{SnapshotFile: f.snap, Revision: f.beforeDel}), f.deleted, &out); err != nil {
		t.Errorf("inspect %s at revision %d: %v", f.deleted, f.beforeDel, err)
	}
	err = testsnap.InspectJSON(ctx, setup(t, s.Client, pipeline.Config{SnapshotFile: f.snap}), f.deleted, &out)
	if err == nil || !strings.Contains(err.Error(), "key not found") {
		t.Errorf("inspect %s at the snapshot's revision: %v, want not found", f.deleted, err)
	}

	dir := s.Dir()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("private directory %s still there after Close: %v", dir, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir: %v", left)
	}
	if restoreFileSum(t, f.snap) != before {
		t.Errorf("the snapshot file changed")
	}
}

// TestRevisionChecks: a compacted or future --revision is a one-line error
// saying which revisions exist.
func TestRevisionChecks(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	c.PutRaw("/registry/configmaps/a/b", []byte("x"))
	c.PutRaw("/registry/configmaps/a/b", []byte("y"))
	rev := c.Revision()
	if _, err := c.Cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rev  int64
		want string
	}{
		{rev - 1, fmt.Sprintf("revision %d is compacted: the oldest revision etcd still has is %d", rev-1, rev)},
		{rev + 10, fmt.Sprintf("revision %d: etcd is at revision %d", rev+10, rev)},
	} {
		_, err := pipeline.Setup(ctx, c.Cli, pipeline.Config{Revision: tc.rev})
		if err == nil || err.Error() != tc.want {
			t.Errorf("Setup at revision %d: %v, want %q", tc.rev, err, tc.want)
		}
	}
	env := setup(t, c.Cli, pipeline.Config{Revision: rev})
	if _, err := inventory.Run(ctx, env, inventory.Options{}, nil); err != nil {
		t.Errorf("inventory at the compaction revision: %v", err)
	}
}

// TestRestoreDamagedFiles: a truncated, corrupt or foreign file is refused with one
// line naming it; nothing is left behind.
func TestRestoreDamagedFiles(t *testing.T) {
	f := newRestoreFixture(t, testetcd.Linked)
	good, err := os.ReadFile(f.snap)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string { return testsnap.Write(t, dir, name, b) }
	d := testsnap.Damage(t, dir, good)
	tmp := t.TempDir()
	for _, tc := range []struct {
		name, path, want string
		skip             bool
	}{
		{"missing", filepath.Join(dir, "missing.db"), "no such file or directory", false},
		{"directory", dir, "not a regular file", false},
		{"empty", write("empty.db", nil), "no sha256 trailer", false},
		{"text", write("notes.txt", []byte("this is not a snapshot\n")), "no sha256 trailer", false},
		{"text, --skip-hash-check", write("notes2.txt", []byte("this is not a snapshot\n")), "not an etcd snapshot", true},
		{"truncated", d.Truncated, "", false},
		{"truncated, --skip-hash-check", d.TruncatedMember, "truncated", true},
		{"one byte flipped", d.Flipped, "sha256 of the database does not match", false},
		{"member db without --skip-hash-check", d.MemberDB, string(input.SkipHashCheck), false},
		{"pages overwritten, --skip-hash-check", d.Garbage, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := snapshotdb.Restore(context.Background(), tc.path, snapshotdb.RestoreOptions{SkipHashCheck: tc.skip, TempDir: tmp})
			if err == nil {
				s.Close()
				t.Fatalf("opened %s", tc.path)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "snapshot file "+tc.path+": ") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want one line naming %s and saying %q", msg, tc.path, tc.want)
			}
		})
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temp dir: %v", left)
	}
}

// TestMemberDB: a member's member/snap/db (no sha256 trailer) is read with
// --skip-hash-check like a snapshot; while its member runs it is locked.
func TestMemberDB(t *testing.T) { testetcd.Each(t, testMemberDB) }

func testMemberDB(t *testing.T, version string) {
	f := newRestoreFixture(t, version)
	db := filepath.Join(f.dataDir, "data", "member", "snap", "db")
	_, err := snapshotdb.Restore(context.Background(), db, snapshotdb.RestoreOptions{SkipHashCheck: true})
	if err == nil || !strings.Contains(err.Error(), "locked by a running etcd member") {
		t.Errorf("member db of a running member: %v, want locked", err)
	}
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: f.encCfg}}
	liveInv, liveVer, _ := restoreReports(t, f.c.Cli, cfg)
	f.c.Srv.Stop()
	copyDB := filepath.Join(t.TempDir(), "db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyDB, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, copyDB, snapshotdb.RestoreOptions{SkipHashCheck: true})
	if s.Info.Hash != snapshotdb.HashSkipped {
		t.Errorf("hash %q, want skipped", s.Info.Hash)
	}
	inv, ver, _ := restoreReports(t, s.Client, cfg)
	sameReports(t, "member/snap/db", liveInv, liveVer, inv, ver)
	if sum := sha256.Sum256(b); restoreFileSum(t, copyDB) != sum {
		t.Error("the member db changed")
	}
}

// TestShortLeaseKeptAlive: a lease about to run out when the snapshot was
// taken keeps its key while the file is open (and in a saved copy, with its
// TTL); without the keepalives, the restored etcd would revoke it and delete
// the key — which CheckLeases restoreReports.
func TestShortLeaseKeptAlive(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	lease, err := c.Cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	const key = "/registry/masterleases/10.0.0.1"
	c.PutRaw(key, []byte("k8s\x00endpoints"), clientv3.WithLease(lease.ID))
	snap := filepath.Join(t.TempDir(), "short.db")
	if err := etcdscan.Snapshot(ctx, c.Cli, snap); err != nil {
		t.Fatal(err)
	}

	has := func(cli *clientv3.Client) bool {
		g, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(g.Kvs) == 1 && g.Kvs[0].Lease == int64(lease.ID)
	}
	var without snapshotdb.RestoreOptions
	snapshotdb.WithoutKeepAlive(&without)
	kept := open(t, snap, snapshotdb.RestoreOptions{})
	lost := open(t, snap, without)
	if !has(kept.Client) || !has(lost.Client) {
		t.Fatal("the key is not in the snapshot with its lease")
	}
	time.Sleep(6 * time.Second) // TTL 2 s + 1 s grace, revoked within the lessor's 0.5 s tick
	if !has(kept.Client) {
		t.Error("with keepalives: the key expired while the file was open")
	}
	if err := kept.CheckLeases(ctx, true); err != nil {
		t.Errorf("with keepalives: %v", err)
	}
	if has(lost.Client) {
		t.Error("without keepalives the key survived: the test does not show the hazard")
	}
	if err := lost.CheckLeases(ctx, true); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%016x", int64(lease.ID))) {
		t.Errorf("without keepalives CheckLeases = %v, want the lost lease named", err)
	}

	out := filepath.Join(t.TempDir(), "out.db")
	if err := kept.Save(ctx, out, false); err != nil {
		t.Fatal(err)
	}
	if err := lost.Save(ctx, filepath.Join(t.TempDir(), "lost.db"), false); err == nil {
		t.Error("saved a snapshot that lost a lease")
	}
	o := open(t, out, without)
	if !has(o.Client) {
		t.Fatal("the saved snapshot lost the key or its lease")
	}
	ttl, err := o.Client.TimeToLive(ctx, lease.ID)
	if err != nil || ttl.GrantedTTL != 2 {
		t.Errorf("lease in the saved snapshot: %+v %v, want granted TTL 2", ttl, err)
	}
}

// TestSave: the output is a 0600 snapshot that restores to the same keyspace
// and leases, holds no history, appears atomically, never replaces an
// existing file without force, and never the input.
func TestSave(t *testing.T) {
	ctx := context.Background()
	f := newRestoreFixture(t, testetcd.Linked)
	before := restoreFileSum(t, f.snap)
	s := open(t, f.snap, snapshotdb.RestoreOptions{})
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: f.encCfg}}
	inInv, inVer, _ := restoreReports(t, s.Client, cfg)

	outDir := t.TempDir()
	out := filepath.Join(outDir, "out.db")
	if err := s.Save(ctx, f.snap, true); err == nil || !strings.Contains(err.Error(), "is the "+string(input.SnapshotFile)+" itself") {
		t.Errorf("Save onto the input with force: %v", err)
	}
	if err := s.Save(ctx, out, false); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := s.Save(ctx, out, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second Save without force: %v", err)
	}
	if err := s.Save(ctx, out, true); err != nil {
		t.Errorf("Save with force: %v", err)
	}
	if left, _ := os.ReadDir(outDir); len(left) != 1 {
		t.Errorf("files in the output directory: %v, want out.db only", left)
	}

	o := open(t, out, snapshotdb.RestoreOptions{})
	if o.Info.Revision != f.rev || o.Info.CompactRevision != f.rev || o.Info.Leases != s.Info.Leases || o.Info.LeasedKeys != s.Info.LeasedKeys {
		t.Errorf("output Info %+v, want revision %d compacted at it, leases as the input %+v", o.Info, f.rev, s.Info)
	}
	outInv, outVer, _ := restoreReports(t, o.Client, cfg)
	sameReports(t, "saved copy", inInv, inVer, outInv, outVer)
	if _, err := o.Client.Get(ctx, f.deleted, clientv3.WithRev(f.beforeDel)); err == nil {
		t.Error("the saved copy still has history before its revision")
	}
	if restoreFileSum(t, f.snap) != before {
		t.Error("the input changed")
	}
}

// TestSaveRestoresOnItsOwnEtcd: a snapshot taken of an etcd 3.6 (or 3.7)
// cluster, changed through the file and saved, is restored by that
// release's own etcdutl and served by that release's etcd: the saved file
// keeps the storage and cluster versions of the input (the private etcd,
// the linked 3.7, raises both to its own, which etcd 3.6 refuses to start
// on), with the change, the other keys and the lease.
func TestSaveRestoresOnItsOwnEtcd(t *testing.T) { testetcd.Each(t, testSaveRestoresOnItsOwnEtcd) }

func testSaveRestoresOnItsOwnEtcd(t *testing.T, version string) {
	ctx := context.Background()
	src := testetcd.StartT(t, testetcd.Options{Version: version})
	cli := src.ClientT(t)
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/configmaps/ns/cm-%02d", i), "old"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/registry/events/ns/e", "event", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.db")
	if err := etcdscan.Snapshot(ctx, cli, in); err != nil {
		t.Fatal(err)
	}
	minor := src.Version[:strings.LastIndex(src.Version, ".")] + ".0"
	// etcd 3.5 records no storage version in its database (3.6 added it);
	// the saved file must not gain one that etcd 3.5 would not write.
	storage := minor
	if minor == "3.5.0" {
		storage = ""
	}
	s := open(t, in, snapshotdb.RestoreOptions{})
	if s.Info.StorageVersion != storage || s.Info.ClusterVersion != minor {
		t.Errorf("Info %+v: want storage version %q, cluster version %s", s.Info, storage, minor)
	}
	if _, err := s.Client.Put(ctx, "/registry/configmaps/ns/cm-07", "rewritten"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.db")
	if err := s.Save(ctx, out, false); err != nil {
		t.Fatal(err)
	}
	o := open(t, out, snapshotdb.RestoreOptions{})
	if o.Info.StorageVersion != storage || o.Info.ClusterVersion != minor || o.Info.Hash != snapshotdb.HashVerified {
		t.Errorf("saved file %+v: want storage version %q, cluster version %s, hash verified", o.Info, storage, minor)
	}

	dst := testetcd.StartT(t, testetcd.Options{Version: version, RestoreFrom: out})
	if dst.Version != src.Version {
		t.Fatalf("restored into etcd %s, want %s", dst.Version, src.Version)
	}
	dcli := dst.ClientT(t)
	resp, err := dcli.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 21 {
		t.Fatalf("restored %d keys, want 21", len(resp.Kvs))
	}
	for _, kv := range resp.Kvs {
		want := "old"
		switch string(kv.Key) {
		case "/registry/configmaps/ns/cm-07":
			want = "rewritten"
		case "/registry/events/ns/e":
			want = "event"
			if kv.Lease != int64(lease.ID) {
				t.Errorf("%s: lease %x, want %x", kv.Key, kv.Lease, lease.ID)
			}
		}
		if string(kv.Value) != want {
			t.Errorf("%s = %q, want %q", kv.Key, kv.Value, want)
		}
	}
}
