package guard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/input"
)

// SpaceGuard keeps every member's database below quota-margin: writers reserve
// a batch's cost before sending it; the guard asks etcd for the members'
// sizes (Status) every refresh bytes, and when a batch would not fit it asks
// again, compacts (--compact-history) and asks again, or stops the run.
type SpaceGuard struct {
	cli     clientStatus
	quota   int64
	margin  int64
	compact bool
	refresh int64 // bytes between two Status requests

	inflight, completed atomic.Int64

	mu            sync.Mutex
	base, free    int64 // DBSize and reusable pages at the last Status
	spent         int64 // reserved since the last Status (and what was in flight then)
	sinceCompact  int64 // reserved since the last compaction
	sinceUpdate   int64 // reserved since the last Status
	completedMark int64
	// marks are the completed bytes at each update, newest last: what etcd
	// reports lags the writes that returned by up to its backend's commit
	// interval (commitLag).
	marks []completedAt
	// compacting, while a compaction runs in the background, is where its
	// result comes.
	compacting chan compactResult
	// compactFrom is when the compaction running in the background began.
	compactFrom time.Time
	err         error
	report      *SpaceReport
	spoolRoom   int64 // SpoolRoom
	// watch, when set, is the run's liveness watch: a compaction waits
	// until it has judged every revision it removes.
	watch *Watch
	// asking, while a compaction runs, gets its revision once it is about
	// to be asked of etcd.
	asking chan int64
}

// Watched makes the guard's compactions wait for the run's liveness watch
// to have judged every revision they remove (a compaction the watch has not
// caught up with would end it).
func (g *SpaceGuard) Watched(w *Watch) {
	if g != nil {
		g.watch = w
	}
}

// Report is what the run saw of etcd's space, kept up to date as it writes.
func (g *SpaceGuard) Report() *SpaceReport { return g.report }

// SpoolRoom is the disk the preflight found left on the journal's
// filesystem beside the run's undo, etcd's growth and DiskMargin: what a
// Spool of the run's decisions may take (0: none).
func (g *SpaceGuard) SpoolRoom() int64 {
	if g == nil {
		return 0
	}
	return g.spoolRoom
}

// compactResult is a background compaction's outcome: the revision it
// compacted at (0: nothing was written since the last one), or its error.
type compactResult struct {
	rev  int64
	err  error
	took time.Duration
}

// clientStatus is what the guard asks etcd (the real client in the run; the
// interface keeps the guard's arithmetic apart from the transport).
type clientStatus interface {
	status(ctx context.Context) (etcdscan.StatusInfo, error)
	compact(ctx context.Context, rev int64) error
	// taken says whether etcd has taken a compaction at rev: it refuses
	// to read below it (its removing the old revisions may go on).
	taken(ctx context.Context, rev int64) (bool, error)
}

// NewSpaceGuard is the space guard of writes that are not a run of the tool
// (the benchmark's compaction-matched ceiling paces etcd's own rewrite with
// it): below quota bytes, compacting as a run with --compact-history does
// when compact, from etcd's sizes now. Call Reserve before each batch, Done
// after it, and Finish at the end.
func NewSpaceGuard(ctx context.Context, cli *clientv3.Client, quota int64, compact bool) (*SpaceGuard, error) {
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		return nil, err
	}
	return newSpaceGuard(etcdStatus{cli}, Quota{Bytes: quota, Known: true}, compact, st), nil
}

// NewEtcdSpaceGuard is the guard of a run that writes to cli, starting at
// st, with its report.
func NewEtcdSpaceGuard(cli *clientv3.Client, quota Quota, compact bool, st etcdscan.StatusInfo) *SpaceGuard {
	return newSpaceGuard(etcdStatus{cli}, quota, compact, st)
}

// newSpaceGuard is the guard of a run that starts at st, with its report.
func newSpaceGuard(cli clientStatus, quota Quota, compact bool, st etcdscan.StatusInfo) *SpaceGuard {
	m := Margin(quota.Bytes)
	rep := &SpaceReport{Quota: quota, Margin: m, DBSizeBefore: st.DBSize, DBSizeMax: st.DBSize}
	return &SpaceGuard{cli: cli, quota: quota.Bytes, margin: m, compact: compact, refresh: max(m/4, 256<<10),
		base: st.DBSize, free: st.Free, report: rep}
}

// fits says whether cost more fits: the run's writes never grow the database
// into the margin, but may reuse the free pages of a database already in it
// (a compaction takes pages of its own) down to a quarter of the margin.
func (g *SpaceGuard) fits(cost int64) bool {
	growth := max(0, g.spent+cost-g.free)
	if growth == 0 {
		return g.base+g.margin/4 <= g.quota
	}
	return g.base+growth+g.margin <= g.quota
}

