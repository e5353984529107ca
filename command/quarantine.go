package command

import (
	"context"
	"fmt"

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
			&cli.StringFlag{Name: "journal", Usage: "record each removed key's value, lease and revisions here (mode 0600) for 'rollback'; required unless --dry-run"},
			&cli.BoolFlag{Name: "allow-live-apiserver", Usage: "remove even though a kube-apiserver looks alive"},
			&cli.IntFlag{Name: "batch-ops", Value: 16, Usage: "deletes per CAS transaction"},
		), outputSnapshotFlags()...),
		Action:             cmdQuarantine,
		OnUsageError:       commandUsageError,
		CustomHelpTemplate: cli.CommandHelpTemplate + "\n" + exitCodesHelpTx + "\n",
	}
}

func cmdQuarantine(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	reasons, err := quarantine.ParseReasons(c.StringSlice("reason"))
	if err != nil {
		return usageErr("%v", err)
	}
	switch orphaned := quarantine.OnlyOrphaned(reasons); {
	case orphaned && len(c.StringSlice("resource")) > 0:
		return usageErr("--reason orphaned: orphaned keys belong to no resource; leave out --resource (the whole prefix is scanned, only orphaned keys are removed)")
	case !orphaned && len(c.StringSlice("resource")) == 0:
		return usageErr("--resource: name the resource(s) to quarantine objects of, e.g. --resource secrets")
	}
	if !c.Bool("dry-run") && c.String("journal") == "" {
		return usageErr("--journal FILE is required: the removed values are recorded there, for 'rollback' (or --dry-run)")
	}
	if n := c.Int("batch-ops"); n <= 0 || n > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if err := checkSnapshotOutput(c, c.Bool("dry-run")); err != nil {
		return err
	}
	s, err := open(ctx, c, false)
	if err != nil {
		return err
	}
	defer s.close()
	// Deletes and the journal get their own context: a SIGINT lets the batch in
	// flight finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	res, runErr := quarantine.Run(ctx, s.env, quarantine.Options{
		Reasons:            reasons,
		DryRun:             c.Bool("dry-run"),
		Journal:            c.String("journal"),
		AllowLiveAPIServer: c.Bool("allow-live-apiserver"),
		PrivateEtcd:        c.String("snapshot-file"),
		BatchOps:           c.Int("batch-ops"),
		WriteContext:       writeCtx,
	})
	if res != nil {
		if err := writeReport(c.App.Writer, c.String("output"), res.Write); err != nil {
			return err
		}
	}
	if runErr != nil {
		return noOutput(s, runErr)
	}
	if res.Conflicts > 0 || res.Failed > 0 {
		return noOutput(s, &codeError{code: exitError, err: fmt.Errorf("%d object(s) changed since read, %d delete(s) failed: run again", res.Conflicts, res.Failed)})
	}
	if s.snap != nil && !c.Bool("dry-run") {
		w := c.App.Writer
		if c.String("output") == "json" {
			w = c.App.ErrWriter
		}
		if _, err := saveAndVerify(ctx, c, s, w); err != nil {
			return err
		}
	}
	return nil
}
