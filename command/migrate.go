package command

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotout"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/undo"
)

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "rewrite stale objects (compare-and-swap, leases kept, journal for rollback)",
		Flags: append(append(append(commonFlags(), targetFlags()...),
			outputFlag("table", "table", "json"),
			&cli.BoolFlag{Name: "dry-run", Usage: "decide everything, write nothing"},
			&cli.IntFlag{Name: "writers", Value: migrate.DefaultWriters, Usage: "concurrent write transactions"},
			&cli.IntFlag{Name: "batch-ops", Value: etcdscan.DefaultMaxOps, Usage: "puts per CAS transaction (etcd --max-txn-ops caps it, 128 by default)"},
			&cli.IntFlag{Name: "batch-bytes", Value: etcdscan.DefaultMaxBytes, Usage: "bytes per CAS transaction (below etcd --max-request-bytes, 1.5 MiB by default)"},
			&cli.BoolFlag{Name: "fail-fast", Usage: "stop at the first unreadable object or failed write"},
			&cli.StringFlag{Name: "metrics-file", Usage: "write Prometheus text-format metrics here"},
			&cli.BoolFlag{Name: "requested", Usage: "carry out exactly the cluster's pending StorageVersionMigration requests, in kube-controller-manager's order, and record each outcome in the request as it does (needs a target kube-apiserver serving storagemigration.k8s.io)"},
			&cli.BoolFlag{Name: "record", Usage: "after the migration, write a finished StorageVersionMigration for each resource rewritten, so the cluster's API shows it (needs a target kube-apiserver serving storagemigration.k8s.io, else nothing is written)"},
		), append(append(append(undoFlags(), spaceFlags()...), livenessFlags()...), outputSnapshotFlags()...)...),
		Action:       cmdMigrate,
		OnUsageError: commandUsageError,
	}
}

