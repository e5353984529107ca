package snapshotdb_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/snapshotdb"
)

func sum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// history writes a keyspace with history into etcd: keys written several
// times, a deleted key, a key deleted and created again, keys on a lease,
// and three keys of one transaction (sub-revisions 0, 1 and 2). It returns
// the lease.
func history(t *testing.T, cli *clientv3.Client) clientv3.LeaseID {
	t.Helper()
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		must(cli.Put(ctx, "/r/a", fmt.Sprintf("a-v%d", i)))
	}
	must(cli.Put(ctx, "/r/b", "b-leased", clientv3.WithLease(l.ID)))
	must(cli.Put(ctx, "/r/c", "c-leased", clientv3.WithLease(l.ID)))
	must(cli.Put(ctx, "/r/d", "d-deleted"))
	must(cli.Delete(ctx, "/r/d"))
	must(cli.Put(ctx, "/r/e", "e-1"))
	must(cli.Delete(ctx, "/r/e"))
	must(cli.Put(ctx, "/r/e", "e-2"))
	must(cli.Txn(ctx).Then(clientv3.OpPut("/r/t0", "t0"), clientv3.OpPut("/r/t1", "t1"), clientv3.OpPut("/r/t2", "t2")).Commit())
	must(cli.Put(ctx, "/r/u", "u-unchanged"))
	must(cli.Put(ctx, "/crd/w", "w-1"))
	must(cli.Put(ctx, "/r/a", "a-v4"))
	return l.ID
}

func getAll(t *testing.T, cli *clientv3.Client) (map[string]etcdscan.KV, int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]etcdscan.KV{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = etcdscan.KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
	}
	return out, resp.Header.Revision
}

// TestOutputRestores: the writer's output, restored with etcdutl's own
// restore code and served by etcd, holds every live key of the input at
// the input's revision: those not written byte for byte with their
// revisions, version and lease; those written with the new value at new
// revisions above the input's, create revision and lease kept, version one
// more; no deleted key, no history (compacted at its revision); the lease
// with its keys. The input is not modified, and nothing is left beside the
// output.
func TestOutputRestores(t *testing.T) {
	for _, chunk := range []int{64, 8 << 20} {
		t.Run(fmt.Sprintf("commit every %d bytes", chunk), func(t *testing.T) {
			defer snapshotdb.SetChunkBytes(chunk)()
			testOutputRestores(t, testetcd.LinkedVersion)
		})
	}
}

// TestOutputRestoresOnItsRelease: the same for a snapshot of each etcd
// release the tool supports, saved by that release's server: the output
// keeps the input's storage and cluster versions, and that release's own
// etcdutl restores it and its etcd serves it.
func TestOutputRestoresOnItsRelease(t *testing.T) {
	for _, v := range testetcd.Versions() {
		if !testetcd.IsLinked(v) { // the linked one: TestOutputRestores
			t.Run(testetcd.Name(v), func(t *testing.T) { testOutputRestores(t, v) })
		}
	}
}

