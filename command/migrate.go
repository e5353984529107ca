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
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/writerun"
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

// migrateOptions are migrate's flags (plan's too).
type migrateOptions struct {
	scan    *scanOptions
	undo    undoOptions
	live    livenessOptions
	space   spaceOptions
	outSnap outputSnapshotOptions

	output                        string
	dryRun, failFast              bool
	writers, batchOps, batchBytes int
	metricsFile                   string
	requested, record             bool
}

func newMigrateOptions(c *cli.Context) *migrateOptions {
	dryRun := c.Bool("dry-run")
	return &migrateOptions{
		scan:        newScanOptions(c, targetWrite),
		undo:        newUndoOptions(c),
		live:        newLivenessOptions(c),
		space:       newSpaceOptions(c),
		outSnap:     newOutputSnapshotOptions(c),
		output:      c.String("output"),
		dryRun:      dryRun,
		failFast:    c.Bool("fail-fast"),
		writers:     c.Int("writers"),
		batchOps:    c.Int("batch-ops"),
		batchBytes:  c.Int("batch-bytes"),
		metricsFile: c.String("metrics-file"),
		requested:   c.Bool("requested"),
		record:      c.Bool("record"),
	}
}

// validate refuses, before anything is opened, what migrate's flags alone
// refuse, then the paths they name that cannot be written.
func (o *migrateOptions) validate() error {
	if err := o.undo.validate(); err != nil {
		return err
	}
	if o.batchOps <= 0 || o.batchOps > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if o.batchBytes <= 0 {
		return usageErr("--batch-bytes must be positive")
	}
	if o.writers <= 0 {
		return usageErr("--writers must be positive")
	}
	in := o.scan.snapshotFile
	if in != "" && o.undo.snapshot != "" {
		return usageErr("--snapshot: with --snapshot-file, that file is the backup (it is never modified)")
	}
	if err := o.outSnap.validate(in, o.dryRun); err != nil {
		return err
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	if err := o.scan.validate(); err != nil {
		return err
	}
	if o.scan.target.encryptionOnly && (o.requested || o.record) {
		return usageErr("--encryption-only leaves storage versions as they are; --requested and --record are storage version migrations")
	}
	if o.record && in != "" && !o.dryRun {
		return usageErr("--record: a --snapshot-file's --output-snapshot holds the objects migrated, not new StorageVersionMigration records; migrate the restored cluster's etcd to record them")
	}
	if o.requested {
		if o.record {
			return usageErr("--requested and --record: the requests record their own outcome; give one of them")
		}
		if len(o.scan.resources) > 0 || o.scan.namespace != "" {
			return usageErr("--requested: the requests name their resources; --resource and --namespace do not apply")
		}
		if in != "" {
			return usageErr("--requested works on the cluster's etcd, not on --snapshot-file (an output snapshot must be current in every resource, a request migrates one)")
		}
	}
	if err := o.undo.checkPath(o.dryRun); err != nil {
		return err
	}
	return o.outSnap.checkPath(in, o.dryRun)
}

func cmdMigrate(c *cli.Context) error {
	o := newMigrateOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	setMemoryLimit(migrateMemoryLimit)
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	defer outliveTerminal(o.scan.io.errOut, o.dryRun)()
	return o.runMigrate(ctx)
}

// runMigrate is the migrate command, its options validated.
func (o *migrateOptions) runMigrate(ctx context.Context) error {
	ios := o.scan.io
	es, err := o.scan.clusterEtcds(ios.errOut)
	if err != nil {
		return err
	}
	if es.Split() {
		return o.runMigrateEtcds(ctx, es)
	}
	o.scan.writes = !o.dryRun
	s, err := openToWrite(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	if err := kineFlags(s.kine, o.requested, o.record, o.space.compactHistory); err != nil {
		return err
	}
	if s.kine != nil && s.kine.srv != nil && s.kine.srv.SQLite() {
		setMemoryLimit(sqliteMigrateMemoryLimit)
	}
	if o.requested {
		if err := storagemigration.Writable(s.env); err != nil {
			return usageErr("--requested: %v; nothing was written", err)
		}
	} else if err := checkRecord(o.record, s.env); err != nil {
		return err
	}
	cfg, err := s.kine.onKine(o.undo.runConfig(ios.errOut, "migrate", s.cli, s.env.Resolver.Prefix(), o.dryRun, s.file != nil, o.live))
	if err != nil {
		return err
	}
	if o.requested {
		return doWrite(ctx, cfg, writerun.Stage{Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
			res, err := o.runMigrateRequested(ctx, s, r)
			return writerun.Result{Written: requestsWritten(res), Summary: res}, err
		}})
	}
	return doWrite(ctx, cfg, writerun.Stage{Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
		sum, err := o.migrateStage(ctx, s, r)
		return writerun.Result{Written: migrateWritten(sum), Summary: sum}, err
	}})
}

