package command

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/writerun"
)

func runsCommand() *cli.Command {
	return &cli.Command{
		Name:  "runs",
		Usage: "list the writing runs kept in the state directory, oldest first: what each changed and where its undo is",
		Flags: append(append([]cli.Flag{stateDirFlag(), outputFlag("table", "table", "json"),
			&cli.BoolFlag{Name: "verify", Usage: "read every byte of each run's journal and snapshot: whether its undo verifies (each journal record's checksum and chain, the checksums recorded at the run's end, etcd's snapshot trailer); exit 1 when one is damaged"},
			&cli.StringFlag{Name: "show", Usage: "print run ID's record and how to undo it: the rollback, and the restore of its snapshot on every etcd member (copy, sha256 check, etcdutl snapshot restore with each member's flags)"},
			&cli.BoolFlag{Name: "prune", Usage: "remove the oldest run directories (--keep N or --before ID): never one between two kept, never one a kept run's rollback needs (a run left part-way goes or stays with the reruns that finished it), never while another process holds the state directory; --dry-run first"},
			&cli.IntFlag{Name: "keep", Usage: "with --prune: keep the newest N runs (and the earlier runs of the oldest kept one's group)"},
			&cli.StringFlag{Name: "before", Usage: "with --prune: remove the runs older than run ID (the earlier runs of its group kept)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "with --prune: say what would be removed and what it frees, remove nothing"},
		}, etcdFlags()...), apiServerFlags()[:2]...),
		Action:       cmdRuns,
		OnUsageError: commandUsageError,
	}
}

// runsOptions are runs' flags.
type runsOptions struct {
	io       streams
	stateDir writerun.StateDir
	output   string
	// verify reads every byte of each run's undo (--verify).
	verifyUndo bool
	// show is --show ID.
	show string
	// prune, keep, before, dryRun are --prune and its flags; keepSet says
	// --keep was given.
	prune, dryRun bool
	keep          int
	keepSet       bool
	before        string
	// cluster: etcd's connection, asked for the cluster's runs when
	// given (askEtcd).
	cluster clusterSource
}

func newRunsOptions(c *cli.Context) *runsOptions {
	return &runsOptions{
		io: streamsOf(c), stateDir: writerun.StateDir(c.String("state-dir")), output: c.String("output"), verifyUndo: c.Bool("verify"),
		show: c.String("show"), prune: c.Bool("prune"), dryRun: c.Bool("dry-run"), keep: c.Int("keep"), keepSet: c.IsSet("keep"), before: c.String("before"),
		cluster: newClusterSource(c),
	}
}

// validate refuses, before anything is read, what runs' flags alone refuse.
func (o *runsOptions) validate() error {
	if o.stateDir == "" {
		return usageErr("--state-dir: empty; give a directory (default %s)", writerun.DefaultStateDir)
	}
	if !o.prune && (o.keepSet || o.before != "" || o.dryRun) {
		return usageErr("--keep, --before and --dry-run go with --prune")
	}
	if o.prune {
		if o.keepSet == (o.before != "") {
			return usageErr("--prune: give --keep N (the newest N runs kept) or --before ID (the runs older than ID removed)")
		}
		if o.keepSet && o.keep < 1 {
			return usageErr("--keep %d: keep at least the newest run (its undo is the one most likely needed)", o.keep)
		}
		if o.show != "" || o.verifyUndo {
			return usageErr("--prune removes runs: leave out --show and --verify (run them first)")
		}
	}
	if o.show != "" && o.verifyUndo {
		return usageErr("--show prints one run: leave out --verify ('runs --verify' checks every run)")
	}
	return o.cluster.validate()
}

func cmdRuns(c *cli.Context) error {
	o := newRunsOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	switch {
	case o.prune:
		return o.runPrune()
	case o.show != "":
		return o.runShow()
	}
	return o.runRuns()
}

// runRuns is the runs command.
func (o *runsOptions) runRuns() error {
	dir := o.stateDir
	ctx, stop := signalContext(o.io.errOut)
	defer stop()
	list, err := writerun.ListRuns(ctx, dir, o.verifyUndo)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	var damaged []string
	for i := range list.Runs {
		if list.Runs[i].Damaged() {
			damaged = append(damaged, list.Runs[i].ID)
		}
	}
	cluster, note := o.cluster.readClusterRuns(ctx, o.io.errOut)
	if err := printReport(o.io.out, o.output, runsReport{dir: dir, runs: list.Runs, missing: list.Missing, cluster: cluster, clusterNote: note}); err != nil {
		return err
	}
	if len(damaged) > 0 {
		return fmt.Errorf("the undo of run(s) %s is damaged (their lines say which file and record, and the way back)", strings.Join(damaged, ", "))
	}
	return nil
}

// runsReport is the state directory's runs.
type runsReport struct {
	dir  writerun.StateDir
	runs []writerun.RunView
	// missing are runs created after the oldest listed whose directories
	// were removed (writerun.ListRuns).
	missing []writerun.MissingRun
	// cluster are the cluster's runs from etcd (every host), or nil and
	// clusterNote why not.
	cluster     *clusterRuns
	clusterNote string
}

func (r runsReport) stamped(build buildinfo.Info) any {
	return struct {
		Build    buildinfo.Info        `json:"build"`
		StateDir writerun.StateDir     `json:"stateDir"`
		Runs     []writerun.RunView    `json:"runs"`
		Missing  []writerun.MissingRun `json:"missing,omitempty"`
		// Cluster are the cluster's runs from every host (etcd), or
		// ClusterNote says why not.
		Cluster     *clusterRuns `json:"cluster,omitempty"`
		ClusterNote string       `json:"clusterNote,omitempty"`
	}{build, r.dir, r.runs, r.missing, r.cluster, r.clusterNote}
}

func (r runsReport) table(w io.Writer) error {
	if err := r.localTable(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if r.cluster != nil {
		return r.cluster.table(w)
	}
	fmt.Fprintln(w, r.clusterNote)
	return nil
}

// localTable writes the state directory's runs.
func (r runsReport) localTable(w io.Writer) error {
	if len(r.runs) == 0 {
		fmt.Fprintf(w, "no runs in %s\n", r.dir)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	verified := len(r.runs) > 0 && r.runs[0].UndoVerified != nil
	head := "ID\tCOMMAND\tSTATE\tSTARTED\tENDED\tEXIT\tKEYS WRITTEN\tSNAPSHOT\tJOURNAL\tUNDO NEEDS"
	if verified {
		head += "\tUNDO"
	}
	fmt.Fprintln(tw, head)
	for _, v := range r.runs {
		ended, exit := "-", "-"
		if v.Finished() {
			ended, exit = v.End.Local().Format(time.DateTime), fmt.Sprint(*v.ExitCode)
		}
		snap := "none"
		if v.SnapshotTaken {
			snap = fmt.Sprintf("%s (%s)", v.Snapshot, textfmt.Bytes(v.SnapshotBytes))
		}
		journal := "none"
		if v.JournalKept {
			journal = fmt.Sprintf("%s (%s)", v.Journal, textfmt.Bytes(v.JournalBytes))
		}
		if len(v.Etcds) > 0 {
			// Its undo in the cluster's other etcds: --show names the files.
			names := make([]string, len(v.Etcds))
			for i, e := range v.Etcds {
				names[i] = e.Name
			}
			journal += fmt.Sprintf(" + etcd of %s (--show %s)", strings.Join(names, ", "), v.ID)
		}
		cmd := v.Command
		if len(v.Undoes) > 0 {
			cmd += fmt.Sprintf(" (undoes %v)", v.Undoes)
		}
		needs := "-"
		if len(v.UndoNeedsKeys) > 0 {
			needs = strings.Join(v.UndoNeedsKeys, ",")
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s", v.ID, cmd, v.State, v.Start.Local().Format(time.DateTime), ended, exit, v.KeysWritten, snap, journal, needs)
		if verified {
			line += "\t" + v.UndoCheck.Status
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range r.runs {
		if v.UndoCheck == nil {
			continue
		}
		for _, p := range v.UndoCheck.Problems {
			fmt.Fprintf(w, "%s: %s: %s\n", v.ID, strings.ToUpper(v.UndoCheck.Status), p)
		}
		if v.Damaged() {
			fmt.Fprintf(w, "%s: the way back: %s\n", v.ID, v.WayBack())
		}
		for _, n := range v.UndoCheck.Notes {
			fmt.Fprintf(w, "%s: note: %s\n", v.ID, n)
		}
	}
	var lost, empty []string
	for _, m := range r.missing {
		if m.WroteNothing {
			empty = append(empty, m.ID)
		} else {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) > 0 {
		fmt.Fprintf(w, "missing: %s (run directory removed, its undo with it: a rollback of an earlier run is refused)\n", strings.Join(lost, ", "))
	}
	if len(empty) > 0 {
		fmt.Fprintf(w, "removed: %s (wrote nothing: no undo lost)\n", strings.Join(empty, ", "))
	}
	for _, v := range r.runs {
		if v.State == writerun.StateKilled {
			fmt.Fprintf(w, "killed: %s ended without recording its end (killed, or its host went down): its journal says what it wrote; run the same command again, or roll it back\n", v.ID)
		}
	}
	fmt.Fprintf(w, "undo run ID and every later one: kube-etcd-migrate rollback --run ID --dry-run, then without --dry-run\n")
	return nil
}
