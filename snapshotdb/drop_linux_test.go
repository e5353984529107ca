package snapshotdb_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/snapshotdb"
)

// mappedRSS is the resident memory of the process's mappings of path: the
// sum of their Rss in /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's first line
			in = strings.HasSuffix(line, " "+path)
			continue
		}
		if in && fields[0] == "Rss:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("smaps: %q: %v", line, err)
			}
			n += kb << 10
		}
	}
	return n
}

// sameBytes compares values with bytes.Equal: cmp walks a []byte an element
// at a time, which for a keyspace of KBs of values takes many seconds.
var sameBytes = cmp.Comparer(bytes.Equal)

// TestRegionDropsMatchEtcd: the regions of the file's mapping that records
// read out of order map (dropRegions, with madvise) are dropped as a scan
// goes, and what is read stays what etcd gives. A keyspace of 4000 keys with
// values of 1.5-6 KB, written in a shuffled order (so that the records, in
// revision order, come out of key order), a third rewritten and an eighth
// deleted in shuffled orders, some re-created, is saved as a file of some
// 25 MB. Read with regions of 4 KiB, dropped two at a time, every key with
// its value, revisions, version and lease at each revision, and single keys,
// are etcd's byte for byte, while from one region for two records read to
// three for one are dropped. Read with the regions of production (2 MB, two
// at a time) and the whole mapping never dropped (mappedBytes), a scan of the
// whole keyspace reads etcd's keys and keeps at most three regions of the file
// resident, and half the time less than half a region, each region dropped
// on its own (never the whole mapping, what a drop that fails falls back to),
// where the same scan with no region dropped maps most of the file.
func TestRegionDropsMatchEtcd(t *testing.T) {
	ctx := context.Background()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	const n = 4000
	rng := rand.New(rand.NewPCG(28, 2))
	key := func(i int) string { return fmt.Sprintf("/registry/configmaps/ns-%d/cm-%04d", i%5, i) }
	value := func(round, i int) string {
		b := make([]byte, 1500+(i*7919+round*131)%4500)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		return fmt.Sprintf("%d/%d/", round, i) + string(b)
	}
	var revs []int64
	mark := func() {
		r, err := srv.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r)
	}
	// ops runs the operations in transactions of 40.
	ops := func(all []clientv3.Op) {
		for len(all) > 0 {
			m := min(40, len(all))
			if _, err := cli.Txn(ctx).Then(all[:m]...).Commit(); err != nil {
				t.Fatal(err)
			}
			all = all[m:]
		}
	}
	// Round 0: every key, in a shuffled order.
	var all []clientv3.Op
	for _, i := range rng.Perm(n) {
		all = append(all, clientv3.OpPut(key(i), value(0, i)))
	}
	ops(all)
	mark()
	// Round 1: a third rewritten, in another shuffled order.
	all = all[:0]
	for _, i := range rng.Perm(n)[:n/3] {
		all = append(all, clientv3.OpPut(key(i), value(1, i)))
	}
	ops(all)
	mark()
	// Round 2: an eighth deleted, a quarter of those re-created.
	all = all[:0]
	deleted := rng.Perm(n)[:n/8]
	for _, i := range deleted {
		all = append(all, clientv3.OpDelete(key(i)))
	}
	for _, i := range deleted[:len(deleted)/4] {
		all = append(all, clientv3.OpPut(key(i), value(2, i)))
	}
	ops(all)
	mark()

	file, path := saveAndOpen(t, ctx, cli, "shuffled.db")
	etcd := etcdscan.ClientSource{Client: cli}

	// The records come out of key order: read in key order, their
	// revisions go back often.
	back, prev := 0, int64(0)
	if err := file.EachRevision(ctx, func(main, _ int64) error {
		if main < prev {
			back++
		}
		prev = main
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if back < n/4 {
		t.Fatalf("read in key order, the records' revision goes back %d times: the records are in key order, the test reads nothing out of order", back)
	}

	// Regions of 4 KiB, dropped two at a time.
	restore := snapshotdb.SetRegions(file, 12, 2, 0)
	probe := []string{key(deleted[0]), key(deleted[len(deleted)-1]), key(0), key(n - 1), "/registry/configmaps/ns-9/none"}
	for _, rev := range []int64{revs[0], revs[1], 0} { // 0: the file's, revs[2]
		before := snapshotdb.Drops(file)
		want, got := scanAll(t, etcd, "", rev), scanAll(t, file, "", rev)
		if d := cmp.Diff(want, got, ignoreSub, sameBytes); d != "" {
			t.Errorf("revision %d, regions of 4 KiB: keys differ (-etcd +file):\n%s", rev, d)
		}
		// Each record read maps one to two regions of its own (values of
		// 1.5-6 KB), each dropped once (or with the whole mapping, every 4 MB).
		drops := snapshotdb.Drops(file) - before
		if keys := int64(len(got)); drops < keys/2 || drops > 3*keys {
			t.Errorf("revision %d, regions of 4 KiB: %d regions dropped for %d records read, want from %d to %d", rev, drops, keys, keys/2, 3*keys)
		}
		for _, k := range probe {
			wkv, wok, werr := etcd.Get(ctx, k, rev)
			kv, ok, err := file.Get(ctx, k, rev)
			if werr != nil || err != nil || ok != wok || !cmp.Equal(kv, wkv, ignoreSub, sameBytes) {
				t.Errorf("Get(%s, %d) = %v %v %v; etcd %v %v %v", k, rev, kv.Key, ok, err, wkv.Key, wok, werr)
			}
		}
	}
	restore()

	// The regions of production, the mapping itself never dropped: what a
	// scan keeps resident is the regions not dropped yet — at most two and
	// the one being read, and the B+tree's branch pages; between records,
	// most of the time, what the last record read faulted in of its region
	// (64 KiB around it, or its folio), far less than the region. (Measured
	// on Linux 6.18, ext4: 0.4 MB half the time, 0.6 MB at most; 3 MB half
	// the time when the region after the one read is dropped instead: the
	// median's bound is a whole region, for kernels that map more per fault.)
	const region = 2 << 20
	bound := int64(3*region + 1<<20)
	if file.Info.Size < 3*bound {
		t.Fatalf("the file has %d bytes: too small to tell %d bytes mapped from all of it", file.Info.Size, bound)
	}
	resident := func(regions int) (peak, median, drops, releases int64) {
		t.Helper()
		defer snapshotdb.SetRegions(file, 21, regions, 1<<40)()
		// The index is built in a pass of its own (one mapping, closed),
		// then the scan reads the records through a new one.
		if _, err := file.Count(ctx, ""); err != nil {
			t.Fatal(err)
		}
		before, released := snapshotdb.Drops(file), snapshotdb.Releases(file)
		var got []etcdscan.KV
		var samples []int64
		_, err := file.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{""}, PageSize: 20}, func(page []etcdscan.KV) error {
			got = append(got, page...)
			samples = append(samples, mappedRSS(t, path))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(scanAll(t, etcd, "", 0), got, ignoreSub, sameBytes); d != "" {
			t.Errorf("regions of 2 MB, %d at a time: keys differ (-etcd +file):\n%s", regions, d)
		}
		slices.Sort(samples)
		return samples[len(samples)-1], samples[len(samples)/2], snapshotdb.Drops(file) - before, snapshotdb.Releases(file) - released
	}
	peak, median, drops, releases := resident(2)
	if peak > bound || median > region || drops == 0 || releases != 0 {
		t.Errorf("regions of 2 MB dropped two at a time: %d bytes of the file's mapping resident at most (want at most %d), %d half the time (want at most %d), %d regions dropped, the whole mapping %d times (want none: a region that cannot be dropped drops the whole mapping)",
			peak, bound, median, region, drops, releases)
	}
	kept, _, none, _ := resident(1 << 30)
	if kept < file.Info.Size/2 || none != 0 {
		t.Errorf("no region dropped: %d bytes of the %d of the file resident at most, %d regions dropped: the measure does not see the mapping", kept, file.Info.Size, none)
	}
	t.Logf("file of %d bytes: resident %d bytes at most, %d half the time with regions dropped (%d drops); %d at most without", file.Info.Size, peak, median, drops, kept)
}
