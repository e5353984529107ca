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
		Name:         "runs",
		Usage:        "list the writing runs kept in the state directory, oldest first: what each changed and where its undo is",
		Flags:        []cli.Flag{stateDirFlag(), outputFlag("table", "table", "json")},
		Action:       cmdRuns,
		OnUsageError: commandUsageError,
	}
}

// runView is a run as 'runs' shows it.
type runView struct {
	undo.Record
	// SnapshotTaken and JournalKept say whether those files are on disk;
	// SnapshotBytes and JournalBytes their sizes (what removing them frees).
	SnapshotTaken bool  `json:"snapshotTaken"`
	JournalKept   bool  `json:"journalKept"`
	SnapshotBytes int64 `json:"snapshotBytes,omitempty"`
	JournalBytes  int64 `json:"journalBytes,omitempty"`
}

// runsOptions are runs' flags.
type runsOptions struct {
	io       streams
	stateDir undo.StateDir
	output   string
}

func cmdRuns(c *cli.Context) error {
	o := &runsOptions{io: streamsOf(c), stateDir: undo.StateDir(c.String("state-dir")), output: c.String("output")}
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
		views[i] = runView{Record: r, SnapshotTaken: r.SnapshotTaken(), JournalKept: r.Journal != "" && jerr == nil}
		if views[i].SnapshotTaken {
			views[i].SnapshotBytes = undo.FileSize(r.Snapshot)
		}
		if views[i].JournalKept {
			views[i].JournalBytes = undo.FileSize(r.Journal)
		}
	}
	return printReport(o.io.out, o.output, runsReport{dir, views, missing})
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
	fmt.Fprintln(tw, "ID\tCOMMAND\tSTARTED\tENDED\tEXIT\tKEYS WRITTEN\tSNAPSHOT\tJOURNAL")
	for _, v := range r.runs {
		ended, exit := "-", "unfinished (running, or killed)"
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", v.ID, cmd, v.Start.Local().Format(time.DateTime), ended, exit, v.KeysWritten, snap, journal)
	}
	if err := tw.Flush(); err != nil {
		return err
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
	fmt.Fprintf(w, "undo run ID and every later one: kube-etcd-migrate rollback --run ID --dry-run, then without --dry-run\n")
	return nil
}
