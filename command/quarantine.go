package command

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/quarantine"
)

func quarantineCommand() *cli.Command {
	return &cli.Command{
		Name:  "quarantine",
		Usage: "remove the objects no configured key decrypts or that do not decode (only the --reason and --resource named), or the orphaned keys no resource owns (--reason orphaned); journaled for rollback",
		Flags: append(append(commonFlags(),
			outputFlag("table", "table", "json"),
			&cli.StringSliceFlag{Name: "reason", Usage: "remove objects unreadable for this reason (repeatable, comma list): undecryptable, corrupt-envelope, corrupt-payload, unknown-kind; or, alone and without --resource, orphaned (keys no built-in resource or CRD owns)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "list what would be removed and what is kept, write nothing"},
			&cli.IntFlag{Name: "batch-ops", Value: 16, Usage: "deletes per CAS transaction"},
		), append(append(undoFlags(), livenessFlags()...), outputSnapshotFlags()...)...),
		Action:       cmdQuarantine,
		OnUsageError: commandUsageError,
	}
}

func cmdQuarantine(c *cli.Context) (err error) {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	stateDir, err := checkUndoFlags(c)
	if err != nil {
		return err
	}
	reasons, err := quarantine.ParseReasons(c.StringSlice("reason"))
	if err != nil {
		return usageErr("%v", quarantineError(err))
	}
	switch orphaned := quarantine.OnlyOrphaned(reasons); {
	case orphaned && len(c.StringSlice("resource")) > 0:
		return usageErr("--reason orphaned: orphaned keys belong to no resource; leave out --resource (the whole prefix is scanned, only orphaned keys are removed)")
	case !orphaned && len(c.StringSlice("resource")) == 0:
		return usageErr("--resource: name the resource(s) to quarantine objects of, e.g. --resource secrets")
	}
	if !c.Bool("dry-run") && c.Bool("no-undo") && c.String("snapshot-file") == "" {
		return usageErr("--no-undo: quarantine always keeps the removed values (its journal) for 'rollback'; leave out --no-undo")
	}
	if n := c.Int("batch-ops"); n <= 0 || n > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if err := checkSnapshotOutput(c, c.Bool("dry-run")); err != nil {
		return err
	}
	s, window, err := openToWrite(ctx, c, targetNone)
	if err != nil {
		return err
	}
	defer s.close()
	// Deletes and the journal get their own context: a SIGINT lets the batch in
	// flight finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	u, err := startRun(c, stateDir, "quarantine", s.endpoints(), s.env.Resolver.Prefix(), c.String("journal"), c.String("snapshot"))
	if err != nil {
		return err
	}
	var res *quarantine.Result
	defer func() {
		var removed int64
		if res != nil {
			removed = res.Removed
		}
		u.finish(c, err, removed, res)
	}()
	journal := u.journalPath(c)
	if journal == "" && c.String("snapshot-file") != "" && !c.Bool("dry-run") {
		// The private copy of a backup: the input file is the undo.
		journal = filepath.Join(s.snap.Dir(), "quarantine.journal")
	}
	res, runErr := quarantine.Run(ctx, s.env, quarantine.Options{
		Reasons:            reasons,
		DryRun:             c.Bool("dry-run"),
		Journal:            journal,
		Snapshot:           u.snapshotPath(c),
		OnPreflight:        u.recordChecks,
		AllowLiveAPIServer: c.Bool("allow-live-apiserver"),
		LivenessWindow:     window,
		PrivateEtcd:        c.String("snapshot-file"),
		BatchOps:           c.Int("batch-ops"),
		WriteContext:       writeCtx,
	})
	if res != nil {
		if err := printReport(c.App.Writer, c.String("output"), quarantineReport{res}); err != nil {
			return err
		}
	}
	if runErr != nil {
		return noOutput(s, quarantineError(runErr))
	}
	if res.Conflicts > 0 || res.Failed > 0 {
		return noOutput(s, &codeError{code: exitError, err: fmt.Errorf("%d object(s) changed since read, %d delete(s) failed: run again", res.Conflicts, res.Failed)})
	}
	if c.Bool("dry-run") {
		return nil
	}
	// What is left unreadable where it wrote: the objects it kept, or, in
	// --output-snapshot, what the verification of OUT finds.
	left := res.Kept
	if s.snap != nil {
		w := c.App.Writer
		if c.String("output") == "json" {
			w = c.App.ErrWriter
		}
		rep, err := saveAndVerify(ctx, c, s, w)
		if err != nil {
			return err
		}
		left = rep.Summary.Unreadable
	}
	if left > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) remain", left), quiet: true}
	}
	return nil
}

// quarantineFlags are the flags that set quarantine's options.
var quarantineFlags = map[quarantine.Option]string{
	quarantine.OptionReasons:   "--reason",
	quarantine.OptionResources: "--resource",
	quarantine.OptionRevision:  "--revision",
	quarantine.OptionJournal:   "--journal",
}

// quarantineError names the flag in a quarantine the options do not allow.
func quarantineError(err error) error {
	var oe *quarantine.OptionError
	if !errors.As(err, &oe) {
		return err
	}
	flag := quarantineFlags[oe.Option]
	if oe.Value != "" {
		flag += " " + oe.Value
	}
	if oe.Option == quarantine.OptionJournal {
		return fmt.Errorf("%s: %s (or --dry-run)", flag, oe.Msg)
	}
	return fmt.Errorf("%s: %s%s", flag, oe.Msg, oe.Seen(quarantineFlags[oe.See]))
}
