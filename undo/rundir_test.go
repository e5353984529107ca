package undo

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
	st, err := StateDir(dir).Open()
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
	recs, err := StateDir(dir).List()
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
		since, err := StateDir(dir).Since(id)
		if err != nil || len(since) != 2 || since[0].ID != "0002-migrate" {
			t.Errorf("Since(%q): %+v %v", id, since, err)
		}
	}
	var nf *NotFoundError
	if _, err := StateDir(dir).Since("9"); !errors.As(err, &nf) {
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
	if _, err := StateDir(dir).Open(); err == nil || !strings.Contains(err.Error(), "chmod 700") {
		t.Fatalf("Open of a 0755 directory: %v", err)
	}
	if err := StateDir(dir).Check(); err == nil {
		t.Fatal("Check of a 0755 directory passed")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := StateDir(dir).Open()
	if err != nil {
		t.Fatal(err)
	}
	var le *LockedError
	if _, err := StateDir(dir).Open(); !errors.As(err, &le) || !strings.Contains(le.Holder, "pid ") {
		t.Fatalf("second Open: %v", err)
	}
	if err := StateDir(dir).Check(); !errors.As(err, &le) {
		t.Fatalf("Check while held: %v", err)
	}
	st.Close()
	if err := StateDir(dir).Check(); err != nil {
		t.Fatalf("Check once released: %v", err)
	}
}

// TestSinceRefusesARemovedRun: a run directory removed by hand takes its undo
// with it, so undoing an earlier run and every later one would leave what it
// wrote in place: Since refuses, naming the missing runs — the newest one too,
// which only the state directory's log shows — and the run after the gap. A
// removed run that the log says ended having written nothing (a refused run)
// needs no undo: it does not stop the rollback. A removed run's number is never
// given again.
func TestSinceRefusesARemovedRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st, err := StateDir(dir).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var runs []*Run
	for range 3 {
		runs = append(runs, newRun(t, st, "migrate"))
	}
	must(t, os.RemoveAll(runs[1].Dir))
	var gap *GapError
	_, err = StateDir(dir).Since("1")
	if !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0002-migrate" || gap.Next != "0003-migrate" || gap.From.ID != "0001-migrate" {
		t.Fatalf("Since(1) with run 2 removed: %v (%+v)", err, gap)
	}
	if want := "run 0002-migrate is missing from " + filepath.Join(dir, "runs") + " (removed after run 0001-migrate)"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if since, err := StateDir(dir).Since("3"); err != nil || len(since) != 1 {
		t.Errorf("Since(3), nothing missing after it: %+v %v", since, err)
	}

	// The newest run removed too (still running, or killed: no end logged):
	// only the log shows it.
	must(t, os.RemoveAll(runs[2].Dir))
	_, err = StateDir(dir).Since("0001-migrate")
	if !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0002-migrate,0003-migrate" || gap.Next != "" {
		t.Fatalf("Since(1) with runs 2 and 3 removed: %v (%+v)", err, gap)
	}
	if !strings.Contains(err.Error(), "runs 0002-migrate, 0003-migrate are missing") {
		t.Errorf("error %q", err)
	}
	next, err := st.NewRun("rollback", nil, "/registry")
	if err != nil || next.ID != "0004-rollback" {
		t.Fatalf("the run after a removed newest run: %+v %v, want 0004-rollback", next, err)
	}
	if since, err := StateDir(dir).Since("4"); err != nil || len(since) != 1 {
		t.Errorf("Since(4): %+v %v", since, err)
	}

	// A run that ended having written nothing, then removed: no gap.
	must(t, next.Finish(1, 0, nil))
	refused := newRun(t, st, "migrate")
	must(t, refused.Finish(1, 0, nil))
	after := newRun(t, st, "migrate")
	must(t, os.RemoveAll(refused.Dir))
	if since, err := StateDir(dir).Since("4"); err != nil || len(since) != 2 || since[1].ID != after.ID {
		t.Fatalf("Since(4) past a removed run that wrote nothing: %+v %v", since, err)
	}
	missing, err := StateDir(dir).Missing([]Record{runs[0].Record})
	if err != nil || len(missing) != 3 || missing[2] != (MissingRun{ID: "0005-migrate", Seq: 5, WroteNothing: true}) || missing[0].WroteNothing || missing[1].WroteNothing {
		t.Fatalf("Missing: %+v %v", missing, err)
	}
	// One that confirmed no write but had opened its journal (a write may
	// have landed unconfirmed) is a gap.
	j, err := OpenJournal(after.Journal)
	must(t, err)
	must(t, j.Close())
	must(t, after.Finish(1, 0, nil))
	last := newRun(t, st, "migrate")
	must(t, os.RemoveAll(after.Dir))
	if _, err := StateDir(dir).Since("4"); !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0006-migrate" || gap.Next != last.ID {
		t.Fatalf("Since(4) past a removed run that had a journal: %v (%+v)", err, gap)
	}

	// A state directory an older release made has no log: a gap between two
	// listed runs is still seen (by number).
	if err := os.Remove(filepath.Join(dir, logFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := StateDir(dir).Since("1"); !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0002,0003,0005,0006" || gap.Next != "0007-migrate" {
		t.Fatalf("Since(1) without the log: %v (%+v)", err, gap)
	}
}

// newRun is st.NewRun of command, failing the test on an error.
func newRun(t *testing.T, st *State, command string) *Run {
	t.Helper()
	r, err := st.NewRun(command, nil, "/registry")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunsLogPastDamagedLines: a log with a block of zeros a crash left
// (longer than any line) and a torn last line still numbers and finds the
// runs around them, and the next run's line is whole.
func TestRunsLogPastDamagedLines(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st, err := StateDir(dir).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := filepath.Join(dir, logFile)
	appendBytes := func(b []byte) {
		t.Helper()
		f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0o600)
		must(t, err)
		_, err = f.Write(b)
		must(t, err)
		must(t, f.Close())
	}
	first := newRun(t, st, "migrate")
	must(t, first.Finish(0, 1, nil))
	second := newRun(t, st, "migrate")
	appendBytes(append(make([]byte, 200<<10), '\n'))
	third := newRun(t, st, "migrate")
	appendBytes(make([]byte, 100<<10)) // torn: no newline
	must(t, os.RemoveAll(second.Dir))

	var gap *GapError
	if _, err := StateDir(dir).Since("1"); !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0002-migrate" || gap.Next != third.ID {
		t.Fatalf("Since(1) with run 2 removed, past a 200 KiB line: %v (%+v)", err, gap)
	}
	fourth := newRun(t, st, "rollback")
	if fourth.ID != "0004-rollback" {
		t.Fatalf("the run after a torn last line: %s, want 0004-rollback", fourth.ID)
	}
	must(t, os.RemoveAll(fourth.Dir))
	if _, err := StateDir(dir).Since("3"); !errors.As(err, &gap) || strings.Join(gap.Missing, ",") != "0004-rollback" {
		t.Fatalf("Since(3) with the run logged after a torn line removed: %v (%+v)", err, gap)
	}
}
