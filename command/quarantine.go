package command

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/quarantine"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/writerun"
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

// quarantineOptions are quarantine's flags.
type quarantineOptions struct {
	scan    *scanOptions
	undo    undoOptions
	live    livenessOptions
	outSnap outputSnapshotOptions

	output      string
	reasonFlags []string
	reasons     []decode.Reason // reasonFlags parsed (validate)
	dryRun      bool
	batchOps    int
}

func newQuarantineOptions(c *cli.Context) *quarantineOptions {
	dryRun := c.Bool("dry-run")
	return &quarantineOptions{
		// A --snapshot-file is read in place; a run writes its
		// --output-snapshot directly, as migrate does.
		scan:        newScanOptions(c, targetNone),
		undo:        newUndoOptions(c),
		live:        newLivenessOptions(c),
		outSnap:     newOutputSnapshotOptions(c),
		output:      c.String("output"),
		reasonFlags: c.StringSlice("reason"),
		dryRun:      dryRun,
		batchOps:    c.Int("batch-ops"),
	}
}

// validate refuses, before anything is opened, what quarantine's flags
// alone refuse, then the paths they name that cannot be written.
func (o *quarantineOptions) validate() error {
	if err := o.undo.validate(); err != nil {
		return err
	}
	reasons, err := quarantine.ParseReasons(o.reasonFlags)
	if err != nil {
		return usageErr("%v", quarantineError(err))
	}
	o.reasons = reasons
	switch orphaned := quarantine.OnlyOrphaned(reasons); {
	case orphaned && len(o.scan.resources) > 0:
		return usageErr("--reason orphaned: orphaned keys belong to no resource; leave out --resource (the whole prefix is scanned, only orphaned keys are removed)")
	case !orphaned && len(o.scan.resources) == 0:
		return usageErr("--resource: name the resource(s) to quarantine objects of, e.g. --resource secrets")
	}
	if !o.dryRun && o.undo.noUndo && o.scan.snapshotFile == "" {
		return usageErr("--no-undo: quarantine always keeps the removed values (its journal) for 'rollback'; leave out --no-undo")
	}
	if n := o.batchOps; n <= 0 || n > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if err := o.outSnap.validate(o.scan.snapshotFile, o.dryRun); err != nil {
		return err
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	if err := o.scan.validate(); err != nil {
		return err
	}
	if err := o.undo.checkPath(o.dryRun); err != nil {
		return err
	}
	return o.outSnap.checkPath(o.scan.snapshotFile, o.dryRun)
}

func cmdQuarantine(c *cli.Context) error {
	o := newQuarantineOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	defer outliveTerminal(o.scan.io.errOut, o.dryRun)()
	return o.runQuarantine(ctx)
}

// runQuarantine is the quarantine command, its options validated.
func (o *quarantineOptions) runQuarantine(ctx context.Context) error {
	ios := o.scan.io
	o.scan.writes = !o.dryRun
	s, err := openToWrite(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	cfg, err := s.kine.onKine(o.undo.runConfig(ios.errOut, "quarantine", s.cli, s.env.Resolver.Prefix(), o.dryRun, o.scan.snapshotFile != "", o.live))
	if err != nil {
		return err
	}
	return doWrite(ctx, cfg, writerun.Stage{Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
		res, err := o.quarantineStage(ctx, s, r)
		var removed int64
		if res != nil {
			removed = res.Removed
		}
		return writerun.Result{Written: removed, Summary: res}, err
	}})
}

// quarantineStage is quarantine's work in the writing run r: the removals,
// the report and the output snapshot.
func (o *quarantineOptions) quarantineStage(ctx context.Context, s *session, r *writerun.Run) (*quarantine.Result, error) {
	ios := o.scan.io
	// Deletes and the journal get their own context: a SIGINT lets the batch in
	// flight finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	opts := quarantine.Options{
		Reasons:            o.reasons,
		DryRun:             o.dryRun,
		Journal:            r.Journal(),
		Snapshot:           r.Snapshot(),
		SaveSnapshot:       r.SaveSnapshot(),
		Lock:               r.Lock,
		OnPreflight:        func(lines []string) error { return r.Record("", lines) },
		Watch:              r.MainWatch(),
		AllowLiveAPIServer: o.live.allowLive,
		LivenessWindow:     o.live.window,
		StateDir:           r.StateDir(),
		BatchOps:           o.batchOps,
		WriteContext:       writeCtx,
	}
	if s.file != nil && !o.dryRun {
		// The backup read in place: the removals go to --output-snapshot,
		// written as migrate writes it; the input is the undo.
		w, err := snapshotdb.NewWriter(ctx, s.file, o.outSnap.path, snapshotdb.WriterOptions{})
		if err != nil {
			return nil, err
		}
		s.out = w
		opts.Output, opts.OutputFile = w, o.outSnap.path
	}
	res, runErr := quarantine.Run(ctx, s.env, opts)
	if res != nil {
		if err := printReport(ios.out, o.output, quarantineReport{res}); err != nil {
			return res, err
		}
	}
	if runErr != nil {
		return res, noOutput(s, stoppedByWriter(quarantineError(runErr)))
	}
	if res.Conflicts > 0 || res.Failed > 0 {
		return res, noOutput(s, &codeError{code: exitError, err: fmt.Errorf("%d object(s) changed since read, %d delete(s) failed: run again", res.Conflicts, res.Failed)})
	}
	if o.dryRun {
		return res, nil
	}
	// What is left unreadable where it wrote: the objects it kept, or, in
	// --output-snapshot, what the verification of OUT finds.
	left := res.Kept
	if s.out != nil {
		w := ios.out
		if o.output == "json" {
			w = ios.errOut
		}
		rep, err := buildAndVerify(ctx, o.outSnap, s, w)
		if err != nil {
			return res, err
		}
		left = rep.Summary.Unreadable
	}
	if left > 0 {
		return res, &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) remain", left), quiet: true}
	}
	return res, nil
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
