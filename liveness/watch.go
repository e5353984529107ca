package liveness

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/crash"
)

// Watch is one watch of etcd under a cluster's prefix that serves a writing
// run from before its first write to after its last: the window first
// (Window, what Observe reports), then every write etcd shows while the run
// writes, judged against the run's own (see the package comment). Start it
// before the run's other checks; Close it when the run is over.
type Watch struct {
	cli    *clientv3.Client
	prefix string // without its trailing slash
	keys   string // prefix + "/"
	window time.Duration
	from   int64

	cancel context.CancelFunc
	done   chan struct{}
	poke   chan struct{} // wakes the loop: a waiter wants progress, a lease to check

	mu sync.Mutex
	// changed is closed, and replaced, whenever what a waiter waits for may have moved.
	changed chan struct{}

	// The window.
	windowEnd int64 // etcd's revision when the window ended (0 before)
	byKey     map[string]*Write
	expired   int
	verdict   chan struct{} // closed once report or reportErr is set
	report    *Report
	reportErr error

	// The run.
	seq      uint64              // the run's requests announced (Begin)
	inflight map[uint64]struct{} // announced, outcome not known yet
	own      map[int64]struct{}  // revisions the run's requests were applied at
	pruned   int                 // len(own) after the last prune
	maybe    map[string][]possible
	pending  []*event // events not judged yet, in revision order
	seen     int64    // etcd's watch has reported every revision up to seen
	want     int64    // a waiter wants every event up to want judged
	leaseq   []*event // deletes whose key's etcd lease is to be read
	runExp   int      // keys etcd deleted with their lease while the run wrote
	stop     *WriterError
	stopped  chan struct{} // closed once stop or failed is set
	failed   error

	// Once the window's verdict is in (onDemand), etcd's watch is open only
	// while a revision is not accounted for (watching): seen then also
	// moves over the run's own revisions without their events.
	onDemand  bool
	watching  bool
	needWatch bool  // a gap is confirmed: the loop opens the watch
	latest    int64 // the highest revision etcd is known to have reached
	gapAt     int64 // the first revision of the gap noticed (0: none)
	holdTo    int64 // Begin waits until every revision up to it is judged (0: none)
	gapSeq    uint64
	sent      int       // events etcd sent after the window (a test's count)
	openedAt  time.Time // when etcd's watch was last opened (the loop's)
	polled    time.Time // when etcd's revision was last read
}

// possible is a write of the run whose request failed in a way that may have
// been applied: its revision is not known, its key and value are.
type possible struct {
	del bool
	sum [32]byte
}

// event is a write etcd showed while the run wrote, not judged yet.
type event struct {
	key   string
	rev   int64
	del   bool
	value []byte
	// need is the last request the run announced when the event came: every
	// request up to it must have its outcome before the event is judged.
	need uint64
	// For a delete: whether the key had an etcd lease just before it
	// (leaseKnown once read; checking while it is).
	leaseKnown, leased, checking bool
}

// maxForeign bounds the other writers' keys a WriterError keeps.
const maxForeign = 100

// Possible is a write whose request failed in a way that may have been
// applied (Unknown): its key and value (a delete: none).
type Possible struct {
	Key    string
	Value  []byte
	Delete bool
}

// Start begins watching every key under prefix (kube-apiserver's
// --etcd-prefix) from etcd's current revision: the window (DefaultWindow when
// window is 0 or less) starts now. The watch goes on, on its own context,
// until Close; ctx bounds only the start.
func Start(ctx context.Context, cli *clientv3.Client, prefix string, window time.Duration) (*Watch, error) {
	if window <= 0 {
		window = DefaultWindow
	}
	prefix = strings.TrimSuffix(prefix, "/")
	w := &Watch{
		cli: cli, prefix: prefix, keys: prefix + "/", window: window,
		done: make(chan struct{}), poke: make(chan struct{}, 1), changed: make(chan struct{}),
		byKey: map[string]*Write{}, verdict: make(chan struct{}),
		inflight: map[uint64]struct{}{}, own: map[int64]struct{}{}, maybe: map[string][]possible{},
		stopped: make(chan struct{}),
	}
	start, err := cli.Get(ctx, w.keys)
	if err != nil {
		return nil, fmt.Errorf("liveness: read etcd's revision: %w", err)
	}
	w.from = start.Header.Revision
	w.seen = w.from
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	go w.loop(lctx)
	return w, nil
}

