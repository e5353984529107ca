package command

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/undo"
)

// stateDirFlag is --state-dir, on every command that writes and on runs and plan.
func stateDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "state-dir", Value: undo.DefaultStateDir, EnvVars: []string{undo.EnvStateDir},
		Usage: "where each writing run keeps its undo (a run directory: journal, snapshot before the first write, plan, summary; mode 0700)"}
}

// undoFlags are the flags of every command that writes to a cluster's etcd.
func undoFlags() []cli.Flag {
	return []cli.Flag{
		stateDirFlag(),
		&cli.BoolFlag{Name: "no-undo", Usage: "DANGEROUS: keep no journal and no snapshot: nothing can roll this run back"},
		&cli.StringFlag{Name: "journal", Usage: "keep the journal of old values here (mode 0600) instead of in the run directory"},
		&cli.StringFlag{Name: "snapshot", Usage: "save the etcd snapshot taken before the first write here instead of in the run directory (a file that exists is never replaced)"},
	}
}

// undoRun is the run directory of a writing run, nil-safe: a dry run, a run
// with --no-undo and a run on a --snapshot-file have none.
type undoRun struct {
	state *undo.State
	dir   *undo.Run
}

// undoOptions are undoFlags as given (rollback: --state-dir and --no-undo
// only), and whether the run keeps a run directory at all.
type undoOptions struct {
	// stateDir is --state-dir (else $KUBE_ETCD_MIGRATE_STATE_DIR, else the
	// default): read once and handed on.
	stateDir          undo.StateDir
	noUndo            bool
	journal, snapshot string // --journal and --snapshot: where instead of the run directory
	// undoDir is rollback's --undo-dir: its journal and snapshot go to
	// undoDir/ID instead of the run directory.
	undoDir string
	// none: the run keeps no run directory (a dry run, a run on a --snapshot-file).
	none bool
}

// newUndoOptions reads undoFlags; a run with dryRun or on a --snapshot-file
// (snapshotFile) keeps no run directory.
func newUndoOptions(c *cli.Context, dryRun bool, snapshotFile string) undoOptions {
	return undoOptions{
		stateDir: undo.StateDir(c.String("state-dir")),
		noUndo:   c.Bool("no-undo"),
		journal:  c.String("journal"),
		snapshot: c.String("snapshot"),
		none:     dryRun || snapshotFile != "",
	}
}

// validate refuses contradictory undo flags before anything is opened.
func (o undoOptions) validate() error {
	if o.noUndo && (o.journal != "" || o.snapshot != "") {
		return usageErr("--no-undo keeps no journal and no snapshot: leave out --journal and --snapshot, or --no-undo")
	}
	if o.stateDir == "" && !o.noUndo {
		return usageErr("--state-dir: empty; give a directory (default %s)", undo.DefaultStateDir)
	}
	return nil
}

// checkPath refuses a --snapshot that exists (a look at the path only):
// a snapshot is never replaced. A dry run takes none.
func (o undoOptions) checkPath(dryRun bool) error {
	if p := o.snapshot; p != "" && !dryRun {
		if _, err := os.Lstat(p); err == nil {
			return usageErr("--snapshot %s: the file exists and a snapshot is never replaced (it may hold the state before an earlier run); give a new path, or leave out --snapshot: each run keeps its own in its run directory", p)
		}
	}
	return nil
}

