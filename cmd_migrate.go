package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
)

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "rewrite stale objects (compare-and-swap, leases kept, journal for rollback)",
		Flags: append(append(commonFlags(), targetFlags()...),
			outputFlag("table", "table", "json"),
			&cli.BoolFlag{Name: "dry-run", Usage: "decide everything, write nothing"},
			&cli.StringFlag{Name: "journal", Usage: "record old values before each write (mode 0600) for 'rollback'"},
			&cli.StringFlag{Name: "snapshot", Usage: "save an etcd snapshot here before the first write"},
			&cli.BoolFlag{Name: "allow-live-apiserver", Usage: "write even though a kube-apiserver looks alive"},
			&cli.Int64Flag{Name: "quota-backend-bytes", Value: migrate.DefaultQuotaBackendBytes, Usage: "etcd's --quota-backend-bytes; refuse a rewrite that would not fit"},
			&cli.IntFlag{Name: "writers", Value: 4, Usage: "concurrent write transactions"},
			&cli.IntFlag{Name: "batch-ops", Value: etcdscan.DefaultMaxOps, Usage: "puts per CAS transaction (etcd --max-txn-ops caps it, 128 by default)"},
			&cli.IntFlag{Name: "batch-bytes", Value: etcdscan.DefaultMaxBytes, Usage: "bytes per CAS transaction (below etcd --max-request-bytes, 1.5 MiB by default)"},
			&cli.BoolFlag{Name: "fail-fast", Usage: "stop at the first unreadable object or failed write"},
			&cli.StringFlag{Name: "metrics-file", Usage: "write Prometheus text-format metrics here"},
		),
		Action:             cmdMigrate,
		OnUsageError:       commandUsageError,
		CustomHelpTemplate: cli.CommandHelpTemplate + "\n" + exitCodesHelpTx + "\n",
	}
}

func cmdMigrate(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	if c.Int("batch-ops") <= 0 || c.Int("batch-ops") > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if c.Int("batch-bytes") <= 0 {
		return usageErr("--batch-bytes must be positive")
	}
	if c.Int("writers") <= 0 {
		return usageErr("--writers must be positive")
	}
	s, err := open(ctx, c, true)
	if err != nil {
		return err
	}
	defer s.close()
	prog := newProgress(c.App.ErrWriter, "migrate", countKeys(ctx, s.env))
	// Writes get their own context: a SIGINT stops scheduling but lets in-flight
	// transactions and the journal finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	sum, runErr := migrate.Run(ctx, s.env, migrate.Options{
		DryRun:             c.Bool("dry-run"),
		FailFast:           c.Bool("fail-fast"),
		Journal:            c.String("journal"),
		Snapshot:           c.String("snapshot"),
		AllowLiveAPIServer: c.Bool("allow-live-apiserver"),
		QuotaBackendBytes:  c.Int64("quota-backend-bytes"),
		BatchOps:           c.Int("batch-ops"),
		BatchBytes:         c.Int("batch-bytes"),
		Writers:            c.Int("writers"),
		WriteContext:       writeCtx,
		Progress:           func(n migrate.Counts) { prog.Set(n.Scanned) },
	})
	prog.Finish()
	if sum != nil {
		if err := writeSummary(c.App.Writer, sum, c.String("output")); err != nil {
			return err
		}
		if p := c.String("metrics-file"); p != "" {
			if err := metrics.WriteMigrate(p, migrateFigures(sum), sum.Duration); err != nil {
				return fmt.Errorf("--metrics-file %s: %w", p, err)
			}
		}
	}
	if runErr != nil {
		return runErr
	}
	if sum.Summary.Failed > 0 {
		return &codeError{code: exitError, err: fmt.Errorf("%d write(s) failed; see the failures above; run again to retry", sum.Summary.Failed)}
	}
	if sum.Summary.Unreadable > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) left untouched", sum.Summary.Unreadable)}
	}
	return nil
}
