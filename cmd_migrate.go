package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
)

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "rewrite stale objects (compare-and-swap, leases kept, journal for rollback)",
		Flags: append(append(append(commonFlags(), targetFlags()...),
			outputFlag("table", "table", "json"),
			&cli.BoolFlag{Name: "dry-run", Usage: "decide everything, write nothing"},
			&cli.StringFlag{Name: "journal", Usage: "record old values before each write (mode 0600) for 'rollback'"},
			&cli.StringFlag{Name: "snapshot", Usage: "save an etcd snapshot here before the first write"},
			&cli.BoolFlag{Name: "allow-live-apiserver", Usage: "write even though a kube-apiserver looks alive"},
			&cli.Int64Flag{Name: "quota-backend-bytes", Usage: "etcd's --quota-backend-bytes, when its members' metrics (etcd_server_quota_backend_bytes) do not answer; else etcd's manifest beside --apiserver-manifest; the preflight says which it used"},
			&cli.BoolFlag{Name: "compact-history", Usage: "compact etcd's history up to the run's latest write whenever the database nears the quota, as kube-apiserver's compactor does (the journal is the rollback), so a rewrite larger than the free space completes"},
			&cli.IntFlag{Name: "writers", Value: migrate.DefaultWriters, Usage: "concurrent write transactions"},
			&cli.IntFlag{Name: "batch-ops", Value: etcdscan.DefaultMaxOps, Usage: "puts per CAS transaction (etcd --max-txn-ops caps it, 128 by default)"},
			&cli.IntFlag{Name: "batch-bytes", Value: etcdscan.DefaultMaxBytes, Usage: "bytes per CAS transaction (below etcd --max-request-bytes, 1.5 MiB by default)"},
			&cli.BoolFlag{Name: "fail-fast", Usage: "stop at the first unreadable object or failed write"},
			&cli.StringFlag{Name: "metrics-file", Usage: "write Prometheus text-format metrics here"},
			&cli.BoolFlag{Name: "requested", Usage: "carry out exactly the cluster's pending StorageVersionMigration requests, in kube-controller-manager's order, and record each outcome in the request as it does (needs a target kube-apiserver serving storagemigration.k8s.io)"},
			&cli.BoolFlag{Name: "record", Usage: "after the migration, write a finished StorageVersionMigration for each resource rewritten, so the cluster's API shows it (needs a target kube-apiserver serving storagemigration.k8s.io, else nothing is written)"},
		), outputSnapshotFlags()...),
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
	if c.String("snapshot-file") != "" && c.String("snapshot") != "" {
		return usageErr("--snapshot: with --snapshot-file, that file is the backup (it is never modified)")
	}
	if err := checkSnapshotOutput(c, c.Bool("dry-run")); err != nil {
		return err
	}
	s, err := open(ctx, c, true)
	if err != nil {
		return err
	}
	defer s.close()
	if err := knowTheRelease(c, s.env); err != nil {
		return err
	}
	if c.Bool("requested") {
		return cmdMigrateRequested(ctx, c, s)
	}
	if err := checkRecord(c, s.env); err != nil {
		return err
	}
	started := time.Now()
	prog := newProgress(c.App.ErrWriter, "migrate", countKeys(ctx, s.env))
	// Writes get their own context: a SIGINT stops scheduling but lets in-flight
	// transactions and the journal finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	opts := migrateOptions(c, writeCtx)
	opts.Progress = func(n migrate.Counts) { prog.Set(n.Scanned) }
	sum, runErr := migrate.Run(ctx, s.env, opts)
	prog.Finish()
	records, recordErr := recordMigration(ctx, c, s.env, sum, runErr, started, writeCtx)
	if sum != nil {
		if err := writeMigrateReport(c.App.Writer, sum, records, c.String("output")); err != nil {
			return err
		}
		if p := c.String("metrics-file"); p != "" {
			if err := metrics.WriteMigrate(p, migrateFigures(sum), sum.Duration); err != nil {
				return fmt.Errorf("--metrics-file %s: %w", p, err)
			}
		}
	}
	if runErr != nil {
		return noOutput(s, runErr)
	}
	if recordErr != nil {
		return recordErr
	}
	if sum.Summary.Failed > 0 {
		return noOutput(s, &codeError{code: exitError, err: fmt.Errorf("%d write(s) failed; see the failures above; run again to retry", sum.Summary.Failed)})
	}
	if err := writeOutputSnapshot(ctx, c, s); err != nil {
		return err
	}
	if sum.Summary.Unreadable > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) left untouched", sum.Summary.Unreadable)}
	}
	return nil
}