// Close ends the watch.
func (w *Watch) Close() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// Window waits for the window to end and etcd's watch to have reported every
// revision up to its end, and returns what it saw (Observe's report). The
// watch goes on.
func (w *Watch) Window(ctx context.Context) (*Report, error) {
	select {
	case <-w.verdict:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return w.report, w.reportErr
}

// Begin announces a request of the run that may write, before it is sent;
// its outcome must follow (Applied, NotApplied or Unknown) with the token
// returned. Once another writer was seen, or the watch failed, it returns
// that error instead: send nothing more.
//
// While a revision that is not the run's is being looked at (a gap,
// confirmed), Begin waits until it is judged: no request is sent while
// another writer may have been seen and not judged yet.
func (w *Watch) Begin() (uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holdTo > 0 {
		if err := w.waitHold(); err != nil {
			return 0, err
		}
	}
	if err := w.stoppedLocked(); err != nil {
		return 0, err
	}
	w.seq++
	w.inflight[w.seq] = struct{}{}
	return w.seq, nil
}

// waitHold waits, w.mu held (released while it waits), until every revision
// up to holdTo is judged, the watch stopped, or the wait took longer than
// etcd's watch may take to catch up (an error: the run stops).
func (w *Watch) waitHold() error {
	deadline := time.NewTimer(catchUp + DefaultWindow)
	defer deadline.Stop()
	for w.holdTo > 0 && w.judged() < w.holdTo && w.stop == nil && w.failed == nil {
		ch, hold, seen := w.changed, w.holdTo, w.seen
		w.mu.Unlock()
		w.wake()
		select {
		case <-ch:
			w.mu.Lock()
		case <-deadline.C:
			w.mu.Lock()
			return fmt.Errorf("liveness: etcd's watch of %s reported revision %d, not %d (a write that is not the run's), %s after it was opened for it", w.keys, seen, hold, catchUp+DefaultWindow)
		}
	}
	if w.holdTo > 0 && w.judged() >= w.holdTo {
		w.holdTo = 0
	}
	return nil
}

// Applied says the request tok was applied at revision rev.
func (w *Watch) Applied(tok uint64, rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, tok)
	w.own[rev] = struct{}{}
	w.latest = max(w.latest, rev)
	w.judge()
}

// NotApplied says the request tok wrote nothing (a compare failed, or it was
// refused before it reached etcd's log).
func (w *Watch) NotApplied(tok uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, tok)
	w.judge()
}

// Unknown says the request tok failed in a way that may have been applied
// (a timeout, a lost connection): a write etcd shows of one of its keys with
// exactly its value (a delete: a delete of one of its keys) is the run's.
func (w *Watch) Unknown(tok uint64, writes []Possible) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, tok)
	for _, p := range writes {
		var sum [32]byte
		if !p.Delete {
			sum = sha256.Sum256(p.Value)
		}
		w.maybe[p.Key] = append(w.maybe[p.Key], possible{del: p.Delete, sum: sum})
	}
	w.judge()
}

// Stopping is closed once another writer was seen while the run wrote, or
// the watch failed (Stopped says which).
func (w *Watch) Stopping() <-chan struct{} { return w.stopped }

// Stopped is nil while nothing but the run writes; then a *WriterError, or
// the error that ended the watch (nothing can tell the run's writes from
// others' any more).
func (w *Watch) Stopped() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stoppedLocked()
}

func (w *Watch) stoppedLocked() error {
	if w.stop != nil {
		// A copy: the watch goes on adding what it sees.
		cp := *w.stop
		cp.Writes, cp.APIServers = slices.Clone(cp.Writes), slices.Clone(cp.APIServers)
		return &cp
	}
	return w.failed
}

// WaitJudged waits until every event up to etcd revision rev is judged (the
// run's own requests up to it have their outcomes), or the watch stopped
// (its error). A compaction of etcd's history up to rev is then harmless to
// the watch.
func (w *Watch) WaitJudged(ctx context.Context, rev int64) error {
	deadline := time.NewTimer(catchUp + DefaultWindow)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		if w.failed != nil {
			err := w.failed
			w.mu.Unlock()
			return err
		}
		w.want = max(w.want, rev)
		w.checkGap()
		if w.judged() >= rev {
			w.mu.Unlock()
			return nil
		}
		seen := w.seen
		w.want = max(w.want, rev)
		ch := w.changed
		w.mu.Unlock()
		w.wake()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("liveness: etcd's watch of %s reported revision %d, not %d, %s after it was asked", w.keys, seen, rev, catchUp+DefaultWindow)
		}
	}
}

