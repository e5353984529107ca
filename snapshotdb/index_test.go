package snapshotdb_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/snapshotdb"
)

// TestIndexSpilledMatchesEtcd: a keyspace with a history — keys written in
// transactions of several operations (records that share a main revision),
// rewritten, deleted one by one, by prefix and by a revoked lease, re-created,
// compacted in the middle — is saved as a snapshot file and read with runs of
// the key index so small that it is spilled in dozens of runs, merged a few
// at a time in several rounds. At every revision still readable, every scan
// (the whole keyspace, prefixes, a prefix with no key), Get of keys deleted
// and re-created and Count give what the etcd the file was saved from gives
// at that revision; a revision below the compaction is refused as etcd
// refuses it; a read cancelled while the index is built or read ends with
// the context's error; nothing is left in $TMPDIR, and a $TMPDIR that cannot
// take the index is a one-line error naming the file and the directory.
func TestIndexSpilledMatchesEtcd(t *testing.T) {
	ctx := context.Background()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	key := func(ns, i int) string { return fmt.Sprintf("/registry/configmaps/ns-%d/cm-%03d", ns, i) }
	value := func(round, i int) string {
		return fmt.Sprintf("%d/%d/%s", round, i, bytes.Repeat([]byte{'v'}, (i*37)%300))
	}
	var revs []int64
	mark := func() {
		r, err := srv.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r)
	}
	txn := func(ops ...clientv3.Op) {
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Round 0: 4 namespaces of 100 keys, 10 a transaction; secrets beside.
	for ns := 0; ns < 4; ns++ {
		for i := 0; i < 100; i += 10 {
			var ops []clientv3.Op
			for j := i; j < i+10; j++ {
				ops = append(ops, clientv3.OpPut(key(ns, j), value(0, j)))
			}
			txn(ops...)
		}
	}
	for i := 0; i < 50; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/secrets/s/%02d", i), value(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/events/e/%02d", i), value(0, i), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	mark()
	// Round 1: a third rewritten, twice for some.
	for i := 0; i < 400; i += 3 {
		txn(clientv3.OpPut(key(i%4, i/4), value(1, i)), clientv3.OpPut(key((i+1)%4, i/4), value(1, i+1)))
	}
	mark()
	compacted := revs[len(revs)-1]
	// Round 2: deletes, one by one, in transactions, by prefix; the lease
	// revoked (its keys deleted).
	for i := 0; i < 100; i += 4 {
		if _, err := cli.Delete(ctx, key(0, i)); err != nil {
			t.Fatal(err)
		}
	}
	txn(clientv3.OpDelete(key(1, 5)), clientv3.OpDelete(key(1, 6)), clientv3.OpPut(key(1, 7), value(2, 7)))
	if _, err := cli.Delete(ctx, "/registry/configmaps/ns-2/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	mark()
	if _, err := cli.Compact(ctx, compacted, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	// Round 3: half of what was deleted re-created, more rewrites.
	for i := 0; i < 100; i += 8 {
		if _, err := cli.Put(ctx, key(0, i), value(3, i)); err != nil {
			t.Fatal(err)
		}
	}
	txn(clientv3.OpPut(key(1, 5), value(3, 5)), clientv3.OpPut(key(2, 50), value(3, 50)), clientv3.OpDelete(key(3, 99)))
	for i := 0; i < 100; i += 7 {
		if _, err := cli.Put(ctx, key(3, i), value(3, i)); err != nil {
			t.Fatal(err)
		}
	}
	mark()
	// Round 4: a delete of the newest key as the file's last change.
	if _, err := cli.Delete(ctx, key(3, 0)); err != nil {
		t.Fatal(err)
	}
	mark()

	path := filepath.Join(t.TempDir(), "history.db")
	if err := etcdscan.Snapshot(ctx, cli, path); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	file, err := snapshotdb.Open(path, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	restore := snapshotdb.SetLimits(file, 1500)
	defer restore()
	defer snapshotdb.SetFanIn(4)()
	etcd := etcdscan.ClientSource{Client: cli}

	probe := []string{key(0, 0), key(0, 4), key(0, 8), key(1, 5), key(1, 6), key(1, 7), key(2, 50), key(2, 51), key(3, 0), key(3, 99), "/registry/events/e/03", "/registry/secrets/s/07", "/registry/nothing"}
	prefixes := []string{"", "/registry/configmaps/", "/registry/configmaps/ns-2/", "/registry/configmaps/ns-1/cm-00", "/registry/events/", "/registry/secrets/", "/registry/zzz/"}
	for _, rev := range append([]int64{0}, revs[1:]...) {
		before := snapshotdb.Passes(file)
		for _, p := range prefixes {
			if d := cmp.Diff(scanAll(t, etcd, p, rev), scanAll(t, file, p, rev), ignoreSub); d != "" {
				t.Errorf("revision %d: keys under %q differ (-etcd +file):\n%s", rev, p, d)
			}
		}
		for _, k := range probe {
			wkv, wok, werr := etcd.Get(ctx, k, rev)
			kv, ok, err := file.Get(ctx, k, rev)
			if werr != nil || err != nil || ok != wok || !cmp.Equal(kv, wkv, ignoreSub) {
				t.Errorf("Get(%s, %d) = %v %v %v; etcd %v %v %v", k, rev, kv, ok, err, wkv, wok, werr)
			}
		}
		if n := snapshotdb.Passes(file) - before; n != 1 {
			t.Errorf("revision %d: %d passes over the file for the scans and gets, want 1", rev, n)
		}
	}
	// A scan at an older revision and lookups at the file's own, in turns:
	// one pass for each revision.
	snapshotdb.Forget(file)
	before := snapshotdb.Passes(file)
	for i := 0; i < 2; i++ {
		scanAll(t, file, "/registry/configmaps/", revs[2])
		if _, _, err := file.Get(ctx, key(1, 7), 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := snapshotdb.Passes(file) - before; n != 2 {
		t.Errorf("scans at %d and gets at the file's revision in turns: %d passes, want 2", revs[2], n)
	}
	if n := snapshotdb.Spills(file); n < 30 {
		t.Errorf("%d runs spilled in all: the test does not exercise the merge", n)
	}
	for _, p := range prefixes {
		want, werr := etcd.Count(ctx, p)
		n, err := file.Count(ctx, p)
		if werr != nil || err != nil || n != want {
			t.Errorf("Count(%q) = %d %v; etcd %d %v", p, n, err, want, werr)
		}
	}
	if _, _, err := file.Get(ctx, key(0, 0), revs[0]); !errors.Is(err, mvcc.ErrCompacted) {
		t.Errorf("Get below the compaction (%d < %d): %v, want %v", revs[0], compacted, err, mvcc.ErrCompacted)
	}
	if _, _, err := etcd.Get(ctx, key(0, 0), revs[0]); err == nil {
		t.Errorf("etcd read below the compaction")
	}

	// Cancelled before the index is built (a new revision), and while a
	// scan reads it.
	snapshotdb.Forget(file)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := file.Scan(cctx, etcdscan.ScanOptions{Prefixes: []string{""}}, func([]etcdscan.KV) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("scan with a cancelled context: %v", err)
	}
	cctx, cancel = context.WithCancel(ctx)
	pages := 0
	_, err = file.Scan(cctx, etcdscan.ScanOptions{Prefixes: []string{""}, PageSize: 5}, func([]etcdscan.KV) error {
		pages++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || pages != 1 {
		t.Errorf("scan cancelled in its first page: %v after %d pages", err, pages)
	}
	file.Close()
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in $TMPDIR: %v", left)
	}

	// No room for the index's temporary files: one line naming the file and
	// the directory.
	missing := filepath.Join(tmp, "missing")
	t.Setenv("TMPDIR", missing)
	_, err = file.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{""}}, func([]etcdscan.KV) error { return nil })
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "snapshot file "+path+": ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("scan with $TMPDIR missing: %v; want one line naming %s and %s", err, path, missing)
	}
}

// TestFileReadsOutliveRequestTimeouts: the first read of a file builds its
// key index in a pass over the whole file, which for a backup of etcd's
// largest quota on a slow disk outlasts the timeouts callers give etcd's
// requests: a deadline does not stop a read of the file (even one already
// past), cancellation does.
func TestFileReadsOutliveRequestTimeouts(t *testing.T) {
	ctx := context.Background()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	for i := 0; i < 50; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/configmaps/ns/cm-%02d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	file, _ := saveAndOpen(t, ctx, cli, "backup.db")

	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if n, err := file.Count(expired, "/registry/configmaps/"); err != nil || n != 50 {
		t.Fatalf("count past its deadline: %d %v, want 50 and no error", n, err)
	}
	if _, found, err := file.Get(expired, "/registry/configmaps/ns/cm-07", 0); err != nil || !found {
		t.Fatalf("get past its deadline: %v %v", found, err)
	}
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	if _, err := file.Count(cancelled, "/registry/configmaps/"); !errors.Is(err, context.Canceled) {
		t.Fatalf("count cancelled: %v, want context.Canceled", err)
	}
}
