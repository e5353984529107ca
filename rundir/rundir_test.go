package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunsNumberedNeverReused: runs are numbered in order, a directory is
// never reused (even one whose record was lost), Since finds a run by ID or
// number, and a run whose record does not read is still listed with its
// journal.
func TestRunsNumberedNeverReused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := st.NewRun("migrate", nil, "/registry")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Finish(0, 3, map[string]int{"rewritten": 3}); err != nil {
		t.Fatal(err)
	}
	// A directory with no record (the record lost) keeps its number.
	if err := os.Mkdir(filepath.Join(dir, "runs", "0002-migrate"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "runs", "0002-migrate", JournalFile), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := st.NewRun("rollback", nil, "/registry")
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != "0003-rollback" {
		t.Fatalf("third run %s, want 0003-rollback", b.ID)
	}
	st.Close()
	recs, err := List(dir)
	if err != nil || len(recs) != 3 {
		t.Fatalf("List: %+v %v", recs, err)
	}
	if !recs[0].Finished() || recs[0].KeysWritten != 3 || recs[2].Finished() {
		t.Errorf("records: %+v", recs)
	}
	if !strings.HasPrefix(recs[1].Command, "unreadable record") || recs[1].Journal != filepath.Join(dir, "runs", "0002-migrate", JournalFile) {
		t.Errorf("the run with no record: %+v", recs[1])
	}
	for _, id := range []string{"2", "0002-migrate", "02"} {
		since, err := Since(dir, id)
		if err != nil || len(since) != 2 || since[0].ID != "0002-migrate" {
			t.Errorf("Since(%q): %+v %v", id, since, err)
		}
	}
	var nf *NotFoundError
	if _, err := Since(dir, "9"); !errors.As(err, &nf) {
		t.Errorf("Since(9): %v, want NotFoundError", err)
	}
}

// TestStateDirPrivateAndLocked: a state directory others may read is refused
// with the remedy, and a second Open while one holds it is a LockedError.
func TestStateDirPrivateAndLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "chmod 700") {
		t.Fatalf("Open of a 0755 directory: %v", err)
	}
	if err := Check(dir); err == nil {
		t.Fatal("Check of a 0755 directory passed")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var le *LockedError
	if _, err := Open(dir); !errors.As(err, &le) || !strings.Contains(le.Holder, "pid ") {
		t.Fatalf("second Open: %v", err)
	}
	if err := Check(dir); !errors.As(err, &le) {
		t.Fatalf("Check while held: %v", err)
	}
	st.Close()
	if err := Check(dir); err != nil {
		t.Fatalf("Check once released: %v", err)
	}
}
