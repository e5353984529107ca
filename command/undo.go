package command

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

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

// stateDirOf is the state directory --state-dir names (else
// $KUBE_ETCD_MIGRATE_STATE_DIR, else the default): read once by each command
// and handed on.
func stateDirOf(c *cli.Context) undo.StateDir { return undo.StateDir(c.String("state-dir")) }

// checkUndoFlags refuses contradictory undo flags before anything is opened,
// and returns the state directory.
func checkUndoFlags(c *cli.Context) (undo.StateDir, error) {
	if c.Bool("no-undo") && (c.String("journal") != "" || c.String("snapshot") != "") {
		return "", usageErr("--no-undo keeps no journal and no snapshot: leave out --journal and --snapshot, or --no-undo")
	}
	if p := c.String("snapshot"); p != "" && !c.Bool("dry-run") {
		if _, err := os.Lstat(p); err == nil {
			return "", usageErr("--snapshot %s: the file exists and a snapshot is never replaced (it may hold the state before an earlier run); give a new path, or leave out --snapshot: each run keeps its own in its run directory", p)
		}
	}
	dir := stateDirOf(c)
	if dir == "" && !c.Bool("no-undo") {
		return "", usageErr("--state-dir: empty; give a directory (default %s)", undo.DefaultStateDir)
	}
	return dir, nil
}

// startRun creates the run directory of a writing run in the state directory
// dir before anything is written, and says on stderr where the undo is;
// journal and snapshot, when set, are where the operator asked for those
// files instead. A state directory that cannot be made, is shared with
// others or is locked by another run refuses the run (exit 1).
func startRun(c *cli.Context, dir undo.StateDir, command string, endpoints []string, prefix, journal, snapshot string) (*undoRun, error) {
	if c.Bool("dry-run") || c.String("snapshot-file") != "" {
		return nil, nil
	}
	if c.Bool("no-undo") {
		fmt.Fprintln(c.App.ErrWriter, "WARNING: --no-undo: this run keeps no journal and no snapshot; nothing can roll it back")
		return nil, nil
	}
	st, err := dir.Open()
	if err != nil {
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written (--no-undo runs without an undo)", err)}
	}
	rd, err := st.NewRun(command, endpoints, prefix)
	if err != nil {
		st.Close()
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written", err)}
	}
	u := &undoRun{state: st, dir: rd}
	if journal != "" {
		err = rd.SetJournal(journal)
	}
	if snapshot != "" && err == nil {
		err = rd.SetSnapshot(snapshot)
	}
	if err != nil {
		u.finish(c, err, 0, nil)
		return nil, &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w; nothing was written", err)}
	}
	fmt.Fprintf(c.App.ErrWriter, "run %s: its undo is kept in %s (journal %s, snapshot before the first write %s); 'kube-etcd-migrate rollback --run %s' undoes it\n",
		rd.ID, rd.Dir, rd.Journal, rd.Snapshot, rd.ID)
	return u, nil
}

// journalPath is where the run journals (--journal, else its run directory; "" without an undo).
func (u *undoRun) journalPath(c *cli.Context) string {
	if u == nil {
		return c.String("journal")
	}
	return u.dir.Journal
}

// snapshotPath is where the run saves its snapshot ("" without an undo).
func (u *undoRun) snapshotPath(c *cli.Context) string {
	if u == nil {
		return c.String("snapshot")
	}
	return u.dir.Snapshot
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
func (u *undoRun) finish(c *cli.Context, err error, written int64, summary any) {
	if u == nil {
		return
	}
	if ferr := u.dir.Finish(exitCodeOf(err), written, summary); ferr != nil {
		fmt.Fprintf(c.App.ErrWriter, "warning: run %s: %s\n", u.dir.ID, cliMessage(ferr))
	}
	u.state.Close()
}

// exitCodeOf is the exit code the command line gives for err.
func exitCodeOf(err error) int {
	if err == nil {
		return exitOK
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
