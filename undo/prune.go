package undo

// Old runs removed safely ('runs --prune'). The rule:
//
//   - Only the oldest run directories go: what is removed is always the runs
//     up to some run, never one between two that stay. Since, and with it
//     every rollback of a run kept, then finds every later run: pruning never
//     leaves a gap.
//   - Runs go in groups, whole. A run that may have written and did not end
//     with exit code 0 (killed, interrupted, stopped by a writer or an
//     error) left its change part-way: the runs after it, up to the first
//     that ends with exit code 0 having written, finished that change, and
//     the state before it is the first run's snapshot, not a rerun's. So
//     the first run of a group is kept as long as any run of it is: a run
//     kept keeps every earlier run of its group.
//   - A run still going on is never removed: a writing run holds the state
//     directory's lock from before its run directory exists to its end, and
//     the prune takes that lock first (a dry run tests it), so it refuses
//     while another process holds the state directory at all; a run whose
//     process holds its run directory (State: running) is refused too.
//   - --keep N keeps the newest N runs (and the rest of the oldest kept one's
//     group); --before ID removes the runs older than ID (ID's group kept
//     whole). The files of a run kept outside its run directory (migrate
//     --journal or --snapshot, rollback --undo-dir) are not the state
//     directory's: they are named, never removed.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PruneOptions say which runs a prune removes: all but the newest Keep, or
// those older than Before (a run's ID or number). DryRun removes nothing.
type PruneOptions struct {
	Keep   int
	Before string
	DryRun bool
}

// PrunedRun is a run a prune removes (a dry run: would remove).
type PrunedRun struct {
	ID      string `json:"id"`
	Command string `json:"command"`
	Dir     string `json:"dir"`
	// Bytes is what removing its directory frees.
	Bytes int64 `json:"bytes"`
	// Outside are its undo files outside its run directory: left in place.
	Outside []string `json:"outside,omitempty"`
}

// HeldRun is a run the prune keeps though it is older than what was asked
// for: a later run kept is of its group.
type HeldRun struct {
	ID string `json:"id"`
	// With is the run kept that needs it, and Why says how.
	With string `json:"with"`
	Why  string `json:"why"`
}

// PruneResult is what a prune removed, freed and kept.
type PruneResult struct {
	DryRun  bool        `json:"dryRun,omitempty"`
	Removed []PrunedRun `json:"removed"`
	Held    []HeldRun   `json:"held,omitempty"`
	// Kept are the runs left, oldest first.
	Kept []string `json:"kept"`
	// Freed is what the removal frees (a dry run: would free).
	Freed int64 `json:"freedBytes"`
}

// Prune removes the oldest runs of the state directory as the rule above
// says; a dry run says what it would remove. It takes the state
// directory's lock (a *LockedError while another process holds it).
func (d StateDir) Prune(opts PruneOptions) (PruneResult, error) {
	res := PruneResult{DryRun: opts.DryRun}
	if (opts.Keep > 0) == (opts.Before != "") {
		return res, errors.New("prune: keep the newest N runs, or remove those before a run: one of the two")
	}
	var st *State
	var err error
	if opts.DryRun {
		err = d.Check()
	} else {
		st, err = d.Open()
	}
	if err != nil {
		return res, err
	}
	defer st.Close()
	recs, err := d.List()
	if err != nil {
		return res, err
	}
	cut, err := pruneCut(string(d), recs, opts)
	if err != nil {
		return res, err
	}
	// A kept run keeps the earlier runs of its group.
	groups := Groups(recs)
	if cut < len(recs) {
		for _, g := range groups {
			if g.First <= cut && cut <= g.Last && g.First < cut {
				for i := g.First; i < cut; i++ {
					res.Held = append(res.Held, HeldRun{ID: recs[i].ID, With: recs[cut].ID, Why: g.Why})
				}
				cut = g.First
				break
			}
		}
	}
	// Its own lock says so too (State): never one still going on.
	for _, r := range recs[:cut] {
		if r.State() == StateRunning {
			return res, fmt.Errorf("run %s has no end recorded and its process still holds its directory: a run going on is never removed; nothing was removed", r.ID)
		}
	}
	for _, r := range recs[cut:] {
		res.Kept = append(res.Kept, r.ID)
	}
	for _, r := range recs[:cut] {
		p := PrunedRun{ID: r.ID, Command: r.Command, Dir: r.Dir, Bytes: dirBytes(r.Dir)}
		for _, f := range []string{r.Journal, r.Snapshot} {
			if f != "" && !within(r.Dir, f) {
				if _, err := os.Stat(f); err == nil {
					p.Outside = append(p.Outside, f)
				}
			}
		}
		res.Removed = append(res.Removed, p)
		res.Freed += p.Bytes
	}
	if opts.DryRun {
		return res, nil
	}
	// Oldest first, each logged before it goes: a prune that stops part-way
	// has removed the oldest runs only.
	for i, r := range recs[:cut] {
		if err := appendLog(string(d), logEntry{ID: r.ID, Seq: r.Seq, Event: "pruned"}); err != nil {
			res.Removed, res.Freed = res.Removed[:i], sumBytes(res.Removed[:i])
			return res, err
		}
		if err := os.RemoveAll(r.Dir); err != nil {
			res.Removed, res.Freed = res.Removed[:i], sumBytes(res.Removed[:i])
			return res, fmt.Errorf("remove run %s: %w", r.ID, err)
		}
	}
	return res, nil
}

// pruneCut is the number of oldest runs the options ask to remove, before
// groups are kept whole.
func pruneCut(stateDir string, recs []Record, opts PruneOptions) (int, error) {
	if opts.Keep > 0 {
		return max(len(recs)-opts.Keep, 0), nil
	}
	for i, r := range recs {
		if r.ID == opts.Before || strconv.Itoa(r.Seq) == strings.TrimLeft(opts.Before, "0") {
			return i, nil
		}
	}
	return 0, &NotFoundError{ID: opts.Before, StateDir: stateDir}
}

// Group is a run that left its change part-way and the runs after it that
// finished it, by index in the runs as List gives them (First to Last).
type Group struct {
	First, Last int
	// Why says why the runs after the first belong with it.
	Why string
}

// Groups are the groups of more than one run among recs (List's order).
// A run may have written when its record counts keys written or its
// journal is on disk; it ends its change when it recorded exit code 0.
// A run that may have written and did not end with 0 opens a group; the
// runs after it join it until one ends with 0 having written (which closes
// it, and is of it).
func Groups(recs []Record) []Group {
	var out []Group
	open := -1
	for i, r := range recs {
		wrote := r.KeysWritten > 0 || fileExists(r.Journal)
		clean := r.Finished() && *r.ExitCode == 0
		if open >= 0 {
			if clean && wrote {
				out = append(out, Group{First: open, Last: i, Why: groupWhy(recs[open], r)})
				open = -1
			} else if i == len(recs)-1 {
				out = append(out, Group{First: open, Last: i, Why: groupWhy(recs[open], r)})
			}
			continue
		}
		if wrote && !clean {
			open = i
		}
	}
	return out
}

func groupWhy(first, last Record) string {
	how := "was killed"
	if first.Finished() {
		how = fmt.Sprintf("stopped part-way (exit code %d)", *first.ExitCode)
	}
	return fmt.Sprintf("run %s %s and the runs after it up to %s carried on its change: its snapshot, not theirs, is the state before it", first.ID, how, last.ID)
}

func fileExists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}

// within says whether path is in dir.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func sumBytes(rs []PrunedRun) int64 {
	var n int64
	for _, r := range rs {
		n += r.Bytes
	}
	return n
}
