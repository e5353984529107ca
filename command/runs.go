package command

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/rundir"
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
	rundir.Record
	// SnapshotTaken and JournalKept say whether those files are on disk.
	SnapshotTaken bool `json:"snapshotTaken"`
	JournalKept   bool `json:"journalKept"`
}

func cmdRuns(c *cli.Context) error {
	dir := c.String("state-dir")
	recs, err := rundir.List(dir)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	views := make([]runView, len(recs))
	for i, r := range recs {
		_, jerr := os.Stat(r.Journal)
		views[i] = runView{Record: r, SnapshotTaken: r.SnapshotTaken(), JournalKept: r.Journal != "" && jerr == nil}
	}
	if c.String("output") == "json" {
		return writeReport(c.App.Writer, "json", func(w io.Writer, _ string) error {
			return writeJSON(w, struct {
				StateDir string    `json:"stateDir"`
				Runs     []runView `json:"runs"`
			}{dir, views})
		})
	}
	if len(views) == 0 {
		fmt.Fprintf(c.App.Writer, "no runs in %s\n", dir)
		return nil
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCOMMAND\tSTARTED\tENDED\tEXIT\tKEYS WRITTEN\tSNAPSHOT\tJOURNAL")
	for _, v := range views {
		ended, exit := "-", "unfinished (running, or killed)"
		if v.Finished() {
			ended, exit = v.End.Local().Format(time.DateTime), fmt.Sprint(*v.ExitCode)
		}
		snap := "none"
		if v.SnapshotTaken {
			snap = v.Snapshot
		}
		journal := "none"
		if v.JournalKept {
			journal = v.Journal
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
	fmt.Fprintf(c.App.Writer, "undo run ID and every later one: kube-etcd-migrate rollback --run ID --dry-run, then without --dry-run\n")
	return nil
}
