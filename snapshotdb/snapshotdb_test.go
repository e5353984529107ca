package snapshotdb_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testsnap"
	"kube-etcd-migrate/target"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
)

// snapshotCase is a snapshot file saved by etcd's snapshot API and the
// revisions worth reading it at.
type snapshotCase struct {
	name string
	path string
	revs []int64 // besides 0 (the file's own)
	// compacted is the revision the file was compacted at (0: never).
	compacted int64
}

// fixture is a seeded stale cluster (secrets under aescbc and identity,
// events with kube-apiserver's lease, CRDs, stale versions and media types)
// with a lease of its own, a key rewritten several times, a delete and a
// delete-and-recreate; three snapshots of it: with its whole history, after
// a compaction in the middle of that history and more deletes, and after a
// delete compacted away at once (the newest revision has no record left).
type fixture struct {
	c        *testcluster.Cluster
	encCfg   string
	lease    clientv3.LeaseID
	keys     []string // keys with history, deleted, recreated, leased
	cases    []snapshotCase
	snapshot func(name string) string
}

func newFixture(t *testing.T, version string) *fixture {
	t.Helper()
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{Version: version})
	res, err := seed.Cluster(ctx, c.Cli, seed.Options{Dir: c.Dir})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{c: c, encCfg: res.NewConfig}
	dir := t.TempDir()
	f.snapshot = func(name string) string {
		p := filepath.Join(dir, name+".db")
		if err := etcdscan.Snapshot(ctx, c.Cli, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lease, err := c.Cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	f.lease = lease.ID
	leased := "/registry/configmaps/dr/cm-leased"
	c.Put(leased, testcluster.ConfigMapsGR, testcluster.ConfigMap("dr", "cm-leased"), "", "", "", clientv3.WithLease(lease.ID))
	rewritten := "/registry/configmaps/dr/cm-history"
	for i := 0; i < 3; i++ {
		cm := testcluster.ConfigMap("dr", "cm-history")
		cm.Data = map[string]string{"round": fmt.Sprint(i)}
		c.Put(rewritten, testcluster.ConfigMapsGR, cm, "", "", "")
	}
	early := c.Revision()
	deleted := "/registry/configmaps/team-00/kube-root-ca.crt"
	recreated := res.SecretKey
	for _, k := range []string{deleted, recreated} {
		if resp, err := c.Cli.Delete(ctx, k); err != nil || resp.Deleted != 1 {
			t.Fatalf("delete %s: %v %v", k, resp, err)
		}
	}
	c.Put(recreated, testcluster.SecretsGR, testcluster.Secret("team-00", filepath.Base(recreated), "second-life"), "", "", res.NewConfig)
	f.keys = []string{leased, rewritten, deleted, recreated}
	f.cases = append(f.cases, snapshotCase{name: "history", path: f.snapshot("history"), revs: []int64{1, early, early + 1}})

	// Compacted in the middle of that history; then more changes.
	mid := early + 1
	if _, err := c.Cli.Compact(ctx, mid, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	later := "/registry/configmaps/team-01/kube-root-ca.crt"
	if _, err := c.Cli.Delete(ctx, later); err != nil {
		t.Fatal(err)
	}
	cm := testcluster.ConfigMap("dr", "cm-history")
	cm.Data = map[string]string{"round": "after the compaction"}
	c.Put(rewritten, testcluster.ConfigMapsGR, cm, "", "", "")
	f.keys = append(f.keys, later)
	f.cases = append(f.cases, snapshotCase{name: "compacted", path: f.snapshot("compacted"), revs: []int64{mid, mid + 1, c.Revision() - 1}, compacted: mid})

	// The newest change a delete, compacted at once: its tombstone is gone.
	if _, err := c.Cli.Delete(ctx, rewritten); err != nil {
		t.Fatal(err)
	}
	top := c.Revision()
	if _, err := c.Cli.Compact(ctx, top, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	f.cases = append(f.cases, snapshotCase{name: "tombstone compacted", path: f.snapshot("tombstone"), revs: []int64{top}, compacted: top})
	return f
}

// ignoreSub compares a file's keys with etcd's: a file read in place knows
// each record's sub-revision (etcdscan.KV.ModSub), etcd's API does not give it.
var ignoreSub = cmpopts.IgnoreFields(etcdscan.KV{}, "ModSub")

// saveAndOpen saves cli's etcd with etcd's snapshot code into a file named
// name of a temporary directory and opens it in place, closed at the test's
// end; it returns the file and its path.
func saveAndOpen(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) (*snapshotdb.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := etcdscan.Snapshot(ctx, cli, path); err != nil {
		t.Fatal(err)
	}
	file, err := snapshotdb.Open(path, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Close() })
	return file, path
}

func scanAll(t *testing.T, src etcdscan.Source, prefix string, rev int64) []etcdscan.KV {
	t.Helper()
	var all []etcdscan.KV
	st, err := src.Scan(context.Background(), etcdscan.ScanOptions{Prefixes: []string{prefix}, Revision: rev, PageSize: 7}, func(page []etcdscan.KV) error {
		all = append(all, page...)
		return nil
	})
	if err != nil {
		t.Fatalf("scan %q at %d: %v", prefix, rev, err)
	}
	if st.Keys != int64(len(all)) || !st.Consistent {
		t.Errorf("scan stats %+v for %d keys", st, len(all))
	}
	return all
}

// reports are the JSON of inventory and verify, as the commands print them.
func reports(t *testing.T, env *pipeline.Env) string {
	t.Helper()
	ctx := context.Background()
	i, err := inventory.Run(ctx, env, inventory.Options{ShowKeys: 50}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := testsnap.ReportJSON(&b, i); err != nil {
		t.Fatal(err)
	}
	r, err := verify.Run(ctx, env, verify.Options{ShowKeys: 50})
	if err != nil {
		t.Fatal(err)
	}
	if err := testsnap.ReportJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestSameAsRestore: on each file (history, compacted, tombstone compacted),
// the direct reader gives the same answers as etcd restored from the same
// file: revisions and leases, every key with its value, revisions, version and
// lease at each readable revision (also with runs of the key index and a
// mapping so small that the index is spilled in many runs and the file
// remapped many times), single keys, counts,
// inventory and verify reports byte for byte, and the same refusal of a
// compacted or future revision; the file is not changed and nothing is
// written to $TMPDIR. Files of each etcd release the tool supports (the
// linked 3.7 and 3.6), saved by that release's own server.
func TestSameAsRestore(t *testing.T) { testetcd.Each(t, testSameAsRestore) }

func testSameAsRestore(t *testing.T, version string) {
	ctx := context.Background()
	f := newFixture(t, version)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, sc := range f.cases {
		t.Run(sc.name, func(t *testing.T) {
			before := fileSum(t, sc.path)
			// Restored with etcdutl's restore code of the release that
			// saved it, and served by that release's etcd.
			srv := testetcd.StartT(t, testetcd.Options{RestoreFrom: sc.path, Version: version})
			cli, err := srv.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			etcd := etcdscan.ClientSource{Client: cli}
			file, err := snapshotdb.Open(sc.path, snapshotdb.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer file.Close()

			leases, err := cli.Leases(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if fi := file.Info; fi.Leases != len(leases.Leases) || fi.ClusterVersion == "" ||
				// etcd 3.5 records no storage version (3.6 added it)
				(fi.StorageVersion == "") != (fi.ClusterVersion == "3.5.0") {
				t.Errorf("Info = %+v, restored: %d lease(s)", fi, len(leases.Leases))
			}
			if file.Info.CompactRevision != sc.compacted || file.Info.Leases < 2 {
				t.Errorf("Info = %+v: want compacted at %d, at least 2 leases", file.Info, sc.compacted)
			}
			cur, comp, err := etcd.Revisions(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if fcur, fcomp, _ := file.Revisions(ctx); fcur != cur || fcomp != comp {
				t.Errorf("Revisions = %d, %d; restored %d, %d", fcur, fcomp, cur, comp)
			}

			for _, rev := range append([]int64{0}, sc.revs...) {
				want := scanAll(t, etcd, "", rev)
				if len(want) == 0 {
					continue // revision 1: nothing yet
				}
				if d := cmp.Diff(want, scanAll(t, file, "", rev), ignoreSub); d != "" {
					t.Errorf("revision %d: keys differ (-restored +file):\n%s", rev, d)
				}
				// Runs merged three at a time: in several rounds.
				restore, fanIn := snapshotdb.SetLimits(file, 3000), snapshotdb.SetFanIn(3)
				if d := cmp.Diff(want, scanAll(t, file, "", rev), ignoreSub); d != "" {
					t.Errorf("revision %d, small runs: keys differ (-restored +file):\n%s", rev, d)
				}
				fanIn()
				restore()
				for _, key := range f.keys {
					wkv, wok, werr := etcd.Get(ctx, key, rev)
					kv, ok, err := file.Get(ctx, key, rev)
					if werr != nil || err != nil || ok != wok || !cmp.Equal(kv, wkv, ignoreSub) {
						t.Errorf("Get(%s, %d) = %v %v %v; restored %v %v %v", key, rev, kv, ok, err, wkv, wok, werr)
					}
				}
			}
			// Ranges within and beyond the keyspace (a command's scans: the
			// whole keyspace, then smaller ranges), with the key index in
			// memory and spilled in many runs.
			prefixes := []string{"/registry/", "/registry/apiextensions.k8s.io/", "/registry/configmaps/", "/registry/configmaps/dr/", "/registry/secrets/", "/registry/secrets/team-00/", "/registry/zzz/", "/nothing/", ""}
			for _, limits := range [][2]int{{0, 0}, {3000, 8192}, {20000, 8192}} {
				restore := func() {}
				if limits[0] > 0 {
					restore = snapshotdb.SetLimits(file, limits[0])
				}
				for _, p := range prefixes {
					if d := cmp.Diff(scanAll(t, etcd, p, 0), scanAll(t, file, p, 0), ignoreSub); d != "" {
						t.Errorf("run %d: keys under %q differ (-restored +file):\n%s", limits[0], p, d)
					}
				}
				// A scan stopped at its first key (pipeline's prefix
				// check), then the range is read whole, or a range that
				// starts in it.
				for _, pp := range [][2]string{{"/registry/", "/registry/"}, {"", "/registry/apiextensions.k8s.io/"}, {"/registry/", "/registry/configmaps/"}} {
					stop := errors.New("stop")
					_, err := file.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{pp[0]}, PageSize: 1}, func([]etcdscan.KV) error { return stop })
					if !errors.Is(err, stop) {
						t.Fatalf("scan stopped at its first key: %v", err)
					}
					if d := cmp.Diff(scanAll(t, etcd, pp[1], 0), scanAll(t, file, pp[1], 0), ignoreSub); d != "" {
						t.Errorf("run %d: keys under %q after the first of %q differ (-restored +file):\n%s", limits[0], pp[1], pp[0], d)
					}
				}
				restore()
			}
			for _, limits := range [][2]int{{0, 0}, {3000, 8192}} {
				restore := func() {}
				if limits[0] > 0 {
					restore = snapshotdb.SetLimits(file, limits[0])
				}
				for _, p := range []string{"", "/registry/", "/registry/secrets/", "/registry/configmaps/dr/", "/nothing/"} {
					want, err := etcd.Count(ctx, p)
					if err != nil {
						t.Fatal(err)
					}
					if n, err := file.Count(ctx, p); err != nil || n != want {
						t.Errorf("run %d: Count(%q) = %d %v, restored %d", limits[0], p, n, err, want)
					}
				}
				// inventory counts the keys (its progress bar), then scans
				// them: one pass over the file for both, however many runs
				// its index of the keys is spilled in.
				snapshotdb.Forget(file)
				before, spilled := snapshotdb.Passes(file), snapshotdb.Spills(file)
				scanAll(t, file, "/registry/", 0)
				scan, spills := snapshotdb.Passes(file)-before, snapshotdb.Spills(file)-spilled
				snapshotdb.Forget(file)
				before = snapshotdb.Passes(file)
				if _, err := file.Count(ctx, "/registry/"); err != nil {
					t.Fatal(err)
				}
				counted := snapshotdb.Passes(file) - before
				scanAll(t, file, "/registry/", 0)
				both := snapshotdb.Passes(file) - before
				if scan != 1 || counted != 1 || both != 1 || (limits[0] > 0) != (spills > 3) {
					t.Errorf("run %d: a scan of /registry/ takes %d passes over the file (%d runs spilled); Count then the scan %d (%d for the count), want 1 (the count's is the scan's)", limits[0], scan, spills, both, counted)
				}
				restore()
			}
			for _, id := range []int64{int64(f.lease), 12345} {
				want, werr := etcd.Lease(ctx, id)
				got, err := file.Lease(ctx, id)
				if werr != nil || err != nil || got.GrantedTTL != want.GrantedTTL || (want.TTL < 0) != (got.TTL < 0) {
					t.Errorf("Lease(%016x) = %+v %v, restored %+v %v", id, got, err, want, werr)
				}
			}

			for _, rev := range []int64{0, sc.compacted} {
				cfg := pipeline.Config{Target: target.Input{EncryptionConfig: f.encCfg}, Revision: rev, SnapshotFile: sc.path}
				wenv, err := pipeline.Setup(ctx, cli, cfg)
				if err != nil {
					t.Fatal(err)
				}
				env, err := pipeline.SetupSource(ctx, file, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(reports(t, wenv), reports(t, env)); d != "" {
					t.Errorf("revision %d: reports differ (-restored +file):\n%s", rev, d)
				}
				var want, got bytes.Buffer
				werr := testsnap.InspectJSON(ctx, wenv, f.keys[0], &want)
				err = testsnap.InspectJSON(ctx, env, f.keys[0], &got)
				if werr != nil || err != nil || want.String() != got.String() {
					t.Errorf("inspect %s: %v %v\nrestored:\n%s\nfile:\n%s", f.keys[0], werr, err, want.String(), got.String())
				}
				wenv.Close()
				env.Close()
			}
			for _, rev := range []int64{sc.compacted - 1, cur + 1} {
				if rev <= 0 {
					continue
				}
				cfg := pipeline.Config{Revision: rev}
				_, werr := pipeline.Setup(ctx, cli, cfg)
				_, err := pipeline.SetupSource(ctx, file, cfg)
				if werr == nil || err == nil || werr.Error() != err.Error() {
					t.Errorf("revision %d: %v, restored %v", rev, err, werr)
				}
			}
			if fileSum(t, sc.path) != before {
				t.Error("the file changed")
			}
		})
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("written to $TMPDIR: %v", left)
	}
}

// TestDamagedFiles: a truncated file, one whose sha256 does not match, a
// member's db without --skip-hash-check, and with it a truncated one, a
// foreign one and one with pages overwritten are refused by the direct reader
// with one line naming the file. A member's
// db reads as its snapshot; a file replaced after it was opened is an error.
func TestDamagedFiles(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	for i := 0; i < 200; i++ {
		c.PutRaw(fmt.Sprintf("/registry/configmaps/a/%03d", i), bytes.Repeat([]byte{'x'}, 400))
	}
	good := filepath.Join(t.TempDir(), "good.db")
	if err := etcdscan.Snapshot(ctx, c.Cli, good); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string { return testsnap.Write(t, dir, name, b) }
	d := testsnap.Damage(t, dir, b)
	for _, tc := range []struct {
		name, path, want string
		skip             bool
	}{
		{"truncated", d.Truncated, "", false},
		{"bad hash", d.Flipped, "sha256 of the database does not match", false},
		{"member db without --skip-hash-check", d.MemberDB, string(input.SkipHashCheck), false},
		{"truncated, --skip-hash-check", d.TruncatedMember, "truncated", true},
		{"not a snapshot, --skip-hash-check", write("notes.txt", []byte("not a snapshot\n")), "not an etcd snapshot", true},
		{"pages overwritten, --skip-hash-check", d.Garbage, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := snapshotdb.Open(tc.path, snapshotdb.Options{SkipHashCheck: tc.skip})
			if err == nil {
				t.Fatalf("opened %s", tc.path)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "snapshot file "+tc.path+": ") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want one line naming %s and saying %q", msg, tc.path, tc.want)
			}
		})
	}
	// A member's db, read with --skip-hash-check (every record read through,
	// the mapping dropped every 8 KiB), reads as the snapshot does.
	restore := snapshotdb.SetLimits(nil, 3000)
	defer restore()
	f, err := snapshotdb.Open(d.MemberDB, snapshotdb.Options{SkipHashCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	g, err := snapshotdb.Open(good, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Info.Hash != snapshotdb.HashSkipped || !cmp.Equal(scanAll(t, f, "", 0), scanAll(t, g, "", 0)) {
		t.Errorf("member db: %+v, or its keys differ from the snapshot's", f.Info)
	}
	// A file replaced after it was opened is an error, not a mix of two files.
	other := write("other.db", b)
	h, err := snapshotdb.Open(other, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.PutRaw("/registry/configmaps/a/later", []byte("y"))
	if err := etcdscan.Snapshot(ctx, c.Cli, other+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other+".new", other); err != nil {
		t.Fatal(err)
	}
	_, err = h.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{""}}, func([]etcdscan.KV) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "changed while it was being read") || !strings.Contains(err.Error(), other) {
		t.Errorf("scan of a replaced file: %v", err)
	}
}
