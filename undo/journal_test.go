package undo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kube-etcd-migrate/etcdscan"
)

// intentsOf is one batch of n rewrites of keys named after batch b.
func intentsOf(b, n int) ([]etcdscan.Put, [][]byte) {
	puts, old := make([]etcdscan.Put, n), make([][]byte, n)
	for i := range puts {
		puts[i] = etcdscan.Put{Key: fmt.Sprintf("/registry/secrets/ns/b%d-%d", b, i), Value: []byte("new"), ModRevision: int64(10 + i)}
		old[i] = []byte(fmt.Sprintf("k8s:enc:aescbc:v1:key1:old value of batch %d, key %d", b, i))
	}
	return puts, old
}

// TestJournalGroupCommit: batches journaled at once share their fsyncs (the
// ones that wait while one is in progress are all covered by the next), and
// the journal they leave verifies, every intent in it once; a failed fsync
// fails the batch that waited for it and every one after, and the run's
// checksums are not recorded.
func TestJournalGroupCommit(t *testing.T) {
	ctx := context.Background()
	const batches, size = 24, 16

	path := filepath.Join(t.TempDir(), "journal")
	j, err := OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(100, "/registry"); err != nil {
		t.Fatal(err)
	}
	// The first batch's fsync is held until every other batch has written
	// its records and waits for its own: then one more covers them all.
	var syncs atomic.Int32
	release := make(chan struct{})
	syncFile = func(f *os.File) error {
		if syncs.Add(1) == 1 {
			<-release
		}
		return f.Sync()
	}
	defer func() { syncFile = (*os.File).Sync }()
	var wg sync.WaitGroup
	errs := make(chan error, batches)
	for b := 0; b < batches; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			puts, old := intentsOf(b, size)
			errs <- j.Intents(puts, old)
		}()
	}
	written := int64(1 + batches*size) // begin and every intent
	for deadline := time.Now().Add(30 * time.Second); ; {
		j.mu.Lock()
		w := j.written
		j.mu.Unlock()
		if w == written {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the batches wrote %d records of %d", w, written)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := syncs.Load(); n != 2 {
		t.Errorf("%d batches journaled at once took %d fsyncs, want 2 (the one in progress, then one for all the others)", batches, n)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	jc, err := CheckJournal(ctx, JournalSpec{Path: path}, CheckOptions{})
	if err != nil || jc.Status != JournalVerified || jc.Records != written+1 || !jc.Closed {
		t.Fatalf("journal of concurrent batches: %+v %v", jc, err)
	}
	seen := map[string]int{}
	if err := ReadJournal(path, func(r JournalRecord) error {
		if r.Op == "intent" {
			seen[r.Key]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != batches*size {
		t.Errorf("%d keys journaled, want %d", len(seen), batches*size)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s journaled %d times", k, n)
		}
	}

	// A failed fsync: the batch waiting for it fails, and so does every
	// batch after it, though the file would take their records.
	syncs.Store(0)
	syncFile = func(f *os.File) error {
		if syncs.Add(1) == 2 {
			return &os.PathError{Op: "fsync", Path: f.Name(), Err: syscall.EIO}
		}
		return f.Sync()
	}
	path = filepath.Join(t.TempDir(), "journal")
	if j, err = OpenJournal(path); err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(100, "/registry"); err != nil {
		t.Fatal(err)
	}
	puts, old := intentsOf(0, size)
	err = j.Intents(puts, old)
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "journal "+path) {
		t.Fatalf("intents whose fsync failed: %v, want the fsync's error naming the journal", err)
	}
	puts, old = intentsOf(1, size)
	if err2 := j.Intents(puts, old); !errors.Is(err2, syscall.EIO) {
		t.Fatalf("intents after a failed fsync: %v, want the same failure", err2)
	}
	if n := syncs.Load(); n != 2 {
		t.Errorf("%d fsyncs after the failed one, want none", n-2)
	}
	if err := j.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("closing a journal whose fsync failed: %v", err)
	}
	if _, ok := recall(path); ok {
		t.Error("a failed journal's checksums were recorded for its run")
	}
}
