package liveness

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	coordinationv1 "k8s.io/api/coordination/v1"

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
func (w *Watch) Begin() (uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.stoppedLocked(); err != nil {
		return 0, err
	}
	w.seq++
	w.inflight[w.seq] = struct{}{}
	return w.seq, nil
}

// Applied says the request tok was applied at revision rev.
func (w *Watch) Applied(tok uint64, rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, tok)
	w.own[rev] = struct{}{}
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

// judged is the revision up to which every event is judged.
func (w *Watch) judged() int64 {
	if len(w.pending) > 0 {
		return w.pending[0].rev - 1
	}
	return w.seen
}

// signal wakes the waiters (w.mu held).
func (w *Watch) signal() {
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *Watch) wake() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// blocked says whether a request announced up to need has no outcome yet.
func (w *Watch) blocked(need uint64) bool {
	for tok := range w.inflight {
		if tok <= need {
			return true
		}
	}
	return false
}

// judge decides the pending events, oldest first, as far as the outcomes
// known allow (w.mu held).
func (w *Watch) judge() {
	defer w.signal()
	for len(w.pending) > 0 {
		e := w.pending[0]
		if e.checking || w.blocked(e.need) {
			break
		}
		if _, ok := w.own[e.rev]; ok || w.possiblyOwn(e) {
			w.popPending()
			continue
		}
		if e.del && !e.leaseKnown {
			// Etcd deleting a key whose lease ran out is no writer: read
			// whether it had one (the loop does, outside the lock).
			e.checking = true
			w.leaseq = append(w.leaseq, e)
			w.wake()
			break
		}
		w.popPending()
		if e.del && e.leased {
			w.runExp++
			continue
		}
		w.other(e)
	}
	// The run's revisions at or below the judged one are of no more use.
	if n := len(w.own); n > 4096 && n > 2*w.pruned {
		j := w.judged()
		for rev := range w.own {
			if rev <= j {
				delete(w.own, rev)
			}
		}
		w.pruned = len(w.own)
	}
}

// popPending drops the oldest pending event, its slot cleared: the slice's
// array would otherwise keep every event judged since it was last grown,
// as many as the longest backlog (a run's writes waiting out a compaction).
func (w *Watch) popPending() {
	w.pending[0] = nil
	w.pending = w.pending[1:]
}

// possiblyOwn matches an event with a write of the run whose outcome is
// unknown.
func (w *Watch) possiblyOwn(e *event) bool {
	ps := w.maybe[e.key]
	if len(ps) == 0 {
		return false
	}
	var sum [32]byte
	if !e.del {
		sum = sha256.Sum256(e.value)
	}
	for i, p := range ps {
		if p.del == e.del && (p.del || p.sum == sum) {
			w.maybe[e.key] = append(ps[:i:i], ps[i+1:]...)
			return true
		}
	}
	return false
}

// other records a write that is not the run's and stops the run.
func (w *Watch) other(e *event) {
	if w.stop == nil {
		w.stop = &WriterError{Prefix: w.prefix, Since: w.windowEnd}
		close(w.stopped)
	}
	s := w.stop
	for i := range s.Writes {
		if wr := &s.Writes[i]; wr.Key == e.key {
			wr.Writes++
			wr.ModRevision, wr.Deleted = e.rev, e.del
			return
		}
	}
	if len(s.Writes) == maxForeign {
		s.More++
		return
	}
	wr := Write{Key: e.key, Kind: kindOf(w.prefix, e.key), ModRevision: e.rev, Writes: 1, Deleted: e.del}
	if !e.del {
		describe(w.prefix, e.value, &wr)
	}
	s.Writes = append(s.Writes, wr)
}

// fail ends the watch: nothing can tell the run's writes from others' now.
func (w *Watch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.report == nil && w.reportErr == nil {
		w.reportErr = err
		close(w.verdict)
	}
	if w.failed == nil && w.stop == nil {
		w.failed = err
		close(w.stopped)
	} else if w.failed == nil {
		w.failed = err
	}
	w.signal()
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
	w.judge()
}

// progressed takes a progress notification: every revision up to rev is reported.
func (w *Watch) progressed(rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = max(w.seen, rev)
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
	return w.seen < max(w.want, end) && w.failed == nil
}

// checkLeases reads, for the deletes waiting for it, whether the key had an
// etcd lease just before (at the revision before the delete's).
func (w *Watch) checkLeases(ctx context.Context) {
	w.mu.Lock()
	q := w.leaseq
	w.leaseq = nil
	w.mu.Unlock()
	for _, e := range q {
		resp, err := w.cli.Get(ctx, e.key, clientv3.WithRev(e.rev-1))
		w.mu.Lock()
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			w.mu.Unlock()
			w.fail(fmt.Errorf("liveness: etcd's history was compacted past revision %d (not by this run) before the watch could tell whether the delete of %s was etcd expiring its lease: rerun", e.rev-1, e.key))
			return
		case err != nil:
			// Read again on the loop's next tick.
			w.leaseq = append(w.leaseq, e)
		default:
			e.checking, e.leaseKnown = false, true
			e.leased = len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0
			w.judge()
		}
		w.mu.Unlock()
	}
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
			// The run writes from now on: its own events need no previous
			// value (etcd reads one for every event), deletes read it when
			// they must (checkLeases).
			prevKV = false
			if wch != nil {
				wch = open()
			}
		}
	}
}