// Reserve is called before a batch is sent; an error stops the run. With
// compaction, every compactEvery bytes a compaction of the history up to the
// current revision starts in the background while the writes go on (etcd
// compacts every revision of its keyspace in batches: at millions of keys
// a compaction takes as long as the writes between two of them); when a
// batch would not fit, the run waits for the room it frees as it goes
// (awaitRoom), or compacts at once.
func (g *SpaceGuard) Reserve(ctx context.Context, cost int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	waitFrom := time.Now()
	defer func() { g.report.WaitSeconds += time.Since(waitFrom).Seconds() }()
	// What is in flight is not in the sizes etcd reports: keep it to a
	// quarter of the margin (it matters only for small quotas).
	for g.inflight.Load() > 0 && g.inflight.Load()+cost > g.margin/4 && ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
	compacted, err := g.collect(ctx, false)
	if err != nil {
		return err
	}
	switch {
	case g.compact && g.compacting == nil && g.sinceCompact >= g.compactEvery():
		g.startCompact(ctx)
	case g.sinceUpdate >= g.refresh && !compacted:
		if err := g.update(ctx); err != nil {
			return err
		}
	}
	if !g.fits(cost) {
		// etcd commits its backend every 100 ms: let what was written land, then look again.
		time.Sleep(150 * time.Millisecond)
		if err := g.update(ctx); err != nil {
			return err
		}
		// The compaction running (if any), then one at the latest write.
		for try := 0; try < 2 && !g.fits(cost) && g.compact; try++ {
			if g.compacting == nil {
				// New batches wait (g.mu); let those in flight land, so that the
				// revision compacted at covers every write made so far.
				for g.inflight.Load() > 0 && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				g.startCompact(ctx)
			}
			c, err := g.awaitRoom(ctx, cost)
			if err != nil {
				return err
			}
			compacted = compacted || c
		}
		// The pages a compaction frees show as free only after etcd's next
		// commits, which the run's next writes bring: right after one, a
		// batch may go if it stays below the quota less a quarter of the margin.
		if !g.fits(cost) && !(compacted && g.base+max(0, g.spent+cost-g.free)+g.margin/4 <= g.quota) {
			g.err = &SpaceError{DBSize: g.base, Quota: g.quota, Margin: g.margin, Compacted: g.report.Compactions > 0}
			return g.err
		}
	}
	g.spent += cost
	g.sinceUpdate += cost
	g.sinceCompact += cost
	g.inflight.Add(cost)
	return nil
}

// compactEvery is how much a compacting run writes between two compactions:
// half the margin. A compaction takes pages of its own while it rewrites the
// pages it frees (measured: from a third to as much as it frees, when none
// were free before),
// so it must come before the run's writes reach the margin.
func (g *SpaceGuard) compactEvery() int64 { return g.margin / 2 }

// Done is called when a reserved batch has returned.
func (g *SpaceGuard) Done(cost int64) {
	g.inflight.Add(-cost)
	g.completed.Add(cost)
}

// update asks every member's size. What was in flight then, and what
// returned within etcd's commit interval before it (it may not have reached
// the backend yet), still counts as spent.
func (g *SpaceGuard) update(ctx context.Context) error {
	asked := time.Now()
	inflight, completed := g.inflight.Load(), g.completed.Load()
	st, err := g.cli.status(ctx)
	if err != nil {
		g.err = fmt.Errorf("watching etcd's database size: %w (nothing more was written)", err)
		return g.err
	}
	// The newest mark older than the commit interval is in what etcd reported.
	i := 0
	for i < len(g.marks) && asked.Sub(g.marks[i].at) >= commitLag {
		g.completedMark = g.marks[i].completed
		i++
	}
	g.marks = append(g.marks[i:], completedAt{at: asked, completed: completed})
	g.base, g.free = st.DBSize, st.Free
	g.spent = inflight + (completed - g.completedMark)
	g.sinceUpdate = 0
	g.report.DBSizeMax = max(g.report.DBSizeMax, st.DBSize)
	return nil
}

// commitLag is how long a write that returned may be missing from the
// database size etcd reports: etcd commits its backend every 100 ms (or every
// 10,000 writes, sooner).
const commitLag = 200 * time.Millisecond

// completedAt is the guard's count of completed bytes at a time.
type completedAt struct {
	at        time.Time
	completed int64
}

// startCompact starts compacting etcd's history up to the current revision
// (the old revisions of every key the run rewrote) in the background, and
// waits for the pages to be free there (g.mu held; collect takes the result).
func (g *SpaceGuard) startCompact(ctx context.Context) {
	ch, asking := make(chan compactResult, 1), make(chan int64, 1)
	g.compacting, g.asking, g.sinceCompact = ch, asking, 0
	g.compactFrom = time.Now()
	after := g.report.CompactedAt
	// The run's interruption does not abandon a compaction etcd has begun.
	ctx = context.WithoutCancel(ctx)
	go func() {
		var r compactResult
		start := time.Now()
		defer func() { r.took = time.Since(start); ch <- r }()
		defer crash.Recover("compacting etcd's history", &r.err)
		st, err := g.cli.status(ctx)
		switch {
		case err != nil:
			r = compactResult{err: err}
		case st.Revision <= after:
			r = compactResult{} // nothing written since the last compaction
		default:
			if err := g.watch.waitJudged(ctx, st.Revision); err != nil {
				r = compactResult{err: err}
				break
			}
			asking <- st.Revision
			r = compactResult{rev: st.Revision, err: g.cli.compact(ctx, st.Revision)}
		}
	}()
}

