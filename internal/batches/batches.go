// Package batches runs a writing run's batches of writes on concurrent
// goroutines, as migrate and rollback both do: etcd's throughput on
// compare-and-swap transactions is bound by its WAL fsyncs, each of which
// commits every transaction that arrived meanwhile, so a run keeps several
// in flight. A Pool takes items through a bounded queue (memory: at most
// twice its goroutines' batches), cuts them into batches of a given size,
// and hands each to the run's write function; the first error (a panic
// included) is kept and stops the run's reading (its cancel), the other
// batches in flight finish. Settle waits for every batch sent so far, for a
// run whose next batch must follow them (a key written again).
package batches

import (
	"context"
	"sync"

	"kube-etcd-migrate/internal/crash"
)

// DefaultWriters is the number of write transactions a run keeps in flight
// by default (migrate's --writers).
const DefaultWriters = 16

// Pool is a run's concurrent writers of batches of T.
type Pool[T any] struct {
	queue chan []T
	size  int
	wg    sync.WaitGroup // the goroutines
	sent  sync.WaitGroup // the batches sent and not yet written
	once  sync.Once
	err   error
}

// Start starts n goroutines (n <= 0: DefaultWriters) that call write with
// each batch sent, of at most size items (size <= 0: as sent); the first
// error write returns calls cancel.
func Start[T any](n, size int, cancel func(), write func([]T) error) *Pool[T] {
	if n <= 0 {
		n = DefaultWriters
	}
	p := &Pool[T]{queue: make(chan []T, n), size: size}
	for i := 0; i < n; i++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for b := range p.queue {
				err := func() (err error) {
					// A panic is the run's error (a batch is journaled
					// before it is written).
					defer crash.Recover("writing a batch", &err)
					return write(b)
				}()
				if err != nil {
					p.once.Do(func() { p.err = err; cancel() })
				}
				p.sent.Done()
			}
		}()
	}
	return p
}

// Send queues items in batches; it returns ctx's error when the run stops
// before they are all queued. Send and TrySend may be called from several
// goroutines; Settle and Wait only once none is sending.
func (p *Pool[T]) Send(ctx context.Context, items []T) error {
	if len(p.put(items, ctx.Done(), true)) > 0 {
		return ctx.Err()
	}
	return nil
}

// TrySend queues as many of items' batches as the queue takes at once,
// without waiting, and returns the rest (nil when it took them all).
func (p *Pool[T]) TrySend(items []T) []T { return p.put(items, nil, false) }

// put queues items in batches of at most p.size, each waiting for room in
// the queue (wait) until done is closed, or not at all, and returns the
// items not queued.
func (p *Pool[T]) put(items []T, done <-chan struct{}, wait bool) []T {
	for len(items) > 0 {
		n := len(items)
		if p.size > 0 {
			n = min(p.size, n)
		}
		p.sent.Add(1)
		if !p.offer(items[:n:n], done, wait) {
			p.sent.Done()
			return items
		}
		items = items[n:]
	}
	return nil
}

// offer puts one batch in the queue, waiting for room (wait) until done is
// closed, or not at all; false when it was not queued.
func (p *Pool[T]) offer(b []T, done <-chan struct{}, wait bool) bool {
	if !wait {
		select {
		case p.queue <- b:
			return true
		default:
			return false
		}
	}
	select {
	case p.queue <- b:
		return true
	case <-done:
		return false
	}
}

// Settle waits until every batch sent so far is written (or failed).
func (p *Pool[T]) Settle() { p.sent.Wait() }

// Wait closes the queue, waits for the batches in flight and returns the
// first error.
func (p *Pool[T]) Wait() error {
	close(p.queue)
	p.wg.Wait()
	return p.err
}