func testOutputRestores(t *testing.T, version string) {
	ctx := context.Background()
	src := testetcd.StartT(t, testetcd.Options{Version: version})
	cli, err := src.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	lease := history(t, cli)
	want, inRev := getAll(t, cli)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.db")
	if err := etcdscan.Snapshot(ctx, cli, in); err != nil {
		t.Fatal(err)
	}
	before := sum(t, in)

	f, err := snapshotdb.Open(in, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Info.Revision != inRev {
		t.Fatalf("file at revision %d, etcd at %d", f.Info.Revision, inRev)
	}
	outDir := t.TempDir()
	out := filepath.Join(outDir, "out.db")
	w, err := snapshotdb.NewWriter(ctx, f, out, snapshotdb.WriterOptions{Track: func(k string) bool { return strings.HasPrefix(k, "/crd/") }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	read := map[string]etcdscan.KV{}
	if _, err := f.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{"/"}, PageSize: 3}, func(page []etcdscan.KV) error {
		for _, kv := range page {
			read[kv.Key] = kv
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if read["/r/t1"].ModSub != 1 || read["/r/t2"].ModSub != 2 || read["/r/t0"].ModRevision != read["/r/t2"].ModRevision {
		t.Fatalf("the transaction's keys read as %+v %+v %+v: want one revision, subs 0, 1, 2", read["/r/t0"], read["/r/t1"], read["/r/t2"])
	}
	put := func(key, value string) etcdscan.Put {
		kv := read[key]
		return etcdscan.Put{Key: key, Value: []byte(value), ModRevision: kv.ModRevision, Read: kv.Meta()}
	}
	rewrite := map[string]string{"/r/a": "A", "/r/c": "C", "/r/t1": "T1", "/r/t2": "T2", "/r/e": "E"}
	var puts []etcdscan.Put
	for _, k := range []string{"/r/a", "/r/c", "/r/t1", "/r/t2", "/r/e"} {
		puts = append(puts, put(k, rewrite[k]))
	}
	// The same key again at the revision read: written by the first put.
	puts = append(puts, put("/r/a", "again"))
	// A delete spends a revision; a second delete of it conflicts; a
	// creation is not for an output snapshot.
	del := func(key string) etcdscan.Put {
		kv := read[key]
		return etcdscan.Put{Key: key, ModRevision: kv.ModRevision, Read: kv.Meta(), Delete: true}
	}
	puts = append(puts, del("/r/u"), del("/r/u"), etcdscan.Put{Key: "/r/new", Value: []byte("x")})
	res := w.Write(ctx, puts)
	for i, r := range res[:5] {
		if r.Status != etcdscan.Written || r.NewModRevision != inRev+int64(i)+1 {
			t.Errorf("%s: %v %v at %d, want written at %d", r.Key, r.Status, r.Err, r.NewModRevision, inRev+int64(i)+1)
		}
	}
	if res[5].Status != etcdscan.Conflict || res[6].Status != etcdscan.Written || res[6].NewModRevision != inRev+6 || res[7].Status != etcdscan.Conflict || res[8].Status != etcdscan.Failed {
		t.Errorf("second write, delete, delete again, creation: %+v %+v %+v %+v, want conflict, written at %d, conflict, failed", res[5], res[6], res[7], res[8], inRev+6)
	}
	delete(want, "/r/u")
	// A tracked key: read back, written again at its new revision; the
	// revision read from the input is then a conflict.
	first := put("/crd/w", "w-2")
	if r := w.Write(ctx, []etcdscan.Put{first})[0]; r.Status != etcdscan.Written {
		t.Fatalf("/crd/w: %v %v", r.Status, r.Err)
	}
	got, found, err := w.Get(ctx, "/crd/w")
	if err != nil || !found || string(got.Value) != "w-2" || got.Version != read["/crd/w"].Version+1 {
		t.Fatalf("/crd/w read back: %+v %v %v", got, found, err)
	}
	if r := w.Write(ctx, []etcdscan.Put{first})[0]; r.Status != etcdscan.Conflict {
		t.Errorf("/crd/w at the input's revision after a write: %v, want conflict", r.Status)
	}
	second := etcdscan.Put{Key: "/crd/w", Value: []byte("w-3"), ModRevision: got.ModRevision, Read: got.Meta()}
	r := w.Write(ctx, []etcdscan.Put{second})[0]
	if r.Status != etcdscan.Written {
		t.Fatalf("/crd/w again: %v %v", r.Status, r.Err)
	}
	rewrite["/crd/w"] = "w-3"
	// The last write a delete of a leased key: the output's revision is
	// the delete's, though no record is there.
	r = w.Write(ctx, []etcdscan.Put{del("/r/b")})[0]
	if r.Status != etcdscan.Written || r.NewModRevision != inRev+9 {
		t.Fatalf("delete /r/b: %+v, want written at %d", r, inRev+9)
	}
	delete(want, "/r/b")
	outRev := r.NewModRevision

	result, err := w.Finish(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if result.Revision != outRev || result.Keys != int64(len(want)) || result.Rewritten != 6 || result.Deleted != 2 || result.LeasedKeys != 1 {
		t.Errorf("result %+v: want revision %d, %d keys, 6 rewritten, 2 deleted, 1 leased", result, outRev, len(want))
	}
	if left, _ := os.ReadDir(outDir); len(left) != 1 {
		t.Errorf("beside the output: %v, want it alone", left)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != result.Size {
		t.Errorf("output %v %v, want mode 0600, %d bytes", fi, err, result.Size)
	}
	if sum(t, in) != before {
		t.Error("the input changed")
	}
	src.Close()

	// Restored with etcdutl's restore code, served by etcd.
	dst := testetcd.StartT(t, testetcd.Options{RestoreFrom: out, Version: version})
	dcli, err := dst.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer dcli.Close()
	gotAll, rev := getAll(t, dcli)
	if rev != outRev {
		t.Errorf("restored at revision %d, want %d", rev, outRev)
	}
	if len(gotAll) != len(want) {
		t.Errorf("restored %d keys, want %d", len(gotAll), len(want))
	}
	for k, w := range want {
		g, ok := gotAll[k]
		switch nv, rewritten := rewrite[k]; {
		case !ok:
			t.Errorf("%s: missing", k)
		case !rewritten && (string(g.Value) != string(w.Value) || g.ModRevision != w.ModRevision || g.CreateRevision != w.CreateRevision || g.Version != w.Version || g.Lease != w.Lease):
			t.Errorf("%s: %+v, want unchanged %+v", k, g, w)
		case rewritten && k != "/crd/w" && (string(g.Value) != nv || g.ModRevision <= inRev || g.CreateRevision != w.CreateRevision || g.Version != w.Version+1 || g.Lease != w.Lease):
			t.Errorf("%s: %+v, want %q above revision %d, created at %d, version %d, lease %x", k, g, nv, inRev, w.CreateRevision, w.Version+1, w.Lease)
		case k == "/crd/w" && (string(g.Value) != nv || g.ModRevision != outRev-1 || g.Version != w.Version+2):
			t.Errorf("%s: %+v, want %q at %d, version %d", k, g, nv, outRev-1, w.Version+2)
		}
	}
	for _, k := range []string{"/r/d", "/r/u", "/r/b"} {
		if _, ok := gotAll[k]; ok {
			t.Errorf("%s, deleted, is back", k)
		}
	}
	// No history: compacted at its revision.
	if _, err := dcli.Get(ctx, "/r/a", clientv3.WithRev(inRev)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Errorf("read at the input's revision %d: %v, want compacted", inRev, err)
	}
	ttl, err := dcli.TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL <= 0 || len(ttl.Keys) != 1 {
		t.Errorf("lease %x restored: %+v %v, want alive with /r/c alone", lease, ttl, err)
	}
	// etcd writes on: the next revision follows.
	p, err := dcli.Put(ctx, "/r/next", "n")
	if err != nil || p.Header.Revision != outRev+1 {
		t.Errorf("a put on the restored etcd: %v at %v, want revision %d", err, p, outRev+1)
	}
}

// TestOutputFailures: an input that changed since it was read, or an output
// directory gone, fails the build with one line naming the file, and leaves
// no output and nothing beside it.
func TestOutputFailures(t *testing.T) {
	ctx := context.Background()
	src := testetcd.StartT(t, testetcd.Options{})
	cli, err := src.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	history(t, cli)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.db")
	if err := etcdscan.Snapshot(ctx, cli, in); err != nil {
		t.Fatal(err)
	}
	open := func(out string) *snapshotdb.Writer {
		f, err := snapshotdb.Open(in, snapshotdb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		w, err := snapshotdb.NewWriter(ctx, f, out, snapshotdb.WriterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	// The output's directory removed before the build.
	gone := filepath.Join(t.TempDir(), "gone")
	if err := os.Mkdir(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	w := open(filepath.Join(gone, "out.db"))
	os.Remove(gone)
	_, err = w.Finish(ctx, false)
	if err == nil || !strings.Contains(err.Error(), string(input.OutputSnapshot)+" "+filepath.Join(gone, "out.db")) || strings.Contains(err.Error(), "\n") {
		t.Errorf("output directory gone: %v, want one line naming the output", err)
	}

	// The input changed (truncated) between the scan and the build.
	outDir := t.TempDir()
	out := filepath.Join(outDir, "out.db")
	w = open(out)
	fi, _ := os.Stat(in)
	if err := os.Truncate(in, fi.Size()-4096); err != nil {
		t.Fatal(err)
	}
	_, err = w.Finish(ctx, false)
	if err == nil || !strings.Contains(err.Error(), "snapshot file "+in+": changed while it was being read") || strings.Contains(err.Error(), "\n") {
		t.Errorf("input truncated: %v, want one line naming it", err)
	}
	if left, _ := os.ReadDir(outDir); len(left) != 0 {
		t.Errorf("left beside the output: %v", left)
	}
}

// TestNoEtcdServer: snapshot files are read and written with bbolt and
// etcd's encodings alone: no file of the package imports an etcd server.
func TestNoEtcdServer(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var checked int
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		checked++
		file, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, "go.etcd.io/etcd/server/v3/embed") || strings.HasPrefix(p, "go.etcd.io/etcd/server/v3/etcdserver") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d files: want the package's", checked)
	}
}
