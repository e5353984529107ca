package migrate

import (
	"context"
	"sync"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/reencode"
)

// holder keeps a run's stale decisions while its first write waits (the
// liveness window's verdict, the undo's snapshot), so that the reading and
// deciding of the keyspace go on meanwhile instead of stopping once the
// writers' queue is full: in an guard.Spool in the run directory, as much
// as the room the preflight left there. Its first batch starts the first
// write's wait (open); once the spool is full or fails, the batches after
// it go the way of those after the wait (send: the run's backlog, then the
// writers' queue); once the wait is over, what it holds is sent, in the
// order it was decided, then every batch after it. A nil *holder holds
// nothing.
type holder struct {
	dir  string
	room int64
	open func() // the first write's wait (FirstWrite.Open), its error left to the writers

	started  sync.Once
	ready    chan struct{} // closed once open returned
	spool    *guard.Spool[reencode.Decision]
	released bool
}

// newHolder holds decisions in dir, up to room bytes (nil when there is none).
func newHolder(dir string, room int64, open func()) *holder {
	if dir == "" || room <= 0 {
		return nil
	}
	return &holder{dir: dir, room: room, open: open, ready: make(chan struct{})}
}

// send holds ds while the first write waits and the spool has room, or
// hands it to send while the wait goes on; once the wait is over it sends
// what is held (through sendHeld), then ds. Only one goroutine calls it
// (the scan's).
func (h *holder) send(ctx context.Context, ds []reencode.Decision, send, sendHeld func(context.Context, []reencode.Decision) error) error {
	if h == nil || h.released {
		return send(ctx, ds)
	}
	if len(ds) == 0 {
		return nil
	}
	h.started.Do(func() {
		go func() {
			defer close(h.ready)
			h.open()
		}()
	})
	select {
	case <-h.ready:
	default:
		if h.add(ds) {
			return nil
		}
		// The spool is full: what comes next goes the way of every batch
		// after the wait (send: the run's backlog, while it has room), and
		// what is held waits for the wait's end.
		return send(ctx, ds)
	}
	if err := h.release(ctx, sendHeld); err != nil {
		return err
	}
	return send(ctx, ds)
}

// add keeps ds in the spool, opened at the first batch; false when it
// cannot (no room left, a failed write, no spool).
func (h *holder) add(ds []reencode.Decision) bool {
	if h.spool == nil {
		s, err := guard.OpenSpool[reencode.Decision](h.dir, h.room)
		if err != nil {
			return false // the run goes on as without a spool
		}
		h.spool = s
	}
	var cost int64
	for _, d := range ds {
		cost += int64(len(d.Key) + len(d.OldValue) + len(d.NewValue) + 64)
	}
	return h.spool.Add(ds, cost)
}

// release sends what is held, oldest first, and frees the spool; from then
// on send sends at once.
func (h *holder) release(ctx context.Context, send func(context.Context, []reencode.Decision) error) error {
	if h == nil || h.released {
		return nil
	}
	h.released = true
	if h.spool == nil {
		return nil
	}
	defer h.close()
	return h.spool.Drain(func(ds []reencode.Decision) error { return send(ctx, ds) })
}

// close drops what is still held (a run that stops sends nothing more) and
// frees the spool's disk.
func (h *holder) close() {
	if h == nil {
		return
	}
	h.released = true
	if h.spool != nil {
		h.spool.Close()
		h.spool = nil
	}
}

// wait returns once the first write's wait it started is over: the run
// returns with nothing of it still going on (a snapshot being saved).
func (h *holder) wait() {
	if h == nil {
		return
	}
	h.started.Do(func() { close(h.ready) })
	<-h.ready
}
