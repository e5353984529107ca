package liveness

import (
	"crypto/sha256"
)

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
// known allow, then accounts for the revisions etcd's watch is not open for
// (w.mu held).
func (w *Watch) judge() {
	defer w.signal()
	defer w.checkGap()
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

// checkGap, once the run writes and etcd's watch is closed (onDemand, not
// watching), moves seen over the run's own revisions, which need no event,
// and confirms a gap: a revision etcd has reached (latest, or one a waiter
// read) that is not the run's. A request announced before the gap was
// noticed may still be answered with that revision; one announced after
// cannot (it is applied after every revision known then), so the gap is
// confirmed once the requests announced up to then have their outcomes, and
// the loop opens etcd's watch from it (needWatch): the revision is somebody
// else's write, one of the run's whose outcome is unknown, etcd expiring a
// lease, or a write outside the prefix, and is judged as any event is;
// until it is, Begin waits (holdTo) (w.mu held).
func (w *Watch) checkGap() {
	if !w.onDemand || w.watching || w.failed != nil {
		return
	}
	for {
		if _, ok := w.own[w.seen+1]; !ok {
			break
		}
		w.seen++
	}
	if len(w.pending) > 0 || w.seen >= max(w.latest, w.want) {
		w.gapAt, w.gapSeq = 0, 0
		return
	}
	if w.gapAt != w.seen+1 {
		w.gapAt, w.gapSeq = w.seen+1, w.seq
	}
	if w.blocked(w.gapSeq) {
		return
	}
	if !w.needWatch {
		w.needWatch = true
		w.holdTo = max(w.latest, w.want)
		w.wake()
	}
}
