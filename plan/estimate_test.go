package plan

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/reencode"
)

// etcdCostsFromRealEtcd writes n compare-and-swap writes of 1 KB into a real
// etcd, compacts once, and returns what the estimate reads of its metrics.
func etcdCostsFromRealEtcd(t *testing.T, n int) *EtcdCosts {
	t.Helper()
	srv := testetcd.StartT(t, testetcd.Options{QuotaBackendBytes: 64 << 20})
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var rev int64
	for i := range n {
		k := fmt.Sprintf("/registry/secrets/ns/s-%04d", i%(n/2))
		g, err := c.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		var mod int64
		if len(g.Kvs) > 0 {
			mod = g.Kvs[0].ModRevision
		}
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", mod)).Then(clientv3.OpPut(k, strings.Repeat("x", 1000))).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("txn %s: %v", k, err)
		}
		rev = resp.Header.Revision
	}
	if err := etcdscan.Compact(ctx, c, rev); err != nil {
		t.Fatal(err)
	}
	ms, err := etcdscan.Metrics(ctx, c)
	costs := etcdCostsOf(ms, err)
	if costs == nil || costs.Error != "" || costs.ApplyPerWrite <= 0 || costs.WALFsync <= 0 || costs.Keys < int64(n/2) || costs.Metrics != srv.URL+"/metrics" {
		t.Fatalf("etcd's costs from its metrics: %+v (%v)", costs, err)
	}
	return costs
}

// baseCosts are a run's costs as plan measures them, with etcd's as read.
func baseCosts(etcd *EtcdCosts) costs {
	return costs{cores: 2, setup: 0.4, checks: 0.1, decideWall: 2, decideCPU: 3, scanned: 100000, stale: 30000,
		sizes:  guard.WriteSizes{EtcdBytes: 30000 * 2500, JournalBytes: 30000 * 3300, RollbackBytes: 30000 * 2400},
		window: 15, journal: true, snapshot: true, dbSize: 400 << 20, free: 0, quota: 8 << 30,
		journalWrite: 12e-6, journalRead: 20e-6, snapshotRate: 300 << 20, hashRate: 1 << 30, etcd: etcd}
}