// migrateStage is migrate's work in the writing run r: the migration, its
// records (--record), the report and the output snapshot.
func (o *migrateOptions) migrateStage(ctx context.Context, s *session, r *writerun.Run) (*migrate.Summary, error) {
	ios := o.scan.io
	started := time.Now()
	prog := newProgress(ios.errOut, "migrate", countKeys(ctx, s.env))
	// Writes get their own context: a SIGINT stops scheduling but lets in-flight
	// transactions and the journal finish.
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	opts := o.runOptions(writeCtx, r)
	opts.Progress = func(n migrate.Counts) { prog.Set(objectsDone(opts.DryRun, n)) }
	if s.file != nil && !opts.DryRun {
		if err := openOutput(ctx, o.outSnap.path, s, &opts); err != nil {
			prog.Finish()
			return nil, err
		}
	}
	sum, runErr := migrate.Run(ctx, s.env, opts)
	prog.Finish()
	records, recordErr := recordMigration(ctx, o.record, s.env, sum, runErr, started, opts)
	if sum != nil {
		if err := printReport(ios.out, o.output, migrateReport{sum, records}); err != nil {
			return sum, err
		}
		if p := o.metricsFile; p != "" {
			if err := metrics.WriteMigrate(p, migrateFigures(sum), sum.Duration); err != nil {
				return sum, fmt.Errorf("--metrics-file %s: %w", p, err)
			}
		}
	}
	if runErr != nil {
		return sum, noOutput(s, stoppedByWriter(runErr))
	}
	if recordErr != nil {
		return sum, stoppedByWriter(recordErr)
	}
	if sum.Summary.Failed > 0 {
		return sum, noOutput(s, &codeError{code: exitError, err: fmt.Errorf("%d write(s) failed; see the failures above; run again to retry", sum.Summary.Failed)})
	}
	if err := writeOutputSnapshot(ctx, o.scan, o.outSnap, o.output, o.dryRun, s); err != nil {
		return sum, err
	}
	if sum.Summary.Unreadable > 0 {
		return sum, &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) left untouched: %s", sum.Summary.Unreadable, unreadableCauses(sum.Causes))}
	}
	return sum, nil
}

// unreadableCauses says on stderr's one line why objects were left
// untouched: each cause with its count and its first key's error (which
// names the provider and key, the KMS plugin and its endpoint, the CRD and
// its webhook; never a value), as the report lists them.
func unreadableCauses(causes []migrate.FailureCause) string {
	var parts []string
	for _, c := range causes {
		if c.Status != string(reencode.Unreadable) {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d %s (the first: %s)", c.Count, c.Cause, textfmt.OneLine(c.Error)))
	}
	if len(parts) == 0 {
		return "see the report"
	}
	return strings.Join(parts, "; ")
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

// runOptions are migrate.Run's options in the writing run r: its journal,
// snapshot, watch, lock and plan (r nil: plan's, which writes nothing).
func (o *migrateOptions) runOptions(writeCtx context.Context, r *writerun.Run) migrate.Options {
	if r == nil {
		return o.migrateOptions(writeCtx, o.undo.journal, o.undo.snapshot, "")
	}
	opts := o.migrateOptions(writeCtx, r.Journal(), r.Snapshot(), r.StateDir())
	opts.Lock = r.Lock
	opts.SaveSnapshot = r.SaveSnapshot()
	opts.OnPreflight = func(lines []string) error { return r.Record("", lines) }
	opts.Watch = r.MainWatch()
	return opts
}

// migrateOptions are migrate.Run's options from the flags, with the journal
// and snapshot the run keeps and the state directory of its undo.
func (o *migrateOptions) migrateOptions(writeCtx context.Context, journal, snapshot string, stateDir writerun.StateDir) migrate.Options {
	opts := migrate.Options{
		DryRun:       o.dryRun,
		FailFast:     o.failFast,
		BatchOps:     o.batchOps,
		BatchBytes:   o.batchBytes,
		Writers:      o.writers,
		WriteContext: writeCtx,
	}
	// The checks before the first write (migrate.Options' preflight).
	opts.Journal, opts.Snapshot, opts.StateDir = journal, snapshot, stateDir
	opts.AllowLiveAPIServer, opts.LivenessWindow = o.live.allowLive, o.live.window
	opts.QuotaBackendBytes, opts.CompactHistory = o.space.quotaBackendBytes, o.space.compactHistory
	opts.Spell = flagOf
	return opts
}

// runMigrateRequested is 'migrate --requested'.
func (o *migrateOptions) runMigrateRequested(ctx context.Context, s *session, r *writerun.Run) (*storagemigration.Result, error) {
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	opts := o.runOptions(writeCtx, r)
	res, runErr := storagemigration.RunRequested(ctx, s.env, storagemigration.Options{Migrate: opts})
	if res != nil {
		if err := printReport(o.scan.io.out, o.output, requestedReport{res}); err != nil {
			return res, err
		}
	}
	if p := o.metricsFile; p != "" && res != nil && !res.DryRun {
		if err := metrics.WriteMigrate(p, requestFigures(res), requestsDuration(res)); err != nil {
			return res, fmt.Errorf("--metrics-file %s: %w", p, err)
		}
	}
	if runErr != nil {
		return res, stoppedByWriter(runErr)
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
func checkRecord(record bool, env *pipeline.Env) error {
	if !record {
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
func recordMigration(ctx context.Context, record bool, env *pipeline.Env, sum *migrate.Summary, runErr error, started time.Time, opts migrate.Options) ([]storagemigration.Recorded, error) {
	if !record || sum == nil {
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
func openOutput(ctx context.Context, out string, s *session, opts *migrate.Options) error {
	crds, err := s.env.Resolver.KeyPrefix(decode.CRDGroupResource, "")
	if err != nil {
		return err
	}
	w, err := snapshotdb.NewWriter(ctx, s.file, out, snapshotdb.WriterOptions{Track: func(key string) bool { return strings.HasPrefix(key, crds) }})
	if err != nil {
		return err
	}
	s.out = w
	opts.Output, opts.OutputFile = w, out
	return nil
}

// objectsDone is what migrate's progress bar shows: the objects decided, and
// for a run that writes, the stale ones written (or failed) too.
func objectsDone(dryRun bool, n migrate.Counts) int64 {
	if dryRun {
		return n.Scanned
	}
	return n.Done()
}