// Settle is called once the run's writes are over (every request has its
// outcome): it waits until every event up to etcd's current revision is
// judged, and returns nil when nothing but the run wrote under the prefix
// since the window ended, else the *WriterError naming what did (with the
// kube-apiserver identity leases written since the window began), or the
// error that ended the watch.
func (w *Watch) Settle(ctx context.Context) error {
	// etcd gone (the run stopped for it) is an answer within catchUp, not
	// a wait for as long as it stays away.
	gctx, cancel := context.WithTimeout(ctx, catchUp)
	resp, err := w.cli.Get(gctx, w.keys)
	cancel()
	if err == nil {
		err = w.WaitJudged(ctx, resp.Header.Revision)
	} else {
		err = fmt.Errorf("liveness: read etcd's revision: %w", err)
	}
	w.mu.Lock()
	stop, failed := w.stop, w.failed
	w.mu.Unlock()
	switch {
	case stop == nil && failed != nil:
		return failed
	case stop == nil:
		return err
	}
	// Who: the identity leases written since the window began (a
	// kube-apiserver starting writes its own within seconds).
	gctx, cancel = context.WithTimeout(ctx, catchUp)
	leases, lerr := w.cli.Get(gctx, w.keys+"leases/kube-system/", clientv3.WithPrefix(), clientv3.WithMinModRev(w.from+1))
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if lerr == nil {
		w.stop.APIServers = w.stop.APIServers[:0]
		for _, kv := range leases.Kvs {
			wr := Write{Key: string(kv.Key), Kind: kindOf(w.prefix, string(kv.Key)), ModRevision: kv.ModRevision}
			describe(w.prefix, kv.Value, &wr)
			if wr.Kind == IdentityLease {
				w.stop.APIServers = append(w.stop.APIServers, wr)
			}
		}
	}
	return w.stoppedLocked()
}

// receive takes one response's events (prevKV: they carry the previous
// value).
func (w *Watch) receive(evs []*clientv3.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := w.seen
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		if rev <= w.seen {
			continue // reported before a watch was opened again
		}
		last = max(last, rev)
		if w.windowEnd == 0 || rev <= w.windowEnd {
			// Before the verdict nothing of the run's is written: every
			// write belongs to the window.
			record(&w.expired, w.byKey, w.prefix, ev)
			continue
		}
		w.sent++
		if _, ok := w.own[rev]; ok {
			continue
		}
		e := &event{key: string(ev.Kv.Key), rev: rev, del: ev.Type == clientv3.EventTypeDelete, need: w.seq}
		if e.del && ev.PrevKv != nil {
			e.leaseKnown, e.leased = true, ev.PrevKv.Lease != 0
		}
		if !e.del {
			e.value = ev.Kv.Value
		}
		w.pending = append(w.pending, e)
	}
	w.seen = last
	w.latest = max(w.latest, last)
	w.judge()
}

// progressed takes a progress notification: every revision up to rev is reported.
func (w *Watch) progressed(rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = max(w.seen, rev)
	w.latest = max(w.latest, w.seen)
	w.judge()
}

// wantsProgress says whether someone waits for revisions etcd's watch has
// not reported yet.
func (w *Watch) wantsProgress() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	end := w.windowEnd
	if w.report != nil || w.reportErr != nil {
		end = 0
	}
	if w.onDemand {
		end = w.latest
	}
	return w.seen < max(w.want, end) && w.failed == nil
}

// rewatchFor bounds how long the watch is opened again, while etcd fails it,
// before the run is stopped.
const rewatchFor = 30 * time.Second

