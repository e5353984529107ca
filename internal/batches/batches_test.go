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
