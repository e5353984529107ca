package command

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/undo"
)

func runsCommand() *cli.Command {
	return &cli.Command{
		Name:  "runs",
		Usage: "list the writing runs kept in the state directory, oldest first: what each changed and where its undo is",
		Flags: []cli.Flag{stateDirFlag(), outputFlag("table", "table", "json"),
			&cli.BoolFlag{Name: "verify", Usage: "read every byte of each run's journal and snapshot: whether its undo verifies (each journal record's checksum and chain, the checksums recorded at the run's end, etcd's snapshot trailer); exit 1 when one is damaged"}},
		Action:       cmdRuns,
		OnUsageError: commandUsageError,
	}
}

// runView is a run as 'runs' shows it.
type runView struct {
	undo.Record
	// State is running (its lock held), finished, or killed (no end
	// recorded, nothing holds its lock).
	State string `json:"state"`
	// SnapshotTaken and JournalKept say whether those files are on disk;
	// SnapshotBytes and JournalBytes their sizes (what removing them frees).
	SnapshotTaken bool  `json:"snapshotTaken"`
	JournalKept   bool  `json:"journalKept"`
	SnapshotBytes int64 `json:"snapshotBytes,omitempty"`
	JournalBytes  int64 `json:"journalBytes,omitempty"`
	// UndoVerified, with --verify only (absent without), says whether the
	// run's undo verifies, read whole (or there is nothing to undo);
	// UndoCheck says how (undo.RunCheck).
	UndoVerified *bool          `json:"undoVerified,omitempty"`
	UndoCheck    *undo.RunCheck `json:"undoCheck,omitempty"`
}

// runsOptions are runs' flags.
type runsOptions struct {
	io       streams
	stateDir undo.StateDir
	output   string
	// verify reads every byte of each run's undo (--verify).
	verify bool
}

func cmdRuns(c *cli.Context) error {
	o := &runsOptions{io: streamsOf(c), stateDir: undo.StateDir(c.String("state-dir")), output: c.String("output"), verify: c.Bool("verify")}
	return o.runRuns()
}

// runRuns is the runs command.
func (o *runsOptions) runRuns() error {
	dir := o.stateDir
	recs, err := dir.List()
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	missing, err := dir.Missing(recs)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	views := make([]runView, len(recs))
	for i, r := range recs {
		_, jerr := os.Stat(r.Journal)
		views[i] = runView{Record: r, State: r.State(), SnapshotTaken: r.SnapshotTaken(), JournalKept: r.Journal != "" && jerr == nil}
		if views[i].SnapshotTaken {
			views[i].SnapshotBytes = undo.FileSize(r.Snapshot)
		}
		if views[i].JournalKept {
			views[i].JournalBytes = undo.FileSize(r.Journal)
		}
	}
	var damaged []string
	if o.verify {
		ctx, stop := signalContext(o.io.errOut)
		defer stop()
		for i := range views {
			v := &views[i]
			v.UndoCheck = undo.CheckRun(ctx, v.Record)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			ok := v.UndoCheck.Verified()
			v.UndoVerified = &ok
			if v.UndoCheck.Status == undo.UndoDamaged {
				damaged = append(damaged, v.ID)
			}
			if len(v.UndoNeedsKeys) == 0 && v.UndoCheck.Journal != nil {
				v.UndoNeedsKeys = v.UndoCheck.Journal.NeedsKeys() // a killed run recorded none
			}
		}
	}
	if err := printReport(o.io.out, o.output, runsReport{dir, views, missing}); err != nil {
		return err
	}
	if len(damaged) > 0 {
		return fmt.Errorf("the undo of run(s) %s is damaged (their lines say which file and record, and the way back)", strings.Join(damaged, ", "))
	}
	return nil
}

// runsReport is the state directory's runs.
type runsReport struct {
	dir  undo.StateDir
	runs []runView
	// missing are runs created after the oldest listed whose directories
	// were removed (undo.Missing).
	missing []undo.MissingRun
}

func (r runsReport) stamped(build buildinfo.Info) any {
	return struct {
		Build    buildinfo.Info    `json:"build"`
		StateDir undo.StateDir     `json:"stateDir"`
		Runs     []runView         `json:"runs"`
		Missing  []undo.MissingRun `json:"missing,omitempty"`
	}{build, r.dir, r.runs, r.missing}
}

func (r runsReport) table(w io.Writer) error {
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
		if v.UndoCheck.Status == undo.UndoDamaged {
			fmt.Fprintf(w, "%s: the way back: %s\n", v.ID, undo.WayBack(&v.Record))
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
		if v.State == undo.StateKilled {
			fmt.Fprintf(w, "killed: %s ended without recording its end (killed, or its host went down): its journal says what it wrote; run the same command again, or roll it back\n", v.ID)
		}
	}
	fmt.Fprintf(w, "undo run ID and every later one: kube-etcd-migrate rollback --run ID --dry-run, then without --dry-run\n")
	return nil
}