func (w *Watch) loop(ctx context.Context) {
	defer close(w.done)
	// A panic ends the watch as any failure does: the run stops.
	var perr error
	defer func() {
		if perr != nil {
			w.fail(perr)
		}
	}()
	defer crash.Recover("watching etcd", &perr)
	var wctx context.Context
	var wcancel context.CancelFunc = func() {}
	defer func() { wcancel() }()
	prevKV := true
	open := func() clientv3.WatchChan {
		wcancel()
		wctx, wcancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
		w.mu.Lock()
		from := w.seen + 1
		w.mu.Unlock()
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(from)}
		if prevKV {
			opts = append(opts, clientv3.WithPrevKV())
		}
		return w.cli.Watch(wctx, w.keys, opts...)
	}
	wch := open()
	windowEnd := time.NewTimer(w.window)
	defer windowEnd.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var catchUpBy <-chan time.Time
	var retry <-chan time.Time
	var failingSince time.Time
	backoff := 100 * time.Millisecond
	progress := func() {
		if wch != nil && w.wantsProgress() {
			_ = w.cli.RequestProgress(wctx)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-windowEnd.C:
			end, err := w.cli.Get(ctx, w.keys)
			if err != nil {
				w.fail(fmt.Errorf("liveness: read etcd's revision: %w", err))
				return
			}
			w.mu.Lock()
			w.windowEnd = end.Header.Revision
			w.mu.Unlock()
			catchUpBy = time.After(catchUp)
			progress()
		case <-catchUpBy:
			w.mu.Lock()
			seen, end, decided := w.seen, w.windowEnd, w.report != nil || w.reportErr != nil
			w.mu.Unlock()
			if !decided {
				w.fail(fmt.Errorf("liveness: etcd's watch of %s reported revision %d, not %d, %s after the window ended", w.keys, seen, end, catchUp))
				return
			}
		case <-tick.C:
			progress()
			w.checkLeases(ctx)
		case <-w.poke:
			progress()
			w.checkLeases(ctx)
		case <-retry:
			retry = nil
			wch = open()
		case wr, ok := <-wch:
			if !ok || wr.Canceled || wr.Err() != nil {
				if ctx.Err() != nil {
					return
				}
				if wr.CompactRevision != 0 {
					w.mu.Lock()
					seen := w.seen
					w.mu.Unlock()
					w.fail(fmt.Errorf("liveness: etcd's history was compacted to revision %d while the watch of %s had reported revision %d (not by this run: kube-apiserver compacts every 5 minutes, so one may be alive); what was written in between cannot be known: rerun", wr.CompactRevision, w.keys, seen))
					return
				}
				// A member that lost its leader, a connection lost: open it
				// again from the first revision not reported.
				if failingSince.IsZero() {
					failingSince = time.Now()
				}
				if time.Since(failingSince) > rewatchFor {
					why := "etcd closed it"
					if err := wr.Err(); err != nil {
						why = err.Error()
					}
					w.fail(fmt.Errorf("liveness: the watch of %s failed for %s: %s", w.keys, rewatchFor, why))
					return
				}
				wcancel()
				wch = nil
				retry = time.After(backoff)
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			failingSince, backoff = time.Time{}, 100*time.Millisecond
			if wr.IsProgressNotify() {
				w.progressed(wr.Header.Revision)
			} else {
				w.receive(wr.Events)
			}
		}
		if w.decideWindow(ctx) && prevKV {
			// The run writes from now on: etcd's watch is closed, and
			// opened again only for a revision that is not the run's
			// (checkGap): etcd would otherwise send back every value the
			// run writes. Its events need no previous value (etcd reads one
			// for every event); deletes read it when they must
			// (checkLeases).
			prevKV = false
			wcancel()
			wch, retry = nil, nil
			w.mu.Lock()
			w.onDemand, w.watching = true, false
			w.latest = max(w.latest, w.windowEnd)
			w.checkGap()
			w.mu.Unlock()
		}
		if w.onDemand {
			switch w.demand(ctx, wch != nil || retry != nil) {
			case openWatch:
				w.openedAt = time.Now()
				wch = open()
			case closeWatch:
				wcancel()
				wch, retry = nil, nil
			}
		}
	}
}

// What the loop does with etcd's watch once the run writes (demand).
const (
	keepWatch = iota
	openWatch
	closeWatch
)

// linger is how long etcd's watch, opened for a gap, stays open after it
// caught up (writes of another writer come in bursts); pollEvery is how
// often etcd's revision is read while the watch is closed, so that a writer
// is seen while the run does not write.
const (
	linger    = time.Second
	pollEvery = 250 * time.Millisecond
)

// demand says, once the run writes, whether etcd's watch is to be opened
// (a gap is confirmed) or closed (every revision etcd is known to have
// reached is judged, and it has been open for linger); while it is closed,
// etcd's revision is read every pollEvery.
func (w *Watch) demand(ctx context.Context, open bool) int {
	w.mu.Lock()
	w.checkGap() // a waiter's want (WaitJudged) is a revision reached too
	switch {
	case w.failed != nil:
		w.mu.Unlock()
		return keepWatch
	case !open && w.needWatch:
		w.needWatch, w.watching = false, true
		w.gapAt, w.gapSeq = 0, 0
		w.mu.Unlock()
		return openWatch
	case open && !w.needWatch && len(w.pending) == 0 && len(w.leaseq) == 0 && w.seen >= max(w.latest, w.want) && time.Since(w.openedAt) >= linger:
		w.watching = false
		w.mu.Unlock()
		return closeWatch
	case !open && time.Since(w.polled) >= pollEvery:
		w.polled = time.Now()
		w.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, catchUp)
		resp, err := w.cli.Get(pctx, w.keys, clientv3.WithCountOnly())
		cancel()
		if err == nil {
			w.mu.Lock()
			w.latest = max(w.latest, resp.Header.Revision)
			w.checkGap()
			w.signal()
			w.mu.Unlock()
		}
		return keepWatch
	}
	w.mu.Unlock()
	return keepWatch
}
