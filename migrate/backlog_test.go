package migrate

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/reencode"
)

// TestBacklogWhileWritesWait: with one writer of one-key transactions, far
// slower than the reading and deciding, what the writers cannot take yet
// is kept on disk and the scan goes on; every stale secret is still
// rewritten once (the journal records each once, a second pass finds them
// all current), the writes before the window's end none, and nothing of the
// backlog is left in the run directory.
func TestBacklogWhileWritesWait(t *testing.T) {
	s := seedSpace(t, 0)
	ctx := context.Background()
	journal := filepath.Join(s.c.Dir, "run", "journal")
	if err := os.MkdirAll(filepath.Dir(journal), 0o700); err != nil {
		t.Fatal(err)
	}
	before := s.c.Revision()
	sum, err := Run(ctx, s.env(), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: time.Millisecond, Journal: journal,
		QuotaBackendBytes: guard.DefaultQuotaBackendBytes}, Writers: 1, BatchOps: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Summary.Rewritten != spaceSecrets || sum.Summary.Failed != 0 || sum.Summary.Conflicts != 0 {
		t.Fatalf("summary %+v", sum.Summary)
	}
	if sum.Backlog == 0 {
		t.Fatal("the writers never fell behind the scan: nothing was kept in the backlog")
	}
	if n := journalDone(t, journal); n != spaceSecrets {
		t.Fatalf("the journal records %d keys written, want %d", n, spaceSecrets)
	}
	if got := s.c.Revision() - before; got != spaceSecrets {
		t.Fatalf("%d revisions written, want one per secret (%d)", got, spaceSecrets)
	}
	again := run(t, s.env(), Options{DryRun: true})
	if again.Summary.Stale != 0 || again.Summary.Current != spaceSecrets {
		t.Fatalf("after the run: %+v", again.Summary)
	}
	ents, err := os.ReadDir(filepath.Dir(journal))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".backlog") || strings.HasPrefix(e.Name(), ".spool") {
			t.Errorf("left in the run directory: %s", e.Name())
		}
	}
	t.Logf("%d batches kept in the backlog", sum.Backlog)
}

// TestHeldThenBacklogWhileFirstWriteWaits: while the first write waits,
// decisions past the holder's room go to the backlog and the scan goes on
// (none of its sends waits for the writers, which wait for the first
// write's end); then every decision is written exactly once, the held and
// the backlogged ones alike, and nothing is left in the run directory.
func TestHeldThenBacklogWhileFirstWriteWaits(t *testing.T) {
	dir := t.TempDir()
	open := make(chan struct{})
	var mu sync.Mutex
	written := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws := batches.Start(2, 4, cancel, func(ds []reencode.Decision) error {
		<-open // as the writers wait for FirstWrite.Open
		mu.Lock()
		for _, d := range ds {
			written[d.Key]++
		}
		mu.Unlock()
		return nil
	})
	hold := newHolder(dir, 200<<10, func() { <-open })
	bl := newBacklog(dir, 8<<20, ws, cancel)
	page := func(p int) []reencode.Decision {
		ds := make([]reencode.Decision, 10)
		for i := range ds {
			ds[i] = reencode.Decision{Key: fmt.Sprintf("/registry/secrets/ns/%d-%d", p, i), Status: reencode.Stale,
				OldValue: bytes.Repeat([]byte{1}, 1000), NewValue: bytes.Repeat([]byte{2}, 1000)}
		}
		return ds
	}
	const pages = 200 // about 4 MB: twenty times the holder's room, half the backlog's
	sendHeld := ws.Send
	for p := 0; p < pages; p++ {
		done := make(chan error, 1)
		go func() { done <- hold.send(ctx, page(p), bl.send, sendHeld) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("page %d waited for the writers while the first write waits: neither held nor kept", p)
		}
	}
	if bl.kept() == 0 {
		t.Fatal("nothing past the holder's room went to the backlog")
	}
	close(open)
	if err := hold.release(ctx, sendHeld); err != nil {
		t.Fatal(err)
	}
	hold.close()
	if err := bl.finish(true); err != nil {
		t.Fatal(err)
	}
	if err := ws.Wait(); err != nil {
		t.Fatal(err)
	}
	hold.wait()
	if len(written) != pages*10 {
		t.Fatalf("%d keys written, want %d", len(written), pages*10)
	}
	for k, n := range written {
		if n != 1 {
			t.Fatalf("%s written %d times", k, n)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left in the run directory: %v", ents)
	}
}
