package etcdscan

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestMetrics: what a member reports of its own costs, read from its
// /metrics as plan reads it: the writes it applied and their apply time,
// its WAL fsyncs and backend commits, a compaction and a snapshot, its
// quota, sizes and keys, and its ID.
func TestMetrics(t *testing.T) { testetcd.Each(t, testMetrics) }

func testMetrics(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version, QuotaBackendBytes: 64 << 20})
	ctx := context.Background()
	before, err := Metrics(ctx, c)
	if err != nil || len(before) != 1 {
		t.Fatalf("metrics: %+v %v", before, err)
	}
	// 100 keys written twice by compare-and-swap, as kube-apiserver and
	// migrate write: 200 writes, 100 old revisions to compact.
	var rev int64
	for i := range 200 {
		k := fmt.Sprintf("/registry/metrics/%03d", i%100)
		var mod int64
		if i >= 100 {
			g, err := c.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			mod = g.Kvs[0].ModRevision
		}
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", mod)).Then(clientv3.OpPut(k, strings.Repeat("v", 1000))).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("txn %s: %v", k, err)
		}
		rev = resp.Header.Revision
	}
	if err := Compact(ctx, c, rev); err != nil {
		t.Fatal(err)
	}
	// The whole snapshot, streamed and dropped; then only its first 4 KiB.
	st, err := Status(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if n, el, err := SnapshotSample(ctx, c, 1<<30); err != nil || n < st.DBSize || el <= 0 {
		t.Fatalf("snapshot sample of a %d-byte database: %d bytes in %v, %v", st.DBSize, n, el, err)
	}
	if n, _, err := SnapshotSample(ctx, c, 4096); err != nil || n != 4096 {
		t.Fatalf("snapshot sample cut at 4 KiB: %d bytes, %v", n, err)
	}
	after, err := Metrics(ctx, c)
	if err != nil || len(after) != 1 {
		t.Fatalf("metrics: %+v %v", after, err)
	}
	a, b := before[0], after[0]
	list, err := c.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// (An embedded member's process also serves the IDs of the members
	// embedded before it in the same process: then ID is 0, ids holds them.)
	if !slices.Contains(b.ids, list.Members[0].ID) || (b.ID != 0 && b.ID != list.Members[0].ID) || !strings.HasSuffix(b.URL, "/metrics") {
		t.Errorf("member %x (of %x) at %s, want %x", b.ID, b.ids, b.URL, list.Members[0].ID)
	}
	if b.QuotaBytes != 64<<20 || b.DBSize <= 0 || b.DBSizeInUse <= 0 || b.DBSizeInUse > b.DBSize || b.Keys < 100 {
		t.Errorf("quota %d, database %d (%d in use), %d keys", b.QuotaBytes, b.DBSize, b.DBSizeInUse, b.Keys)
	}
	// Counters since the process started (an embedded member shares them
	// with the test's other members): what this test did is in the deltas.
	if b.Writes-a.Writes < 200 || b.Apply.Count-a.Apply.Count < 200 || b.Apply.Sum <= a.Apply.Sum {
		t.Errorf("writes %d -> %d, applies %d -> %d (%.6fs -> %.6fs): want the 200 writes", a.Writes, b.Writes, a.Apply.Count, b.Apply.Count, a.Apply.Sum, b.Apply.Sum)
	}
	if b.WALFsync.Count <= a.WALFsync.Count || b.WALFsync.Mean() <= 0 {
		t.Errorf("WAL fsyncs %d -> %d, mean %v", a.WALFsync.Count, b.WALFsync.Count, b.WALFsync.Mean())
	}
	if b.BackendCommit.Count == 0 || b.BackendCommit.Mean() <= 0 {
		t.Errorf("backend commits %d, mean %v", b.BackendCommit.Count, b.BackendCommit.Mean())
	}
	// (A compaction of 100 revisions takes less than etcd's millisecond unit.)
	if b.Compaction.Count <= a.Compaction.Count || b.CompactionPause.Count == 0 || b.Compacted < a.Compacted+100 {
		t.Errorf("compactions %d -> %d (mean %v), pauses %d, %d revisions compacted", a.Compaction.Count, b.Compaction.Count, b.Compaction.Mean(), b.CompactionPause.Count, b.Compacted)
	}
	if b.Snapshot.Count < a.Snapshot.Count+1 {
		t.Errorf("snapshots %d -> %d, want the samples'", a.Snapshot.Count, b.Snapshot.Count)
	}
	// A quantile is a bucket's upper bound: the median no more than the 99th.
	if p50, p99 := b.WALFsync.Quantile(0.5), b.WALFsync.Quantile(0.99); p50 <= 0 || p99 < p50 {
		t.Errorf("WAL fsync quantiles: median %v, 99th %v", p50, p99)
	}
}

// TestMetricsFallback: a member whose client URL does not serve its metrics
// is read where kubeadm's etcd also serves them (--listen-metrics-urls) —
// only when that endpoint says it is the same member.
func TestMetricsFallback(t *testing.T) {
	s, c := startClient(t, testetcd.Options{})
	ctx := context.Background()
	list, err := c.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := list.Members[0].ID
	// A closed port for its client URL; its own listener as the fallback.
	m := member{name: "m", id: id, urls: []string{"http://127.0.0.1:1"}}
	mm, err := metricsOf(ctx, configOf(c), m, []string{s.URL})
	if err != nil || mm.ID != id || mm.URL != s.URL+"/metrics" || mm.QuotaBytes <= 0 {
		t.Fatalf("fallback: %+v %v", mm, err)
	}
	// The fallback answering for another member is not taken for it.
	m.id = id + 1
	if _, err := metricsOf(ctx, configOf(c), m, []string{s.URL}); err == nil || !strings.Contains(err.Error(), "another member's") || !strings.Contains(err.Error(), fmt.Sprintf("%x", id)) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("another member's metrics: %v", err)
	}
}
