package migrate

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/undo"
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
	sum, err := Run(ctx, s.env(), Options{PreflightOptions: undo.PreflightOptions{LivenessWindow: time.Millisecond, Journal: journal,
		QuotaBackendBytes: undo.DefaultQuotaBackendBytes}, Writers: 1, BatchOps: 1})
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