// start creates the run directory of a writing run in the state directory
// before anything is written, and says on w where the undo is; --journal and
// --snapshot, when set, are where the operator asked for those files
// instead. A state directory that cannot be made, is shared with others or
// is locked by another run refuses the run (exit 1).
func (o undoOptions) start(w io.Writer, command string, endpoints []string, prefix string) (*undoRun, error) {
	if o.none {
		return nil, nil
	}
	if o.noUndo {
		fmt.Fprintln(w, "WARNING: --no-undo: this run keeps no journal and no snapshot; nothing can roll it back")
		return nil, nil
	}
	st, err := o.stateDir.Open()
	if err != nil {
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written (--no-undo runs without an undo)", err)}
	}
	rd, err := st.NewRun(command, endpoints, prefix)
	if err != nil {
		st.Close()
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written", err)}
	}
	u := &undoRun{state: st, dir: rd}
	if err := outputOf(w).attach(rd); err != nil {
		fmt.Fprintf(w, "warning: run %s: its output is not saved: %s\n", rd.ID, cliMessage(err))
	}
	if o.journal != "" {
		err = rd.SetJournal(o.journal)
	}
	if o.snapshot != "" && err == nil {
		err = rd.SetSnapshot(o.snapshot)
	}
	if err != nil {
		u.finish(w, err, 0, nil)
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written", err)}
	}
	if o.undoDir != "" {
		if err := o.elsewhere(rd); err != nil {
			u.finish(w, err, 0, nil)
			return nil, &codeError{code: exitError, err: fmt.Errorf("--undo-dir: %w; nothing was written", err)}
		}
		fmt.Fprintf(w, "run %s: recorded in %s; its undo is kept in %s (--undo-dir: journal %s, snapshot before the first write %s); 'kube-etcd-migrate runs --state-dir %s' lists it and 'kube-etcd-migrate rollback --run %s --state-dir %s' undoes it\n",
			rd.ID, rd.Dir, filepath.Dir(rd.Journal), rd.Journal, rd.Snapshot, o.stateDir, rd.ID, o.stateDir)
		return u, nil
	}
	fmt.Fprintf(w, "run %s: its undo is kept in %s (journal %s, snapshot before the first write %s); 'kube-etcd-migrate rollback --run %s' undoes it\n",
		rd.ID, rd.Dir, rd.Journal, rd.Snapshot, rd.ID)
	return u, nil
}

// elsewhere puts the run's journal and snapshot in undoDir/ID (mode 0700,
// made: never one that exists), recorded in its run directory.
func (o undoOptions) elsewhere(rd *undo.Run) error {
	if err := os.MkdirAll(o.undoDir, 0o700); err != nil {
		return err
	}
	dir, err := filepath.Abs(filepath.Join(o.undoDir, rd.ID))
	if err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("%w (another state directory's run of that ID? give another directory)", err)
	}
	if err := rd.SetJournal(filepath.Join(dir, undo.JournalFile)); err != nil {
		return err
	}
	return rd.SetSnapshot(filepath.Join(dir, undo.SnapshotFile))
}

// journalPath is where the run journals: its run directory's journal, else
// journal (--journal; "" without an undo).
func (u *undoRun) journalPath(journal string) string {
	if u == nil {
		return journal
	}
	return u.dir.Journal
}

// snapshotPath is where the run saves its snapshot: its run directory's,
// else snapshot (--snapshot; "" without an undo).
func (u *undoRun) snapshotPath(snapshot string) string {
	if u == nil {
		return snapshot
	}
	return u.dir.Snapshot
}

// stateDir is the state directory the run keeps its undo in, where a
// rollback of it keeps its own ("" without an undo).
func (u *undoRun) stateDir() undo.StateDir {
	if u == nil {
		return ""
	}
	return undo.StateDir(u.state.Dir)
}

// recordChecks records the checks a run passed before its first write.
func (u *undoRun) recordChecks(lines []string) error {
	if u == nil {
		return nil
	}
	return u.dir.WritePlan(lines)
}

// finish records the run's end with the exit code err gives, and releases
// the state directory. A run that wrote nothing and has no journal leaves its
// directory all the same: its record says so.
func (u *undoRun) finish(w io.Writer, err error, written int64, summary any) {
	if u == nil {
		return
	}
	if ferr := u.dir.Finish(exitCodeOf(err), written, summary); ferr != nil {
		fmt.Fprintf(w, "warning: run %s: %s\n", u.dir.ID, cliMessage(ferr))
	}
	u.state.Close()
}

// exitCodeOf is the exit code the command line gives for err.
func exitCodeOf(err error) int {
	if err == nil {
		return exitOK
	}
	var p *crash.Panic
	if errors.As(err, &p) {
		return exitInternal // guarded writes its line
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code
	}
	if isUsage(err) {
		return exitUsage
	}
	return exitError
}