// awaitRoom waits until cost fits or the compaction running ends (then it
// says whether it compacted, as collect does). etcd compacts in batches of
// revisions, committing each before the next, so the pages of the old
// values show free long before a compaction of millions of revisions ends:
// meanwhile the guard asks etcd's sizes every roomPoll, and the batch goes
// as soon as it fits in what is free by then (g.mu held).
func (g *SpaceGuard) awaitRoom(ctx context.Context, cost int64) (bool, error) {
	if g.compacting == nil {
		return false, nil
	}
	tick := time.NewTicker(roomPoll)
	defer tick.Stop()
	for {
		select {
		case r := <-g.compacting:
			return g.ended(ctx, r)
		case <-tick.C:
			if err := g.update(ctx); err != nil {
				return false, err
			}
			if g.fits(cost) {
				return false, nil
			}
		}
	}
}

// roomPoll is how often a batch waiting for a compaction to free room asks
// etcd's sizes.
const roomPoll = 250 * time.Millisecond

// collect takes the result of the compaction running in the background, if
// it has ended (wait: when it ends), and says whether it compacted (g.mu held).
func (g *SpaceGuard) collect(ctx context.Context, wait bool) (bool, error) {
	if g.compacting == nil {
		return false, nil
	}
	var r compactResult
	if wait {
		r = <-g.compacting
	} else {
		select {
		case r = <-g.compacting:
		default:
			return false, nil
		}
	}
	return g.ended(ctx, r)
}

// ended takes a background compaction's result r (g.mu held).
func (g *SpaceGuard) ended(ctx context.Context, r compactResult) (bool, error) {
	g.compacting = nil
	g.report.CompactSeconds += r.took.Seconds()
	if r.err != nil {
		g.err = input.Errorf("%s: %w (nothing more was written)", input.CompactHistory, r.err)
		return false, g.err
	}
	if r.rev == 0 {
		return false, nil
	}
	g.report.Compactions++
	g.report.CompactedAt = r.rev
	return true, g.update(ctx)
}

// Finish is called when the run's writes are over: a compaction still
// running is waited for until etcd has taken it (then it goes on in etcd
// after the run, as kube-apiserver's do: removing millions of old revisions
// takes etcd minutes that nothing of the run needs) and counted; then it
// reports the database's size after the run.
func (g *SpaceGuard) Finish(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.compacting != nil {
		waitFrom := time.Now()
		g.lastTaken(ctx) // the writes are done: a failed last compaction loses nothing
		g.report.EndWaitSeconds = time.Since(waitFrom).Seconds()
		g.report.WaitSeconds += g.report.EndWaitSeconds
	}
	// etcd commits its backend every 100 ms: the last writes count then.
	time.Sleep(150 * time.Millisecond)
	sctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultCommandTimeout)
	defer cancel()
	if st, err := g.cli.status(sctx); err == nil {
		g.report.DBSizeAfter = st.DBSize
		g.report.DBSizeMax = max(g.report.DBSizeMax, st.DBSize)
	}
}

// lastTaken waits for the compaction running at the run's end to end, or
// to be taken by etcd (asked every takenPoll), and counts it (g.mu held).
// Should etcd not say, it waits for the end.
func (g *SpaceGuard) lastTaken(ctx context.Context) {
	tick := time.NewTicker(takenPoll)
	defer tick.Stop()
	var rev int64
	for {
		select {
		case r := <-g.compacting:
			_, _ = g.ended(ctx, r)
			return
		case rev = <-g.asking:
		case <-tick.C:
			if rev == 0 {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultCommandTimeout)
			taken, err := g.cli.taken(pctx, rev)
			cancel()
			if err != nil {
				_, _ = g.collect(ctx, true)
				return
			}
			if taken {
				g.compacting = nil
				g.report.CompactSeconds += time.Since(g.compactFrom).Seconds()
				g.report.Compactions++
				g.report.CompactedAt, g.report.LastGoesOn = rev, true
				return
			}
		}
	}
}

// takenPoll is how often the run's end asks whether etcd has taken its last
// compaction.
const takenPoll = 50 * time.Millisecond

// etcdStatus is clientStatus on a real client.
type etcdStatus struct{ cli *clientv3.Client }

func (e etcdStatus) status(ctx context.Context) (etcdscan.StatusInfo, error) {
	return etcdscan.Status(ctx, e.cli)
}

func (e etcdStatus) compact(ctx context.Context, rev int64) error {
	return etcdscan.Compact(ctx, e.cli, rev)
}

func (e etcdStatus) taken(ctx context.Context, rev int64) (bool, error) {
	return etcdscan.CompactTaken(ctx, e.cli, rev)
}
