package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/writerun"
)

// stateDirFlag is --state-dir, on every command that writes and on runs and plan.
func stateDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "state-dir", Value: writerun.DefaultStateDir, EnvVars: []string{writerun.EnvStateDir},
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

// undoOptions are undoFlags as given (rollback: --state-dir and --no-undo
// only), and whether the run keeps a run directory at all.
type undoOptions struct {
	// stateDir is --state-dir (else $KUBE_ETCD_MIGRATE_STATE_DIR, else the
	// default): read once and handed on.
	stateDir          writerun.StateDir
	noUndo            bool
	journal, snapshot string // --journal and --snapshot: where instead of the run directory
	// undoDir is rollback's --undo-dir: its journal and snapshot go to
	// undoDir/ID instead of the run directory.
	undoDir string
}

// newUndoOptions reads undoFlags.
func newUndoOptions(c *cli.Context) undoOptions {
	return undoOptions{
		stateDir: writerun.StateDir(c.String("state-dir")),
		noUndo:   c.Bool("no-undo"),
		journal:  c.String("journal"),
		snapshot: c.String("snapshot"),
	}
}

// validate refuses contradictory undo flags before anything is opened.
func (o undoOptions) validate() error {
	if o.noUndo && (o.journal != "" || o.snapshot != "") {
		return usageErr("--no-undo keeps no journal and no snapshot: leave out --journal and --snapshot, or --no-undo")
	}
	if o.stateDir == "" && !o.noUndo {
		return usageErr("--state-dir: empty; give a directory (default %s)", writerun.DefaultStateDir)
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

// runConfig is the writing run of command o's flags describe (package
// writerun), on cli under prefix; dryRun writes nothing, private writes a
// backup file's private copy or output, never the cluster's etcd.
func (o undoOptions) runConfig(w io.Writer, command string, cli *clientv3.Client, prefix string, dryRun, private bool, live livenessOptions) writerun.Config {
	var endpoints []string
	if cli != nil {
		endpoints = cli.Endpoints()
	}
	cfg := writerun.Config{
		Command: command, Log: w, Client: cli, Prefix: prefix, Endpoints: endpoints,
		DryRun: dryRun, Private: private,
		Undo: writerun.Undo{
			StateDir: o.stateDir, None: o.noUndo, Journal: o.journal, Snapshot: o.snapshot, Elsewhere: o.undoDir,
		},
		Liveness: writerun.Liveness{Allow: live.allowLive, Window: live.window},
		ExitCode: exitCodeOf,
		Spell:    flagOf,
	}
	if out := outputOf(w); out != nil {
		cfg.Attach = out.attach
	}
	return cfg
}

// onKine makes cfg the writing run of the datastore k serves through
// kine, if it serves one to write (nil: none): the run's record names the
// database (sqlite://FILE, or PostgreSQL's or MySQL's database and host,
// never its DSN), not kine's socket (a private directory, gone after the
// run). On PostgreSQL and MySQL, which have no snapshot the tool can take,
// --snapshot is refused.
func (k *kineServed) onKine(cfg writerun.Config) (writerun.Config, error) {
	srv := k.writing()
	if srv == nil {
		return cfg, nil
	}
	cfg.Kine = srv
	cfg.Endpoints = []string{"sqlite://" + srv.Database}
	if k.store.dsn != "" {
		if cfg.Undo.Snapshot != "" {
			return cfg, usageErr("--snapshot: a %s datastore (%s) has no snapshot the tool can take: the run's undo is its journal; take a dump of the database first (%s), and leave out --snapshot", k.store.kind(), k.store.name, k.store.dump())
		}
		cfg.Endpoints = []string{"postgres: " + k.store.name}
		if k.store.kind() == "MySQL" {
			cfg.Endpoints = []string{"mysql: " + k.store.name}
		}
	}
	return cfg, nil
}

// doWrite runs stage as a writing run of cfg (writerun.Do), its refusals
// named by the flags that set them.
func doWrite(ctx context.Context, cfg writerun.Config, stage writerun.Stage) error {
	err := writerun.Do(ctx, cfg, stage)
	var sd *writerun.StateDirError
	if errors.As(err, &sd) {
		switch {
		case sd.Elsewhere:
			return &codeError{code: exitError, err: fmt.Errorf("--undo-dir: %w", sd)}
		case sd.Opening:
			return &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w (--no-undo runs without an undo)", sd)}
		}
		return &codeError{code: exitError, err: fmt.Errorf("--state-dir: %w", sd)}
	}
	return err
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
