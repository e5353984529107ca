package migrate

import (
	"context"
	"sync"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/reencode"
)

// backlog lets a run's reading and deciding go on while its writers have
// no room for its decisions (the space guard waiting for a compaction to
// free room below etcd's quota, etcd's slow commits): what the writers'
// queue does not take at once is kept in an guard.Backlog in the run
// directory, up to the room the preflight left there, and a goroutine of its
// own (the feeder) hands it to the writers, oldest first, as they take it.
// The cores the waiting writes leave idle decide what comes next, instead of
// deciding it later beside the writes. Once the backlog is full, or its
// disk failed, the scan waits for the writers as it would without one.
type backlog struct {
	dir    string
	room   int64
	pool   *batches.Pool[reencode.Decision]
	cancel func() // the run's: a batch that does not read back stops it

	q      *guard.Backlog[reencode.Decision]
	closed bool          // not opened again (it could not be, or it ended)
	wake   chan struct{} // a batch was kept
	drain  chan struct{} // closed: the scan ended, the feeder ends once it is empty
	stop   context.CancelFunc
	done   chan struct{} // closed when the feeder ended
	mu     sync.Mutex
	err    error // the feeder's
}

// newBacklog keeps decisions in dir, up to room bytes (none: it only sends).
func newBacklog(dir string, room int64, pool *batches.Pool[reencode.Decision], cancel func()) *backlog {
	return &backlog{dir: dir, room: room, pool: pool, cancel: cancel, closed: dir == "" || room <= 0}
}

// send hands ds to the writers if their queue takes it at once and nothing
// is kept before it, else keeps it, else waits for the writers to take it.
// Only one goroutine calls it (the scan's).
func (b *backlog) send(ctx context.Context, ds []reencode.Decision) error {
	if err := b.failed(); err != nil {
		return err
	}
	if b.q == nil || b.q.Len() == 0 {
		if ds = b.pool.TrySend(ds); len(ds) == 0 {
			return nil
		}
	}
	if b.open(ctx) && b.q.Push(ds) {
		select {
		case b.wake <- struct{}{}:
		default:
		}
		return nil
	}
	return b.pool.Send(ctx, ds)
}

// open opens the backlog at its first batch and starts its feeder; false
// when it cannot (the run goes on without one).
func (b *backlog) open(ctx context.Context) bool {
	if b.q != nil || b.closed {
		return b.q != nil
	}
	q, err := guard.OpenBacklog[reencode.Decision](b.dir, b.room)
	if err != nil {
		b.closed = true
		return false
	}
	b.q = q
	b.wake, b.drain, b.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	ctx, b.stop = context.WithCancel(ctx)
	go b.feed(ctx)
	return true
}

// feed hands what is kept to the writers, oldest first, until the scan
// ended and nothing is left (drain) or the run stops.
func (b *backlog) feed(ctx context.Context) {
	defer close(b.done)
	for {
		batch, ok, err := b.q.Pop()
		if err != nil {
			b.mu.Lock()
			b.err = err
			b.mu.Unlock()
			b.cancel()
			return
		}
		if ok {
			if b.pool.Send(ctx, batch) != nil {
				return // the run stops: its error is the writers' or its own
			}
			continue
		}
		select {
		case <-b.wake:
		case <-b.drain:
			if b.q.Len() == 0 {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// failed is the feeder's error, if any.
func (b *backlog) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// finish ends the backlog once the scan has ended: with send true, after
// handing the writers everything kept; else dropping it (a run that stops
// sends nothing more). It returns the feeder's error, if any, and frees the
// backlog's disk; the writers' queue may be closed after it.
func (b *backlog) finish(send bool) error {
	b.closed = true
	if b.q == nil {
		return nil
	}
	if !send {
		b.stop()
	}
	close(b.drain)
	<-b.done
	b.stop()
	b.q.Close()
	return b.failed()
}

// kept is the number of batches the backlog took.
func (b *backlog) kept() int {
	if b.q == nil {
		return 0
	}
	return b.q.Pushed()
}
