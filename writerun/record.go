package writerun

import (
	"context"
	"fmt"

	"kube-etcd-migrate/undo"
)

// Lock takes the cluster's lock, once (later calls return at once): the
// first write's guard.FirstWrite calls it before the snapshot starts. A
// run that holds it refuses this one, nothing written.
func (r *Run) Lock(ctx context.Context) error { return r.hold.take(ctx) }

// Record records the checks the run passed before its first write in the
// run directory's plan. For a run of several etcds each etcd's lines are
// kept apart, named by etcd, in the order the etcds first recorded; etcd
// "" is the run's only etcd.
func (r *Run) Record(etcd string, lines []string) error {
	if r.dir == nil {
		return nil
	}
	if etcd == "" {
		return r.dir.run.WritePlan(lines)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.checks[etcd]; !ok {
		r.order = append(r.order, etcd)
	}
	r.checks[etcd] = lines
	var all []string
	for _, e := range r.order {
		for _, line := range r.checks[e] {
			all = append(all, e+": "+line)
		}
	}
	return r.dir.run.WritePlan(all)
}

// Dir is the run directory (nil: the run keeps none: a dry run, a run on
// a backup file, a run with no undo).
func (r *Run) Dir() *undo.Run {
	if r.dir == nil {
		return nil
	}
	return r.dir.run
}

// Journal is where the run journals: its run directory's journal, else the
// one the operator named ("" without an undo).
func (r *Run) Journal() string {
	if r.dir == nil {
		return r.cfg.Undo.Journal
	}
	return r.dir.run.Journal
}

// Snapshot is where the run saves its snapshot before the first write: its
// run directory's, else the one the operator named ("" without an undo).
func (r *Run) Snapshot() string {
	if r.dir == nil {
		return r.cfg.Undo.Snapshot
	}
	return r.dir.run.Snapshot
}

// StateDir is the state directory the run keeps its undo in, where a
// rollback of it keeps its own ("" without an undo).
func (r *Run) StateDir() undo.StateDir {
	if r.dir == nil {
		return ""
	}
	return undo.StateDir(r.dir.state.Dir)
}

// NothingWrittenError is a refusal before anything was written.
type NothingWrittenError struct{ Err error }

func (e *NothingWrittenError) Error() string { return fmt.Sprintf("%v; nothing was written", e.Err) }
func (e *NothingWrittenError) Unwrap() error { return e.Err }

// StateDirError is a state directory, or the directory the undo was asked
// to go to instead (Elsewhere), in which the run could not keep its undo:
// nothing was written.
type StateDirError struct {
	Err error
	// Opening: the state directory itself could not be opened or locked.
	Opening bool
	// Elsewhere: the error is Undo.Elsewhere's.
	Elsewhere bool
}

func (e *StateDirError) Error() string { return fmt.Sprintf("%v; nothing was written", e.Err) }
func (e *StateDirError) Unwrap() error { return e.Err }
