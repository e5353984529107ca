package batches

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestPoolBatchesSettlesAndStops: items are cut into batches of the size
// given, every one written once; Settle returns only once all sent are
// written; the first error stops the sender (cancel) and is returned, and a
// panic in a batch is an error, not a crash.
func TestPoolBatchesSettlesAndStops(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	var written atomic.Int64
	p := Start(4, 3, func() {}, func(b []int) error {
		if len(b) > 3 {
			t.Errorf("batch of %d, want at most 3", len(b))
		}
		mu.Lock()
		for _, v := range b {
			seen[v]++
		}
		mu.Unlock()
		written.Add(int64(len(b)))
		return nil
	})
	items := make([]int, 100)
	for i := range items {
		items[i] = i
	}
	if err := p.Send(context.Background(), items[:50]); err != nil {
		t.Fatal(err)
	}
	p.Settle()
	if n := written.Load(); n != 50 {
		t.Fatalf("after Settle: %d written, want 50", n)
	}
	if err := p.Send(context.Background(), items[50:]); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if seen[i] != 1 {
			t.Errorf("item %d written %d times", i, seen[i])
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	boom := errors.New("boom")
	p = Start(2, 1, cancel, func(b []int) error {
		if b[0] == 3 {
			return boom
		}
		if b[0] == 5 {
			panic("a bug")
		}
		return nil
	})
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = p.Send(ctx, []int{i})
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Send after the error: %v, want the run's context canceled", err)
	}
	if werr := p.Wait(); werr == nil {
		t.Error("Wait: no error")
	}
}

// TestTrySendTakesWhatFitsNow: TrySend queues the batches the queue has room
// for without waiting and gives back the rest, untouched; what it queued is
// written once, as Send's is.
func TestTrySendTakesWhatFitsNow(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var seen []int
	p := Start(1, 2, func() {}, func(b []int) error {
		<-release
		mu.Lock()
		seen = append(seen, b...)
		mu.Unlock()
		return nil
	})
	items := make([]int, 20)
	for i := range items {
		items[i] = i
	}
	// One writer holds a batch, the queue (one place) another: the first
	// TrySend may find the writer not yet started, so at most 2 batches of 2.
	rest := p.TrySend(items)
	if len(rest) < 16 || len(rest) > 18 || rest[0] != 20-len(rest) {
		t.Fatalf("TrySend with one writer blocked left %v", rest)
	}
	again := p.TrySend(rest)
	for len(again) == len(rest) && len(rest) > 16 {
		again = p.TrySend(rest) // the writer took its batch: one more place
	}
	if len(again) != 16 {
		t.Fatalf("a full queue took %d items", len(rest)-len(again))
	}
	close(release)
	if err := p.Send(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 20 {
		t.Fatalf("%d items written, want 20: %v", len(seen), seen)
	}
}