// decideWindow gives the window's verdict once etcd's watch has reported
// every revision up to the window's end; it says whether the verdict is in.
func (w *Watch) decideWindow(ctx context.Context) bool {
	w.mu.Lock()
	if w.report != nil || w.reportErr != nil {
		w.mu.Unlock()
		return true
	}
	if w.windowEnd == 0 || w.seen < w.windowEnd {
		w.mu.Unlock()
		return false
	}
	rep := &Report{Prefix: w.prefix, Window: w.window, FromRevision: w.from, ToRevision: w.windowEnd, Expired: w.expired}
	for _, wr := range w.byKey {
		rep.Written = append(rep.Written, *wr)
	}
	w.mu.Unlock()
	sort.Slice(rep.Written, func(i, j int) bool {
		a, b := rep.Written[i], rep.Written[j]
		if (a.Kind == Other) != (b.Kind == Other) {
			return a.Kind != Other
		}
		return a.Key < b.Key
	})
	err := heldMasterLeases(ctx, w.cli, w.keys, rep)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.reportErr = err
	} else {
		w.report = rep
	}
	close(w.verdict)
	w.signal()
	return true
}

// heldMasterLeases adds the master leases whose etcd lease has time left.
func heldMasterLeases(ctx context.Context, cli *clientv3.Client, keys string, rep *Report) error {
	// Not keys-only: etcd 3.7 answers a keys-only range from its index, without the leases.
	ml, err := cli.Get(ctx, keys+"masterleases/", clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("liveness: read %smasterleases/: %w", keys, err)
	}
	for _, kv := range ml.Kvs {
		if kv.Lease == 0 {
			continue
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return fmt.Errorf("liveness: read the etcd lease of %s: %w", kv.Key, err)
		}
		if ttl.TTL > 0 {
			rep.MasterLeases = append(rep.MasterLeases, HeldMasterLease{Key: string(kv.Key), TTL: ttl.TTL, GrantedTTL: ttl.GrantedTTL})
		}
	}
	return nil
}

// describe fills in what a written value says of its writer: an identity
// lease's kind, node and renewTime (an encrypted or undecodable lease is
// judged by its name).
func describe(prefix string, value []byte, w *Write) {
	if !strings.HasPrefix(w.Key, prefix+"/leases/kube-system/") {
		return
	}
	obj, _, err := leaseDecoder.Decode(value, nil, nil)
	if err != nil {
		return
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	if l.Labels["apiserver.kubernetes.io/identity"] == "kube-apiserver" {
		w.Kind = IdentityLease
	}
	if w.Kind == IdentityLease {
		w.Host = l.Labels["kubernetes.io/hostname"]
		if l.Spec.RenewTime != nil {
			t := l.Spec.RenewTime.Time
			w.RenewTime = &t
		}
	}
}

// WriterError stops a run: etcd showed a write under the prefix, after the
// window, that is not one of the run's own.
type WriterError struct {
	Prefix string
	// Since is the revision the window ended at: the writes named came after it.
	Since int64
	// Writes are the keys written (first seen first), More those past the
	// bound; a delete is one etcd did not make for an expired lease.
	Writes []Write
	More   int
	// APIServers are the kube-apiserver identity leases written since the
	// window began, as etcd held them when the run ended (Settle).
	APIServers []Write
}

func (e *WriterError) Error() string {
	var ws []string
	named := map[string]bool{}
	for i, w := range e.Writes {
		if i == maxListed {
			ws = append(ws, fmt.Sprintf("and %d more", len(e.Writes)-maxListed+e.More))
			break
		}
		named[w.Key] = true
		ws = append(ws, w.atRevision())
	}
	s := fmt.Sprintf("stopped: a writer appeared: etcd shows %d key(s) under %s written after revision %d that are not this run's writes: %s",
		len(e.Writes)+e.More, e.Prefix, e.Since, strings.Join(ws, "; "))
	var as []string
	for _, w := range e.APIServers {
		if named[w.Key] {
			continue
		}
		if len(as) == maxListed {
			as = append(as, "and more")
			break
		}
		as = append(as, w.atRevision())
	}
	if len(as) > 0 {
		s += fmt.Sprintf("; kube-apiserver identity lease(s) written meanwhile: %s", strings.Join(as, "; "))
	}
	return s + "; nothing more was sent, the writes in flight finished and are journaled: stop every kube-apiserver (on every node named) and any tool writing etcd directly, then run again (it picks up from what was written), or roll this run back"
}

// atRevision names a write of the run's time: who (a node, when a lease
// says), the key, and the revision.
func (w Write) atRevision() string {
	s := w.Key
	if w.Host != "" {
		s = w.Host + ": " + s
	}
	verb := "written"
	if w.Deleted {
		verb = "deleted"
	}
	if w.Writes > 1 {
		s += fmt.Sprintf(" %s %s, last at revision %d", verb, times(w.Writes), w.ModRevision)
	} else {
		s += fmt.Sprintf(" %s at revision %d", verb, w.ModRevision)
	}
	if w.Kind == IdentityLease {
		s += " (a kube-apiserver's identity lease)"
	} else if w.Kind == MasterLease {
		s += " (a kube-apiserver's master lease)"
	}
	return s
}