// TestEstimateParts: the range is its parts put together as the run goes
// (setup, then the longer of the window and the checks and the snapshot,
// the decisions and writes, the compactions' waits, the end), from the
// costs etcd reports in its metrics.
func TestEstimateParts(t *testing.T) {
	etcd := etcdCostsFromRealEtcd(t, 400)
	c := baseCosts(etcd)
	e := estimate(c)
	var names []string
	for _, p := range e.Parts {
		names = append(names, p.Name)
		if p.Low < 0 || p.High < p.Low {
			t.Errorf("part %s: %v–%v", p.Name, p.Low, p.High)
		}
	}
	if got := strings.Join(names, ","); got != "setup,snapshot,decisions and writes,compactions,end" {
		t.Fatalf("parts %s", got)
	}
	part := func(name string) EstimatePart {
		for _, p := range e.Parts {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no part %s", name)
		return EstimatePart{}
	}
	sum := func(high bool) float64 {
		pick := func(p EstimatePart) float64 {
			if high {
				return p.High
			}
			return p.Low
		}
		return pick(part("setup")) + max(c.window, c.checks+pick(part("snapshot"))) + pick(part("decisions and writes")) + pick(part("compactions")) + pick(part("end"))
	}
	if !near(e.Low, sum(false)) || !near(e.High, sum(true)) || e.Low > e.Seconds || e.Seconds > e.High {
		t.Fatalf("range %.2f–%.2f (%.2f), parts say %.2f–%.2f", e.Low, e.High, e.Seconds, sum(false), sum(true))
	}
	// The window is longer than the snapshot here: the run waits for it.
	if e.Low < c.setup+c.window || e.LivenessSeconds != 15 {
		t.Errorf("low %.2f with a 15 s window", e.Low)
	}
	// The writes cannot go faster than etcd applies them, one at a time;
	// the decision (2 s) is made while the 15 s window runs, held on disk.
	if b := part("decisions and writes"); b.Low < float64(c.stale)*etcd.ApplyPerWrite {
		t.Errorf("decisions and writes %.2f: below %d applies of %.1f µs", b.Low, c.stale, etcd.ApplyPerWrite*1e6)
	}
	// A decision longer than the wait goes on after it: what is left of it
	// at best, twice what is left at half its speed at worst.
	long := c
	long.decideWall, long.decideCPU = 40, 60
	if b := estimate(long).Parts[2]; !near(b.Low, 40-(15-c.checks)) || b.High < 1.25*(40-(15-c.checks)/2) {
		t.Errorf("a 40 s decision beside a 15 s window: decisions and writes %.2f–%.2f", b.Low, b.High)
	}
	// The spool and the backlog hold at most guard.SpoolMax+guard.BacklogMax
	// (1.25 GiB): of the decisions of a rewrite of 8 GiB (old and new
	// values), 5/32 are held while the window runs.
	big := c
	big.sizes.EtcdBytes = 4 << 30
	if b := estimate(big).Parts[2]; b.Low < 0.84*c.decideWall || !strings.Contains(b.Basis, "16–16% of them while the first write waits") {
		t.Errorf("a 4 GiB rewrite decided in %.0fs: decisions and writes %.2f–%.2f (%s), want the 5/32 the spool and the backlog hold", c.decideWall, b.Low, b.High, b.Basis)
	}
	// Without an undo nothing is held: the whole decision is after the wait.
	noUndo := c
	noUndo.journal, noUndo.snapshot = false, false
	if b := estimate(noUndo).Parts[2]; b.Low < c.decideWall {
		t.Errorf("no undo: decisions and writes %.2f, below the decision's %.1fs", b.Low, c.decideWall)
	}
	if e.Compactions != [2]int{} || part("compactions").High != 0 {
		t.Errorf("compactions %v without --compact-history", e.Compactions)
	}
	if e.Etcd != etcd || !strings.Contains(part("decisions and writes").Basis, fmt.Sprintf("its applies take %.0f µs a write", etcd.ApplyPerWrite*1e6)) {
		t.Errorf("the estimate does not say etcd's apply time: %s", part("decisions and writes").Basis)
	}

	// The journal's fsyncs one after another, each shared by the batches in
	// flight at best and one a batch at worst: at least etcd's median fsync,
	// when its mean is raised by large ones.
	slow := c
	slowEtcd := *etcd
	slowEtcd.WALFsync, slowEtcd.WALFsyncMedian, slowEtcd.ApplyPerWrite = 0.064, 0.032, 10e-6
	slow.etcd, slow.decideWall, slow.decideCPU = &slowEtcd, 0, 0
	if b := estimate(slow).Parts[2]; !approx(b.Low, math.Ceil(math.Ceil(float64(c.stale)/batchPuts)/writersInFlight)*0.032) || !approx(b.High, 2*math.Ceil(float64(c.stale)/batchPuts)*0.064) {
		t.Errorf("journal fsyncs of 32 ms (median) to 64 ms (mean): decisions and writes %.2f–%.2f", b.Low, b.High)
	}

	// More to rewrite takes longer, at both ends.
	more := c
	more.stale, more.sizes.EtcdBytes = 3*c.stale, 3*c.sizes.EtcdBytes
	if m := estimate(more); m.Low <= e.Low || m.High <= e.High {
		t.Errorf("3 × the rewrites: %.2f–%.2f, against %.2f–%.2f", m.Low, m.High, e.Low, e.High)
	}
	// Without a window (--allow-live-apiserver) nothing waits for one.
	nw := c
	nw.window = 0
	if n := estimate(nw); n.Low >= e.Low || n.LivenessSeconds != 0 || !strings.Contains(n.Basis, "no liveness window") {
		t.Errorf("without the window: %.2f against %.2f (%s)", n.Low, e.Low, n.Basis)
	}
	// migrate's own decision pass (the room does not hold the live data)
	// is counted before its first write.
	sp := nw
	sp.sizingPass = true
	if s := estimate(sp); !near(s.Low-estimate(nw).Low, c.decideWall) {
		t.Errorf("a sizing pass adds %.2f, want the decision's %.2f", s.Low-estimate(nw).Low, c.decideWall)
	}
	// Without an undo: no snapshot, no journal, nothing to hash at the end.
	nu := nw
	nu.journal, nu.snapshot = false, false
	if n := estimate(nu); n.High >= estimate(nw).High || n.Parts[1].High != 0 || n.Parts[4].High != 0 {
		t.Errorf("without an undo: %.2f–%.2f, snapshot %v, end %v", n.Low, n.High, n.Parts[1], n.Parts[4])
	}
	// No metrics: the benchmark machine's costs are assumed, and said.
	nm := c
	nm.etcd = nil
	if n := estimate(nm); n.High <= 0 || n.Etcd != nil {
		t.Errorf("without etcd's metrics: %+v", n)
	}
}

// TestEstimateCompactions: with --compact-history the space guard's
// compactions are counted as it makes them, and, near the quota, the time
// the writes wait for them; the compaction's time comes from etcd's own
// compactions (its metrics), or from its walk of the revisions when it made none.
func TestEstimateCompactions(t *testing.T) {
	etcd := etcdCostsFromRealEtcd(t, 400)
	c := baseCosts(etcd)
	c.compact = true
	// Far from the quota: a compaction every half margin written, in the
	// background, and nothing waits.
	far := estimate(c)
	every := float64(guard.Margin(c.quota) / 2)
	want := int(float64(c.sizes.EtcdBytes) / every)
	if far.Compactions[0] < want || far.Compactions[1] > want+1 || far.Parts[3].High != 0 {
		t.Errorf("far from the quota: %v compactions (want about %d), waits %v", far.Compactions, want, far.Parts[3])
	}
	if !strings.Contains(far.Parts[3].Basis, "etcd's own compactions' pauses") && !strings.Contains(far.Parts[3].Basis, "etcd's backend commits") {
		t.Errorf("the compactions' time does not come from etcd's: %s", far.Parts[3].Basis)
	}
	// Near it (86 % full, as the production benchmark): the room below the
	// margin is used up part-way, and the writes wait for compactions.
	full := c
	full.quota = 1 << 30
	full.dbSize = full.quota * 86 / 100
	full.sizes = guard.WriteSizes{EtcdBytes: 300 << 20, JournalBytes: 400 << 20, RollbackBytes: 290 << 20}
	// A keyspace of 4,000,000 keys: each compaction walks them all.
	big := *etcd
	big.Keys = 4000000
	full.etcd = &big
	n := estimate(full)
	if n.Compactions[0] < 1 || n.Parts[3].Low <= 0 || n.Parts[3].High < n.Parts[3].Low || n.High <= far.High {
		t.Errorf("near the quota: %v compactions, waits %v; range %.1f–%.1f against %.1f–%.1f far from it", n.Compactions, n.Parts[3], n.Low, n.High, far.Low, far.High)
	}
	// The compaction's time: etcd's batches over every key, each batch's
	// hold from its own compactions' pauses, else its backend's commits.
	nc := full
	nc.etcd = &EtcdCosts{ApplyPerWrite: etcd.ApplyPerWrite, BackendCommit: 0.004, Keys: 1000000}
	lo, hi, basis := nc.compactionTime()
	batches := math.Ceil((1000000 + float64(guard.Margin(nc.quota)/2)/float64(300<<20)*float64(nc.stale)) / compactionBatch)
	if !approx(lo, batches*(compactionSleep+0.004)) || hi < 2*lo || !strings.Contains(basis, "etcd's backend commits") {
		t.Errorf("compaction time from the backend's commits: %v–%v (%s), want %v", lo, hi, basis, batches*(compactionSleep+0.004))
	}
	nc.etcd.CompactionPause = 0.002
	if lo2, _, basis := nc.compactionTime(); !approx(lo2, batches*(compactionSleep+0.002)) || !strings.Contains(basis, "etcd's own compactions' pauses") {
		t.Errorf("compaction time from etcd's pauses: %v (%s)", lo2, basis)
	}
	// Its past compactions paused longer than its commits take (the
	// production benchmark's first 4,000,000-key run: 31.5 ms a batch
	// before, 13-19 in the run, commits of 5 ms): at best a batch holds a
	// commit's time, at worst twice its past pauses.
	nc.etcd.CompactionPause = 0.0315
	nc.etcd.BackendCommit = 0.005
	if lo3, hi3, basis := nc.compactionTime(); !approx(lo3, batches*(compactionSleep+0.005)) || hi3 < 2*batches*(compactionSleep+0.0315) || !strings.Contains(basis, "at best its backend's commits, 5.0 ms") {
		t.Errorf("compaction time from etcd's pauses above its commits: %v–%v (%s), want at least %v", lo3, hi3, basis, batches*(compactionSleep+0.005))
	}
}

// TestSimulateGuard: the guard's compactions played over a rewrite.
func TestSimulateGuard(t *testing.T) {
	c := costs{quota: 1 << 30, dbSize: 100 << 20, sizes: guard.WriteSizes{EtcdBytes: 200 << 20, RollbackBytes: 200 << 20}}
	every := float64(guard.Margin(c.quota) / 2)
	// Room for all of it: compactions in the background only.
	r := simulateGuard(c, 10, 1, false)
	if r.blocked != 0 || r.count < int(float64(c.sizes.EtcdBytes)/every)-1 {
		t.Errorf("room for the rewrite: %+v", r)
	}
	// Little room (50 MiB): the writes (20 MiB/s) go on while each
	// compaction runs in the background; one that ends before the next half
	// margin is written (1.28 s) keeps up and nothing waits; a slower one
	// is waited for, the slower the longer, never longer than it runs.
	c.dbSize = c.quota - guard.Margin(c.quota) - 50<<20
	fast, slow, slower := simulateGuard(c, 10, 1, false), simulateGuard(c, 10, 4, false), simulateGuard(c, 10, 8, false)
	if fast.blocked != 0 || fast.count < int(float64(c.sizes.EtcdBytes)/every)-1 {
		t.Errorf("little room, compactions that keep up: %+v", fast)
	}
	if slow.blocked <= 0 || slower.blocked <= slow.blocked || slow.blocked > float64(slow.count)*4 || slower.blocked > float64(slower.count)*8 {
		t.Errorf("little room, slow compactions: %+v, slower %+v", slow, slower)
	}
	// The room freed as the compaction walks (the low end): a write waits
	// for the room it needs, less than for the compaction's end, and the
	// same compactions are made.
	if p := simulateGuard(c, 10, 8, true); p.blocked <= 0 || p.blocked >= slower.blocked {
		t.Errorf("little room, slower compactions freeing as they go: %+v, at their end %+v", p, slower)
	}
	// Nothing to write: nothing to compact.
	if r := simulateGuard(costs{quota: 1 << 30}, 10, 1, true); r != (guardRun{}) {
		t.Errorf("nothing written: %+v", r)
	}
}

// TestEtcdCostsOf: the slowest member's costs (every member applies every
// write); a member that did not answer is said.
func TestEtcdCostsOf(t *testing.T) {
	fast := etcdscan.MemberMetrics{URL: "a", Writes: 100, Keys: 5}
	slow := etcdscan.MemberMetrics{URL: "b", Writes: 100, Keys: 5}
	fast.Apply.Count, fast.Apply.Sum = 100, 0.001
	slow.Apply.Count, slow.Apply.Sum = 100, 0.004
	c := etcdCostsOf([]etcdscan.MemberMetrics{fast, slow}, fmt.Errorf("member c: refused"))
	if c == nil || c.Metrics != "b" || !near(c.ApplyPerWrite, 40e-6) || c.Error != "member c: refused" {
		t.Fatalf("%+v", c)
	}
	if c := etcdCostsOf(nil, nil); c != nil {
		t.Fatalf("no member: %+v", c)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// approx says a and b are equal but for rounding.
func approx(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b), 1) }

// TestEstimateSQLiteTimedWrites: on a SQLite datastore whose writes plan
// timed on its copy, the writes go one after another at the sample's pace,
// scaled to the rewrite by count and by size (at least as its fastest
// round, at most as the whole sample), their CPU the sample's, and the
// snapshot is as long as the copy took; a sample that stopped short is not
// used (the model of etcd's costs, assumed, as before).
func TestEstimateSQLiteTimedWrites(t *testing.T) {
	c := baseCosts(nil)
	c.kine, c.window, c.scanned, c.stale = true, 0, 50000, 15000
	c.sizes = guard.WriteSizes{EtcdBytes: 15000 * 2500, JournalBytes: 15000 * 3300, RollbackBytes: 15000 * 2400}
	c.decideWall, c.decideCPU, c.copied = 2.5, 4, 1.2
	sample := func(bytesEach int64) *WriteSample {
		ws := &WriteSample{Writes: 1024, Batches: 64, Writers: 16, Bytes: 1024 * bytesEach, Seconds: 0.81, CPUSeconds: 0.9}
		for _, sec := range []float64{0.16, 0.2, 0.2, 0.24} {
			ws.Rounds = append(ws.Rounds, WriteRound{Writes: 256, Bytes: 256 * bytesEach, Seconds: sec})
		}
		return ws
	}
	parts := func(e Estimate) map[string]EstimatePart {
		m := map[string]EstimatePart{}
		for _, p := range e.Parts {
			m[p.Name] = p
		}
		return m
	}
	c.writes = sample(2500)
	e := estimate(c)
	if e.Writes != c.writes {
		t.Errorf("the estimate does not carry its write sample")
	}
	if lo, hi := c.writeChain(); !near(lo, 0.16*15000/256) || !near(hi, 0.8*15000/1024) {
		t.Errorf("the writes one after another: %.3f–%.3f s, want the fastest round's pace %.3f s, the whole sample's %.3f s", lo, hi, 0.16*15000/256, 0.8*15000/1024)
	}
	body, snap := parts(e)["decisions and writes"], parts(e)["snapshot"]
	if lo, hi := c.writeChain(); body.Low < lo || body.High <= hi || body.High <= body.Low {
		t.Errorf("writes' part %.2f–%.2f s, want at least the writes' chain %.2f–%.2f s", body.Low, body.High, lo, hi)
	}
	// 0.9 ms of CPU a write and the journal's, with the decisions', on 2 cores.
	if cpu := (4 + 15000*(0.9/1024+c.journalWrite)) / 2; body.Low < cpu*0.999 {
		t.Errorf("writes' part %.2f s below the CPU's %.2f s on 2 cores", body.Low, cpu)
	}
	if !strings.Contains(body.Basis, "written to plan's private copy of the datastore through kine") || !strings.Contains(body.Basis, "625–781 µs each") {
		t.Errorf("basis: %s", body.Basis)
	}
	if snap.Low != 1.2 || snap.High != snapshotStretch*1.2+0.2 || !strings.Contains(snap.Basis, "VACUUM INTO") {
		t.Errorf("snapshot %v–%v: %s", snap.Low, snap.High, snap.Basis)
	}

	// A sample of larger values than the rewrite's on average: its time
	// scaled by size at best, by count at worst.
	c.writes = sample(5000)
	if lo, hi := c.writeChain(); !near(lo, 0.16*15000*2500/(256*5000)) || !near(hi, 0.8*15000/1024) {
		t.Errorf("a sample of larger values: %.3f–%.3f s, want %.3f–%.3f s", lo, hi, 0.16*15000*2500/(256*5000), 0.8*15000/1024)
	}

	c.writes = &WriteSample{Writes: 16, Rounds: []WriteRound{{Writes: 16, Bytes: 16 * 2500, Seconds: 1}}, Error: "writing plan's copy of the datastore: conflict"}
	if p := parts(estimate(c))["decisions and writes"]; strings.Contains(p.Basis, "private copy") || p.Low >= 15000/16 {
		t.Errorf("a write sample that stopped short was used: %v–%v: %s", p.Low, p.High, p.Basis)
	}
}

// TestSamplerChunks: the write sample's chunks are migrate's batches of
// consecutive stale keys of a page (batchOps at most, the page's rest the
// last), kept uniformly, at most chunkN, with each key's size and lease.
func TestSamplerChunks(t *testing.T) {
	s := newSampler(4)
	s.chunkN, s.batchOps = 3, 4
	var page []reencode.Decision
	for i := range 10 {
		st := reencode.Stale
		if i == 2 {
			st = reencode.Current
		}
		page = append(page, reencode.Decision{Key: fmt.Sprintf("/k/%02d", i), Status: st, ModRevision: int64(100 + i), Read: etcdscan.KVMeta{Lease: 7}, NewValue: make([]byte, i)})
	}
	s.page(page)
	if len(s.chunks) != 3 || s.chunkSeen != 3 {
		t.Fatalf("chunks %d (seen %d), want 3: %+v", len(s.chunks), s.chunkSeen, s.chunks)
	}
	if got := []int{len(s.chunks[0]), len(s.chunks[1]), len(s.chunks[2])}; got[0] != 4 || got[1] != 4 || got[2] != 1 {
		t.Errorf("chunk sizes %v, want 4 4 1 (9 stale)", got)
	}
	if it := s.chunks[0][2]; it.key != "/k/03" || it.modRevision != 103 || it.size != 3 || it.read.Lease != 7 {
		t.Errorf("the third key of the first chunk: %+v", it)
	}
	for range 20 {
		s.page(page)
	}
	if len(s.chunks) != 3 || s.chunkSeen != 63 {
		t.Errorf("after 21 pages: %d chunks kept of %d seen, want 3 of 63", len(s.chunks), s.chunkSeen)
	}
}
