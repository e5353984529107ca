package undo

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// pruneFixture is a state directory with the runs an operator's history
// leaves: 0001 a migration that finished; 0002 one killed part-way (its
// journal written, no end), 0003 its rerun stopped by another writer (exit
// 5), 0004 the rerun that finished the change; 0005 a rollback; 0006 a run
// refused before its first write (no journal); 0007 a migration whose
// journal is outside the state directory (--journal).
func pruneFixture(t *testing.T) (StateDir, string) {
	t.Helper()
	dir := StateDir(filepath.Join(t.TempDir(), "state"))
	outside := filepath.Join(t.TempDir(), "journal-0007")
	type step struct {
		command string
		journal bool
		exit    int // -1: killed (no end)
		keys    int64
	}
	for _, s := range []step{
		{"migrate", true, 0, 10},
		{"migrate", true, -1, 0},
		{"migrate", true, 5, 4},
		{"migrate", true, 0, 6},
		{"rollback", true, 0, 20},
		{"migrate", false, 1, 0},
		{"migrate", true, 0, 3},
	} {
		st, err := dir.Open()
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.NewRun(s.command, nil, "/registry")
		if err != nil {
			t.Fatal(err)
		}
		if r.Seq == 7 {
			if err := r.SetJournal(outside); err != nil {
				t.Fatal(err)
			}
		}
		if s.journal {
			if err := os.WriteFile(r.Journal, []byte(strings.Repeat("j", 1000)), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(r.Snapshot, []byte(strings.Repeat("s", 4000)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if s.exit >= 0 {
			if err := r.Finish(s.exit, s.keys, nil); err != nil {
				t.Fatal(err)
			}
		} else {
			r.Release() // killed: its process, and its lock, gone
		}
		st.Close()
	}
	return dir, outside
}

func ids(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func removedIDs(res PruneResult) []string {
	var out []string
	for _, r := range res.Removed {
		out = append(out, r.ID)
	}
	return out
}

// TestPruneGroupsGapsAndLock: what 'runs --prune' removes, dry run and not.
// Never a gap: only the oldest runs go, and every run kept can be undone
// with every later one (Since) afterwards. Never the run a kept run's
// rollback needs: the killed run 0002 and its reruns 0003 and 0004 go or
// stay together (0002's snapshot is the state before their change). Never
// while another process holds the state directory (a run going on).
func TestPruneGroupsGapsAndLock(t *testing.T) {
	dir, outside := pruneFixture(t)
	recs, err := dir.List()
	if err != nil || len(recs) != 7 {
		t.Fatalf("fixture: %v %v", ids(recs), err)
	}
	if g := Groups(recs); len(g) != 1 || g[0].First != 1 || g[0].Last != 3 {
		t.Fatalf("groups: %+v, want 0002..0004", g)
	}

	for _, tc := range []struct {
		opts          PruneOptions
		removed, held []string
	}{
		// The newest 4 would start at 0004: its group, 0002 and 0003, stays.
		{PruneOptions{Keep: 4}, []string{"0001-migrate"}, []string{"0002-migrate", "0003-migrate"}},
		{PruneOptions{Keep: 3}, []string{"0001-migrate", "0002-migrate", "0003-migrate", "0004-migrate"}, nil},
		{PruneOptions{Keep: 7}, nil, nil},
		{PruneOptions{Keep: 100}, nil, nil},
		{PruneOptions{Before: "3"}, []string{"0001-migrate"}, []string{"0002-migrate"}},
		{PruneOptions{Before: "0005-rollback"}, []string{"0001-migrate", "0002-migrate", "0003-migrate", "0004-migrate"}, nil},
		{PruneOptions{Before: "1"}, nil, nil},
	} {
		tc.opts.DryRun = true
		res, err := dir.Prune(tc.opts)
		if err != nil {
			t.Fatalf("%+v: %v", tc.opts, err)
		}
		var held []string
		for _, h := range res.Held {
			held = append(held, h.ID)
			if h.With != "0004-migrate" && h.With != "0003-migrate" || !strings.Contains(h.Why, "run 0002-migrate was killed") {
				t.Errorf("%+v: held %+v", tc.opts, h)
			}
		}
		if !slices.Equal(removedIDs(res), tc.removed) || !slices.Equal(held, tc.held) {
			t.Errorf("%+v: removes %v holding %v, want %v holding %v", tc.opts, removedIDs(res), held, tc.removed, tc.held)
		}
		if len(res.Removed)+len(res.Kept) != 7 {
			t.Errorf("%+v: %d removed + %d kept", tc.opts, len(res.Removed), len(res.Kept))
		}
	}
	if _, err := dir.Prune(PruneOptions{Before: "9", DryRun: true}); !errors.As(err, new(*NotFoundError)) {
		t.Errorf("--before a run that is not there: %v", err)
	}

	// The dry run removed nothing, and says what the real one frees.
	dry, err := dir.Prune(PruneOptions{Keep: 3, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if after, _ := dir.List(); len(after) != 7 {
		t.Fatalf("the dry run removed runs: %v", ids(after))
	}
	if dry.Freed < 4*5000 {
		t.Errorf("the dry run frees %d bytes, want at least the 4 runs' journals and snapshots", dry.Freed)
	}

	// Held by another process (a run going on): refused, dry run or not.
	st, err := dir.Open()
	if err != nil {
		t.Fatal(err)
	}
	var le *LockedError
	for _, dry := range []bool{true, false} {
		if _, err := dir.Prune(PruneOptions{Keep: 1, DryRun: dry}); !errors.As(err, &le) {
			t.Errorf("prune (dry run %v) while the state directory is held: %v", dry, err)
		}
	}
	st.Close()

	// A run whose process still holds its directory (running): never removed.
	d, err := os.Open(filepath.Join(string(dir), "runs", "0002-migrate"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Prune(PruneOptions{Keep: 3}); err == nil || !strings.Contains(err.Error(), "run 0002-migrate has no end recorded and its process still holds its directory") {
		t.Errorf("prune of a running run: %v", err)
	}
	d.Close()

	res, err := dir.Prune(PruneOptions{Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Freed != dry.Freed || !slices.Equal(removedIDs(res), removedIDs(dry)) {
		t.Errorf("the prune removed %v (%d bytes), its dry run said %v (%d)", removedIDs(res), res.Freed, removedIDs(dry), dry.Freed)
	}
	left, err := dir.List()
	if err != nil || !slices.Equal(ids(left), []string{"0005-rollback", "0006-migrate", "0007-migrate"}) {
		t.Fatalf("left: %v %v", ids(left), err)
	}
	// No gap: every run kept is undone with every later one.
	for i, r := range left {
		since, err := dir.Since(r.ID)
		if err != nil || !slices.Equal(ids(since), ids(left[i:])) {
			t.Errorf("Since(%s) after the prune: %v %v", r.ID, ids(since), err)
		}
	}
	if missing, err := dir.Missing(left); err != nil || len(missing) != 0 {
		t.Errorf("missing after the prune: %+v %v", missing, err)
	}
	// The journal outside the state directory is named, never removed.
	if r := res.Removed; len(r) != 4 {
		t.Fatalf("removed %v", removedIDs(res))
	}
	res2, err := dir.Prune(PruneOptions{Before: "7"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removedIDs(res2), []string{"0005-rollback", "0006-migrate"}) {
		t.Errorf("second prune removed %v", removedIDs(res2))
	}
	res3, err := dir.Prune(PruneOptions{Keep: 1})
	if err != nil || len(res3.Removed) != 0 {
		t.Fatalf("keep 1 of 1: %+v %v", res3, err)
	}
	// Its number is never given again; the outside journal stays.
	st, err = dir.Open()
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.NewRun("migrate", nil, "/registry")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if r.ID != "0008-migrate" {
		t.Errorf("the run after the prune is %s, want 0008-migrate", r.ID)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the journal outside the state directory: %v", err)
	}
}

// TestPruneNamesFilesOutside: a run whose journal is outside its run
// directory is removed with that file named and left in place.
func TestPruneNamesFilesOutside(t *testing.T) {
	dir, outside := pruneFixture(t)
	if err := os.WriteFile(outside, []byte("journal"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := dir.Open()
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.NewRun("migrate", nil, "/registry")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Finish(0, 0, nil); err != nil {
		t.Fatal(err)
	}
	st.Close()
	res, err := dir.Prune(PruneOptions{Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	var named bool
	for _, p := range res.Removed {
		if p.ID == "0007-migrate" {
			named = slices.Equal(p.Outside, []string{outside})
		}
	}
	if !named {
		t.Errorf("the journal outside is not named: %+v", res.Removed)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the journal outside was removed: %v", err)
	}
}
