package writerun

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/undo"
)

// Undo is where a writing run keeps its undo, as the operator asked.
type Undo struct {
	// StateDir is the state directory (read once by the command line).
	StateDir undo.StateDir
	// None: the run keeps no undo at all, said on a warning line.
	None bool
	// Journal and Snapshot, when set, are where the run's journal and
	// snapshot go instead of its run directory (a snapshot file that exists
	// is never replaced: the command refuses it first).
	Journal, Snapshot string
	// Elsewhere, when set, is a directory the journal and snapshot go to
	// instead (in Elsewhere/ID, made: never one that exists): a rollback's,
	// when the state directory's filesystem has no room.
	Elsewhere string
	// noSnapshot names a datastore the run can take no snapshot of (a
	// PostgreSQL database through kine): its journal alone is the undo.
	noSnapshot string
}

// dir is a writing run's run directory and the state directory it is in,
// held (its flock) from the run's start to its finish.
type dir struct {
	state *undo.State
	run   *undo.Run
}

// openDir creates the run directory of a writing run in the state
// directory, before anything is written, and says on w where the undo is.
// attach, when set, is given the run directory's output file at once, to
// write what the command prints there (a failure is a warning). nil, nil: the run keeps no
// undo.
func openDir(w io.Writer, u Undo, command string, endpoints []string, prefix string, attach func(*os.File) error, spell func(input.Name) string) (*dir, error) {
	if u.None {
		fmt.Fprintln(w, "WARNING: --no-undo: this run keeps no journal and no snapshot; nothing can roll it back")
		return nil, nil
	}
	st, err := u.StateDir.Open()
	if err != nil {
		return nil, &StateDirError{Err: err, Opening: true}
	}
	rd, err := st.NewRun(command, endpoints, prefix)
	if err != nil {
		st.Close()
		return nil, &StateDirError{Err: err}
	}
	d := &dir{state: st, run: rd}
	if attach != nil {
		f, err := rd.OpenOutput()
		if err == nil {
			err = attach(f)
		}
		if err != nil {
			fmt.Fprintf(w, "warning: run %s: its output is not saved: %s\n", rd.ID, input.RenderAll(err, spell))
		}
	}
	if u.Journal != "" {
		err = rd.SetJournal(u.Journal)
	}
	if u.Snapshot != "" && err == nil {
		err = rd.SetSnapshot(u.Snapshot)
	}
	if err != nil {
		d.finish(w, 1, 0, nil, spell)
		return nil, &StateDirError{Err: err}
	}
	if u.Elsewhere != "" {
		if err := elsewhere(u.Elsewhere, rd); err != nil {
			d.finish(w, 1, 0, nil, spell)
			return nil, &StateDirError{Err: err, Elsewhere: true}
		}
	}
	if u.noSnapshot != "" {
		if err := rd.SetSnapshot(""); err != nil {
			d.finish(w, 1, 0, nil, spell)
			return nil, &StateDirError{Err: err}
		}
		fmt.Fprintf(w, "run %s: recorded in %s; its undo is its journal %s alone (no snapshot: %s has none the tool can take; the dump taken before the run is the way back beyond it); 'kube-etcd-migrate rollback --run %s' undoes it\n",
			rd.ID, rd.Dir, rd.Journal, u.noSnapshot, rd.ID)
		return d, nil
	}
	if u.Elsewhere != "" {
		fmt.Fprintf(w, "run %s: recorded in %s; its undo is kept in %s (--undo-dir: journal %s, snapshot before the first write %s); 'kube-etcd-migrate runs --state-dir %s' lists it and 'kube-etcd-migrate rollback --run %s --state-dir %s' undoes it\n",
			rd.ID, rd.Dir, filepath.Dir(rd.Journal), rd.Journal, rd.Snapshot, u.StateDir, rd.ID, u.StateDir)
		return d, nil
	}
	fmt.Fprintf(w, "run %s: its undo is kept in %s (journal %s, snapshot before the first write %s); 'kube-etcd-migrate rollback --run %s' undoes it\n",
		rd.ID, rd.Dir, rd.Journal, rd.Snapshot, rd.ID)
	return d, nil
}

// elsewhere puts the run's journal and snapshot in root/ID (mode 0700,
// made: never one that exists), recorded in its run directory.
func elsewhere(root string, rd *undo.Run) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	d, err := filepath.Abs(filepath.Join(root, rd.ID))
	if err != nil {
		return err
	}
	if err := os.Mkdir(d, 0o700); err != nil {
		return fmt.Errorf("%w (another state directory's run of that ID? give another directory)", err)
	}
	if err := rd.SetJournal(filepath.Join(d, undo.JournalFile)); err != nil {
		return err
	}
	return rd.SetSnapshot(filepath.Join(d, undo.SnapshotFile))
}

// finish records the run's end with its exit code, and releases the state
// directory. A run that wrote nothing and has no journal leaves its
// directory all the same: its record says so.
func (d *dir) finish(w io.Writer, code int, written int64, summary any, spell func(input.Name) string) {
	if d == nil {
		return
	}
	if ferr := d.run.Finish(code, written, summary); ferr != nil {
		fmt.Fprintf(w, "warning: run %s: %s\n", d.run.ID, input.RenderAll(ferr, spell))
	}
	d.state.Close()
}
