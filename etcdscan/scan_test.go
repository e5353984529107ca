package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

func startClient(t *testing.T, opts testetcd.Options) (*testetcd.Server, *clientv3.Client) {
	t.Helper()
	s := testetcd.StartT(t, opts)
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return s, c
}

func putKeys(t *testing.T, c *clientv3.Client, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("%s%03d", prefix, i)
		if _, err := c.Put(context.Background(), k, "v-"+k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

// largeValue is the size of putLarge's values: enough of them (80 make
// 51 MB) that etcd 3.7's RangeStream cannot send a scan's whole answer into
// the connection's buffers (gRPC's flow-control windows may grow to 16 MB) before
// the test's first page acts on etcd (a compaction, a restart), so what a
// stream does then is what the test sees.
const largeValue = 640 << 10

// putLarge is putKeys with values of largeValue bytes.
func putLarge(t *testing.T, c *clientv3.Client, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("%s%03d", prefix, i)
		if _, err := c.Put(context.Background(), k, k+strings.Repeat("v", largeValue)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

// streams reports whether an etcd release serves RangeStream (3.7, the
// linked release, and later), which the scan reads through.
func streams(version string) bool { return testetcd.IsLinked(version) }

func TestScanPrefixesInOrder(t *testing.T) {
	_, c := startClient(t, testetcd.Options{})
	a := putKeys(t, c, "/registry/aaa/", 23)
	b := putKeys(t, c, "/registry/bbb/", 31)
	putKeys(t, c, "/registry/ccc/", 5)
	putKeys(t, c, "/registry/aa", 1) // shares the bytes of "/registry/aa" but not the prefix "/registry/aaa/"
	ctx := context.Background()

	var got []string
	var sizes []int
	stats, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/bbb/", "/registry/aaa/"}, PageSize: 7}, func(page []KV) error {
		sizes = append(sizes, len(page))
		for _, kv := range page {
			if string(kv.Value) != "v-"+kv.Key || kv.ModRevision == 0 || kv.CreateRevision == 0 || kv.Version != 1 {
				t.Errorf("%s: bad KV %+v", kv.Key, kv)
			}
			got = append(got, kv.Key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(b), a...)
	if !slices.Equal(got, want) {
		t.Fatalf("scan order:\n got %v\nwant %v", got, want)
	}
	for _, n := range sizes {
		if n > 7 || n == 0 {
			t.Fatalf("page sizes %v, want 1..7", sizes)
		}
	}
	if stats.Keys != int64(len(want)) || stats.Pages != len(sizes) || !stats.Consistent || len(stats.Restarts) != 0 || stats.Revision == 0 || stats.Bytes == 0 {
		t.Fatalf("stats %+v", stats)
	}

	// "" is the whole keyspace.
	var all int
	if _, err := Scan(ctx, c, ScanOptions{Prefixes: []string{""}, PageSize: 10}, func(page []KV) error {
		all += len(page)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if all != 23+31+5+1 {
		t.Fatalf("whole keyspace: %d keys", all)
	}
}

func TestScanPinnedRevision(t *testing.T) { testetcd.Each(t, testScanPinnedRevision) }

func testScanPinnedRevision(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	keys := putKeys(t, c, "/registry/pods/", 40)
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// After R: a new key, a changed key, a deleted key.
	if _, err := c.Put(ctx, "/registry/pods/new", "after"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, keys[5], "changed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, keys[6]); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	stats, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/pods/"}, Revision: rev, PageSize: 6}, func(page []KV) error {
		for _, kv := range page {
			seen[kv.Key] = string(kv.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 40 || seen[keys[5]] != "v-"+keys[5] || seen[keys[6]] == "" || seen["/registry/pods/new"] != "" {
		t.Fatalf("scan at revision %d saw later writes: %d keys, %s=%q, %s=%q", rev, len(seen), keys[5], seen[keys[5]], keys[6], seen[keys[6]])
	}
	if stats.Revision != rev || !stats.Consistent {
		t.Fatalf("stats %+v, want revision %d", stats, rev)
	}

	// Revision 0 pins the revision of the first page: a key written during the
	// scan, after the first page, is not seen.
	seen = map[string]string{}
	stats, err = Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/pods/"}, PageSize: 6}, func(page []KV) error {
		for _, kv := range page {
			seen[kv.Key] = string(kv.Value)
		}
		if _, ok := seen["/registry/pods/zzz"]; !ok && len(seen) == 6 {
			if _, err := c.Put(ctx, "/registry/pods/zzz", "during"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := seen["/registry/pods/zzz"]; ok || len(seen) != 40 || !stats.Consistent {
		t.Fatalf("scan saw a write made after its first page: %d keys, stats %+v", len(seen), stats)
	}
}

func TestScanCompactedMidScan(t *testing.T) { testetcd.Each(t, testScanCompactedMidScan) }

func testScanCompactedMidScan(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	start := append(putLarge(t, c, "/registry/configmaps/", 60), putLarge(t, c, "/registry/secrets/", 30)...)
	count := map[string]int{}
	compacted := false
	stats, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/configmaps/", "/registry/secrets/"}, PageSize: 8}, func(page []KV) error {
		for _, kv := range page {
			count[kv.Key]++
		}
		if !compacted {
			compacted = true
			// Writes after the pinned revision, then compact past it.
			if _, err := c.Put(ctx, "/registry/configmaps/050", "rewritten by someone"); err != nil {
				return err
			}
			if err := writeAndCompact(ctx, s, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("scan through a compaction: %v", err)
	}
	for _, k := range start {
		if count[k] != 1 {
			t.Errorf("%s seen %d times", k, count[k])
		}
	}
	if len(count) != len(start) {
		t.Errorf("saw %d keys, want %d", len(count), len(start))
	}
	if stats.Consistent || len(stats.Restarts) == 0 {
		t.Fatalf("stats %+v: want an inconsistent scan with a restart", stats)
	}
	r := stats.Restarts[0]
	if r.Revision <= stats.Revision || r.AfterKey == "" || !sort.StringsAreSorted([]string{"/registry/configmaps/007", r.AfterKey}) {
		t.Fatalf("restart %+v after pinned revision %d", r, stats.Revision)
	}
	if stats.Keys != int64(len(start)) {
		t.Fatalf("stats.Keys %d, want %d", stats.Keys, len(start))
	}
}

// TestScanKeepRevision: a revision the caller asked for is never left for a
// newer one: its compaction mid-scan is an error naming it.
func TestScanKeepRevision(t *testing.T) { testetcd.Each(t, testScanKeepRevision) }

func testScanKeepRevision(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	keys := putLarge(t, c, "/registry/configmaps/", 80)
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pages := 0
	_, err = Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/configmaps/"}, PageSize: 8, Revision: rev, KeepRevision: true}, func(page []KV) error {
		pages++
		if pages == 1 {
			return writeAndCompact(ctx, s, c)
		}
		return nil
	})
	if !errors.Is(err, rpctypes.ErrCompacted) || !strings.Contains(err.Error(), fmt.Sprintf("at revision %d", rev)) {
		t.Fatalf("scan at a kept revision compacted mid-scan: %v, want a compaction error naming revision %d", err, rev)
	}
	if pages*8 >= len(keys) {
		t.Errorf("all %d pages handed over: the scan did not stop at the compaction", pages)
	}
}

func TestScanStops(t *testing.T) {
	_, c := startClient(t, testetcd.Options{})
	putKeys(t, c, "/registry/pods/", 30)
	stop := errors.New("stop here")
	pages := 0
	_, err := Scan(context.Background(), c, ScanOptions{Prefixes: []string{"/registry/pods/"}, PageSize: 5}, func([]KV) error {
		pages++
		return stop
	})
	if !errors.Is(err, stop) || pages != 1 {
		t.Fatalf("fn error: got %v after %d pages", err, pages)
	}

	ctx, cancel := context.WithCancel(context.Background())
	pages = 0
	_, err = Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/pods/"}, PageSize: 5}, func([]KV) error {
		pages++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || pages != 1 {
		t.Fatalf("cancelled context: got %v after %d pages", err, pages)
	}
}

// TestScanWindowsSeeEveryKeyOnce: the scan narrows its range requests to key
// directories (RangeWalk); whatever the shape of the keyspace it must still
// return every key exactly once, in key order, at the pinned revision, also
// when that revision is compacted in the middle of a narrowed window.
func TestScanWindowsSeeEveryKeyOnce(t *testing.T) { testetcd.Each(t, testScanWindowsSeeEveryKeyOnce) }

func testScanWindowsSeeEveryKeyOnce(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	var keys []string
	put := func(k string) {
		t.Helper()
		if _, err := c.Put(ctx, k, "v-"+k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	put("/registry/compact_rev_key")
	put("/registry/health")
	put("/registry/pods/")        // a key that is itself a directory name
	put("/registry/pods/ns-big/") // and one inside
	for ns := 0; ns < 12; ns++ {
		n := 1 + ns*ns/4 // namespaces from 1 to 31 keys
		for i := 0; i < n; i++ {
			put(fmt.Sprintf("/registry/pods/ns-%02d/p-%02d", ns, i))
		}
	}
	for i := 0; i < 40; i++ {
		put(fmt.Sprintf("/registry/namespaces/n-%02d", i)) // cluster-scoped: no deeper directory
	}
	for i := 0; i < 25; i++ {
		put(fmt.Sprintf("/registry/example.com/widgets/team-%d/w-%02d", i%3, i)) // custom resources
	}
	put("/registry/z\xff\xff/a/b")
	put("/registry\xff")
	put("/registrx/outside")
	slices.Sort(keys)
	var want []string
	for _, k := range keys {
		if k >= "/registry/" && k < "/registry0" {
			want = append(want, k)
		}
	}

	for _, pageSize := range []int64{1, 3, 7, 500} {
		var got []string
		if _, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/"}, PageSize: pageSize}, func(page []KV) error {
			for _, kv := range page {
				if string(kv.Value) != "v-"+kv.Key {
					t.Errorf("page size %d: %q has value %q", pageSize, kv.Key, kv.Value)
				}
				got = append(got, kv.Key)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d: scan returned %d keys, want %d:\n got %q\nwant %q", pageSize, len(got), len(want), got, want)
		}
	}

	// Whole keyspace (no end) with windows.
	if all := scanKeys(t, c, "", 2); !slices.Equal(all, keys) {
		t.Fatalf("whole keyspace: %d keys, want %d", len(all), len(keys))
	}

	// Compaction inside a narrowed window (the pods of ns-11, the 8th page
	// of 4): a walk's (etcd before 3.7). A stream has read these few keys at
	// the pinned revision before the compaction; TestScanCompactedMidScan
	// cuts one.
	if streams(version) {
		return
	}
	count := map[string]int{}
	pages := 0
	stats, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/"}, PageSize: 4}, func(page []KV) error {
		for _, kv := range page {
			count[kv.Key]++
		}
		if pages++; pages == 8 {
			if err := writeAndCompact(ctx, s, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("scan through a compaction: %v", err)
	}
	if stats.Consistent || len(count) != len(want) {
		t.Fatalf("after a compaction: %d keys (want %d), stats %+v", len(count), len(want), stats)
	}
	for k, n := range count {
		if n != 1 {
			t.Errorf("%s seen %d times", k, n)
		}
	}
}

// TestScanCountsFewKeys: etcd answers a range request with a limit by
// counting every key of its range, so a scan that paged through a flat
// directory of n keys made etcd visit about n²/(2 × page) keys (at 4,000,000
// objects, half of etcd's CPU during a migrate). On etcd 3.7 the scan reads
// one RangeStream, which counts nothing; before 3.7 (RangeStream refused) the
// walk's look ahead bounds each page: what etcd counts over the whole scan
// (each answer's Count, which is what it visited) stays a small multiple of
// the keys read.
func TestScanCountsFewKeys(t *testing.T) { testetcd.Each(t, testScanCountsFewKeys) }

func testScanCountsFewKeys(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	var want []string
	put := func(keys ...string) {
		t.Helper()
		for len(keys) > 0 {
			var ops []clientv3.Op
			for _, k := range keys[:min(100, len(keys))] {
				ops = append(ops, clientv3.OpPut(k, "v-"+k))
			}
			if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			want = append(want, keys[:len(ops)]...)
			keys = keys[len(ops):]
		}
	}
	var keys []string
	for i := 0; i < 3000; i++ { // one large namespace
		keys = append(keys, fmt.Sprintf("/registry/events/big/e-%05d", i))
	}
	for i := 0; i < 30; i++ {
		keys = append(keys, fmt.Sprintf("/registry/events/small/e-%05d", i))
	}
	for i := 0; i < 700; i++ { // cluster-scoped
		keys = append(keys, fmt.Sprintf("/registry/namespaces/n-%05d", i))
	}
	for i := 0; i < 1500; i++ { // many small namespaces
		keys = append(keys, fmt.Sprintf("/registry/secrets/ns-%03d/s-%05d", i%300, i))
	}
	put(keys...)
	slices.Sort(want)
	counting := &countingKV{KV: c.KV}
	c.KV = counting
	got, stats := scanKeysStats(t, c, ScanOptions{Prefixes: []string{"/registry/"}, PageSize: 10})
	if !slices.Equal(got, want) {
		t.Fatalf("scan returned %d keys, want %d", len(got), len(want))
	}
	n := int64(len(want))
	// Without the look ahead: 3,000²/20 + 700²/20 + 300 × 1,500/2 + ... = 700,000.
	if counting.counted > 6*n {
		t.Errorf("etcd counted %d keys over %d requests to return %d (at most %d wanted)", counting.counted, counting.requests, n, 6*n)
	}
	// etcd 3.7 streams the range, counting nothing: one request to pin the
	// revision, one stream. Before 3.7: one stream refused, then the walk.
	if streams(version) && (stats.Streams != 1 || counting.requests > 1) {
		t.Errorf("etcd %s serves RangeStream: the scan made %d range requests and %d streams, want 1 and 1", version, counting.requests, stats.Streams)
	}
	if !streams(version) && stats.Streams != 1 {
		t.Errorf("etcd %s has no RangeStream: the scan asked for %d streams, want 1", version, stats.Streams)
	}
	t.Logf("etcd counted %d keys over %d range requests and %d streams to return %d", counting.counted, counting.requests, stats.Streams, n)
}

// TestScanRefusesLargeChunks: etcd 3.7 sizes a stream's chunks by a key
// limit learnt from the chunks before, so after many small keys (node
// leases) a chunk of large values (the nodes) holds thousands of them. The
// scan refuses a chunk above MaxChunkBytes before reading it, pages the
// next keys, streams again, and still reads every key once, in order, at
// one revision.
func TestScanRefusesLargeChunks(t *testing.T) {
	_, c := startClient(t, testetcd.Options{})
	ctx := context.Background()
	var want []string
	put := func(prefix string, n, size int) {
		t.Helper()
		var ops []clientv3.Op
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("%s%05d", prefix, i)
			ops = append(ops, clientv3.OpPut(k, strings.Repeat("v", size)))
			want = append(want, k)
			if len(ops) == 50 || i == n-1 {
				if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
					t.Fatal(err)
				}
				ops = ops[:0]
			}
		}
	}
	put("/registry/leases/kube-node-lease/n-", 5000, 400)
	put("/registry/minions/n-", 1000, 20<<10) // 20 MB
	put("/registry/pods/ns/p-", 40000, 100)   // past the keys paged after a large chunk
	const limit = 4 << 20
	var largest int
	var keys []string
	stats, err := Scan(ctx, c, ScanOptions{Prefixes: []string{"/registry/"}, MaxChunkBytes: limit}, func(page []KV) error {
		size := 0
		for _, kv := range page {
			keys = append(keys, kv.Key)
			size += len(kv.Key) + len(kv.Value)
		}
		largest = max(largest, size)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("scan returned %d keys, want %d in order", len(keys), len(want))
	}
	if !stats.Consistent {
		t.Errorf("the scan restarted: %+v", stats.Restarts)
	}
	// The nodes' chunk (about 900 of them, 18 MB) is refused; the scan
	// pages on and, past the nodes, streams the pods.
	if stats.LargeChunks == 0 || stats.Streams < 2 {
		t.Errorf("%d streams, %d of them ended at a chunk above %d bytes: want the nodes' chunk refused and a stream after it", stats.Streams, stats.LargeChunks, limit)
	}
	t.Logf("%d streams, %d large chunks refused, %d pages, the largest %d bytes", stats.Streams, stats.LargeChunks, stats.Pages, largest)
}

// scanKeysStats is every key Scan returns with opts, in order, and its stats.
func scanKeysStats(t *testing.T, c *clientv3.Client, opts ScanOptions) ([]string, ScanStats) {
	t.Helper()
	var keys []string
	stats, err := Scan(context.Background(), c, opts, func(page []KV) error {
		for _, kv := range page {
			keys = append(keys, kv.Key)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys, stats
}

// scanKeys is every key Scan returns under prefix, in order.
func scanKeys(t *testing.T, c *clientv3.Client, prefix string, pageSize int64) []string {
	t.Helper()
	keys, _ := scanKeysStats(t, c, ScanOptions{Prefixes: []string{prefix}, PageSize: pageSize})
	return keys
}

// countingKV adds up the Count of every range answer: the keys etcd visited
// (a stream's chunks count none, and do not come through it: ScanStats
// counts the streams).
type countingKV struct {
	clientv3.KV
	counted, requests int64
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.counted += resp.Count
		k.requests++
	}
	return resp, err
}

func TestKeyDirs(t *testing.T) {
	for _, tc := range []struct {
		prefix, first, last, end string
		want                     []string
	}{
		{"/registry/", "/registry/pods/default/a", "/registry/pods/default/z", "/registry0", []string{"/registry/pods0", "/registry/pods/default0"}},
		{"/registry/", "/registry/pods/default/a", "/registry/pods/default/z", "/registry/pods0", []string{"/registry/pods/default0"}},
		{"/registry/", "/registry/pods/default/a", "/registry/pods/kube-system/a", "/registry0", []string{"/registry/pods0"}},
		{"/registry/", "/registry/pods/default/a", "/registry/pods/kube-system/a", "/registry/pods0", nil},       // already that narrow
		{"/registry/", "/registry/pods/a", "/registry/secrets/a", "/registry0", nil},                             // two resources
		{"/registry/", "/registry/namespaces/a", "/registry/namespaces/z", "/registry/namespaces0", nil},         // cluster-scoped
		{"/registry/", "/registry/pods/", "/registry/pods/default/a", "/registry0", []string{"/registry/pods0"}}, // a key named as its directory
		{"", "/registry/pods/a", "/registry/secrets/a", "\x00", []string{"0", "/registry0"}},                     // the whole keyspace
		{"/registry", "/registry/pods/a", "/registry/secrets/b", "/registrz", []string{"/registry0"}},
		{"/r/", "/r/\xff\xff/a", "/r/\xff\xff/b", "/r0", []string{"/r/\xff\xff0"}},
		{"/r/", "/r/\xff/a", "/r/\xff/b", "/r/\xff0", nil},
	} {
		if got := keyDirs(tc.prefix, tc.first, tc.last, tc.end); !slices.Equal(got, tc.want) {
			t.Errorf("keyDirs(%q, %q, %q, %q) = %q, want %q", tc.prefix, tc.first, tc.last, tc.end, got, tc.want)
		}
	}
}

// writeAndCompact moves the revision on with a write outside the scanned
// prefixes and compacts etcd up to it, as a compaction during a scan would.
func writeAndCompact(ctx context.Context, s *testetcd.Server, c *clientv3.Client) error {
	if _, err := c.Put(ctx, "/unrelated", "x"); err != nil {
		return err
	}
	rev, err := s.Revision(ctx)
	if err != nil {
		return err
	}
	_, err = c.Compact(ctx, rev)
	return err
}

// TestRangeWalkCountsAtScale walks keyspaces too large for a test's etcd
// through etcd's own rule for a limited range request (it returns at most
// the limit and counts every key of [key, end)), as the scan's producer
// drives the walk: every key read once, in order, and what etcd would count
// a small multiple of the keys, for a few large namespaces per resource (the
// production benchmark's shape) and for many small ones (a cluster's usual
// shape, where going back to the resource's whole range after each
// namespace cost a count of its rest each time: 1,000 keys counted a key).
func TestRangeWalkCountsAtScale(t *testing.T) {
	resources := []struct {
		name  string
		share int // of 100
	}{{"secrets", 30}, {"configmaps", 15}, {"pods", 20}, {"deployments", 10}, {"events", 15}, {"example.com/widgets", 8}}
	var large []string
	for i := 0; i < 400000; i++ {
		b, r := i%100, 0
		for ; r < len(resources)-1 && b >= resources[r].share; r++ {
			b -= resources[r].share
		}
		large = append(large, fmt.Sprintf("/registry/%s/ns-%02d/o-%d", resources[r].name, i%20, i))
	}
	for i := 0; i < 8000; i++ {
		large = append(large, fmt.Sprintf("/registry/deviceclasses/dc-%d", i))
	}
	var small []string
	for i := 0; i < 400000; i++ {
		small = append(small, fmt.Sprintf("/registry/secrets/ns-%05d/s-%d", i%10000, i))
	}
	for _, tc := range []struct {
		name     string
		keys     []string
		pageSize int64
	}{{"large namespaces", large, 500}, {"small namespaces", small, 500}, {"small pages", small, 7}} {
		keys := slices.Clone(tc.keys)
		slices.Sort(keys)
		w := NewRangeWalk("/registry/", tc.pageSize)
		var counted, read int64
		for {
			key, end, limit, keysOnly := w.Range()
			lo, _ := slices.BinarySearch(keys, key)
			hi, _ := slices.BinarySearch(keys, end)
			n := min(hi-lo, int(limit))
			counted += int64(hi - lo)
			if keysOnly {
				kvs := make([]*mvccpb.KeyValue, n)
				for i := range kvs {
					kvs[i] = &mvccpb.KeyValue{Key: []byte(keys[lo+i])}
				}
				w.Ahead(kvs, n < hi-lo)
				continue
			}
			for i := lo; i < lo+n; i++ {
				if keys[i] != keys[read] {
					t.Fatalf("%s: read %q as key %d, want %q", tc.name, keys[i], read, keys[read])
				}
				read++
			}
			last := ""
			if n > 0 {
				last = keys[lo+n-1]
			}
			if !w.Next(last, n, n < hi-lo, int64(hi-lo)) {
				break
			}
		}
		if read != int64(len(keys)) {
			t.Fatalf("%s: read %d keys of %d", tc.name, read, len(keys))
		}
		if per := float64(counted) / float64(len(keys)); per > 12 {
			t.Errorf("%s: etcd would count %d keys, %.1f a key read (at most 12 wanted)", tc.name, counted, per)
		} else {
			t.Logf("%s: etcd would count %d keys, %.1f a key read", tc.name, counted, per)
		}
	}
}