func cmdMigrate(c *cli.Context) (err error) {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	stateDir, err := checkUndoFlags(c)
	if err != nil {
		return err
	}
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
	s, window, err := openToWrite(ctx, c, targetWrite)
	if err != nil {
		return err
	}
	defer s.close()
	if c.Bool("encryption-only") && (c.Bool("requested") || c.Bool("record")) {
		return usageErr("--encryption-only leaves storage versions as they are; --requested and --record are storage version migrations")
	}
	if c.Bool("record") && s.file != nil && !c.Bool("dry-run") {
		return usageErr("--record: a --snapshot-file's --output-snapshot holds the objects migrated, not new StorageVersionMigration records; migrate the restored cluster's etcd to record them")
	}
	if c.Bool("requested") {
		if err := checkRequested(c, s); err != nil {
			return err
		}
	} else if err := checkRecord(c, s.env); err != nil {
		return err
	}
	u, err := startRun(c, stateDir, "migrate", s.endpoints(), s.env.Resolver.Prefix(), c.String("journal"), c.String("snapshot"))
	if err != nil {
		return err
	}
	if c.Bool("requested") {
		var res *storagemigration.Result
		defer func() { u.finish(c, err, requestsWritten(res), res) }()
		res, err = cmdMigrateRequested(ctx, c, s, u, window)
		return err
	}
	var sum *migrate.Summary
	defer func() { u.finish(c, err, migrateWritten(sum), sum) }()
	started := time.Now()
	prog := newProgress(c.App.ErrWriter, "migrate", countKeys(ctx, s.env))
	// Writes get their own context: a SIGINT stops scheduling but lets in-flight
	// transactions and the journal finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	opts := migrateOptions(c, writeCtx, u, window)
	opts.Progress = func(n migrate.Counts) { prog.Set(n.Scanned) }
	if s.file != nil && !opts.DryRun {
		if err := openOutput(ctx, c, s, &opts); err != nil {
			prog.Finish()
			return err
		}
	}
	sum, runErr := migrate.Run(ctx, s.env, opts)
	prog.Finish()
	records, recordErr := recordMigration(ctx, c, s.env, sum, runErr, started, opts)
	if sum != nil {
		if err := printReport(c.App.Writer, c.String("output"), migrateReport{sum, records}); err != nil {
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

// migrateWritten counts what a migration wrote.
func migrateWritten(sum *migrate.Summary) int64 {
	if sum == nil {
		return 0
	}
	return sum.Summary.Rewritten
}

// requestsWritten counts what the migrations of StorageVersionMigration requests wrote.
func requestsWritten(res *storagemigration.Result) int64 {
	var n int64
	if res == nil {
		return 0
	}
	for _, o := range res.Requests {
		if o.Migration != nil {
			n += o.Migration.Summary.Rewritten
		}
	}
	return n
}

// migrateOptions are the write options of the migrate command's flags; u is
// the run directory the journal and snapshot go to.
func migrateOptions(c *cli.Context, writeCtx context.Context, u *undoRun, window time.Duration) migrate.Options {
	return migrate.Options{
		PreflightOptions: undo.PreflightOptions{
			Journal:            u.journalPath(c),
			Snapshot:           u.snapshotPath(c),
			AllowLiveAPIServer: c.Bool("allow-live-apiserver"),
			LivenessWindow:     window,
			QuotaBackendBytes:  c.Int64("quota-backend-bytes"),
			CompactHistory:     c.Bool("compact-history"),
			PrivateEtcd:        c.String("snapshot-file"),
			Spell:              flagOf,
		},
		DryRun:       c.Bool("dry-run"),
		FailFast:     c.Bool("fail-fast"),
		OnPreflight:  u.recordChecks,
		BatchOps:     c.Int("batch-ops"),
		BatchBytes:   c.Int("batch-bytes"),
		Writers:      c.Int("writers"),
		WriteContext: writeCtx,
	}
}

// checkRequested refuses what 'migrate --requested' does not take, before anything is written.
func checkRequested(c *cli.Context, s *session) error {
	if c.Bool("record") {
		return usageErr("--requested and --record: the requests record their own outcome; give one of them")
	}
	if len(c.StringSlice("resource")) > 0 || c.String("namespace") != "" {
		return usageErr("--requested: the requests name their resources; --resource and --namespace do not apply")
	}
	if c.String("snapshot-file") != "" {
		return usageErr("--requested works on the cluster's etcd, not on --snapshot-file (an output snapshot must be current in every resource, a request migrates one)")
	}
	if err := storagemigration.Writable(s.env); err != nil {
		return usageErr("--requested: %v; nothing was written", err)
	}
	return nil
}

// cmdMigrateRequested is 'migrate --requested'.
func cmdMigrateRequested(ctx context.Context, c *cli.Context, s *session, u *undoRun, window time.Duration) (*storagemigration.Result, error) {
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	res, runErr := storagemigration.RunRequested(ctx, s.env, storagemigration.Options{Migrate: migrateOptions(c, writeCtx, u, window)})
	if res != nil {
		if err := printReport(c.App.Writer, c.String("output"), requestedReport{res}); err != nil {
			return res, err
		}
	}
	if p := c.String("metrics-file"); p != "" && res != nil && !res.DryRun {
		if err := metrics.WriteMigrate(p, requestFigures(res), requestsDuration(res)); err != nil {
			return res, fmt.Errorf("--metrics-file %s: %w", p, err)
		}
	}
	if runErr != nil {
		return res, runErr
	}
	unreadable := false
	for _, o := range res.Requests {
		if o.Result == storagemigration.ResultLeftRunning {
			return res, &codeError{code: exitError, err: fmt.Errorf("request %s: %s", o.Name, o.Message)}
		}
		if o.Migration != nil && o.Migration.Summary.Unreadable > 0 {
			unreadable = true
		}
	}
	if unreadable {
		return res, &codeError{code: exitUnreadable, err: fmt.Errorf("unreadable object(s) left untouched: the requests of their resources are Failed")}
	}
	return res, nil
}

// checkRecord refuses --record, before anything is written, when the target
// kube-apiserver would not serve the records.
func checkRecord(c *cli.Context, env *pipeline.Env) error {
	if !c.Bool("record") {
		return nil
	}
	if err := storagemigration.Writable(env); err != nil {
		return usageErr("--record: %v; nothing was written", err)
	}
	served, why, err := storagemigration.Serving(env)
	if err != nil {
		return err
	}
	if !served {
		return &codeError{code: exitError, err: fmt.Errorf("--record: %s; nothing was written", why)}
	}
	return nil
}

// recordMigration writes the records of a finished migration (--record).
func recordMigration(ctx context.Context, c *cli.Context, env *pipeline.Env, sum *migrate.Summary, runErr error, started time.Time, opts migrate.Options) ([]storagemigration.Recorded, error) {
	if !c.Bool("record") || sum == nil {
		return nil, nil
	}
	if sum.DryRun {
		var out []storagemigration.Recorded
		for _, r := range sum.Resources {
			if r.Stale > 0 {
				gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
				out = append(out, storagemigration.Recorded{Name: storagemigration.RecordName(started, gr), Group: r.Group, Resource: r.Resource, Result: "would-record"})
			}
		}
		return out, nil
	}
	if runErr != nil {
		return nil, fmt.Errorf("--record: the migration did not finish: no record was written")
	}
	recs, err := storagemigration.Record(ctx, env, sum, started, opts, nil)
	if err != nil {
		return recs, fmt.Errorf("--record: %w", err)
	}
	return recs, nil
}

// openOutput prepares the writer of --output-snapshot for a run on a
// snapshot file read in place: the run writes there (opts.Output). The
// CRDs' writes are kept to be read back: the storedVersions trim reads a CRD
// the run may have rewritten.
func openOutput(ctx context.Context, c *cli.Context, s *session, opts *migrate.Options) error {
	crds, err := s.env.Resolver.KeyPrefix(decode.CRDGroupResource, "")
	if err != nil {
		return err
	}
	out := c.String("output-snapshot")
	w, err := snapshotout.New(ctx, s.file, out, snapshotout.Options{Track: func(key string) bool { return strings.HasPrefix(key, crds) }})
	if err != nil {
		return err
	}
	s.out = w
	opts.Output, opts.OutputFile = w, out
	return nil
}
