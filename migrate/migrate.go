// Package migrate rewrites stale objects in place: it streams decisions from the
// pipeline, journals the old bytes, writes the new values with compare-and-swap on
// each key's mod revision in bounded multi-key transactions (keeping leases), trims
// CRD status.storedVersions once every object of a CRD is in its storage version,
// and sums up the run. Its preflight, journal, space guard and the rollback of a
// run are package undo's.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// DefaultWriters is the number of write transactions in flight (--writers).
// etcd's throughput on CAS transactions is bound by its WAL fsyncs, which
// commit every transaction that arrived meanwhile: with 16 in flight, each
// 16 puts (etcdscan.DefaultMaxOps), the rotation of 50,000 2 KB secrets
// wrote 1.7-1.9x faster than with 4 and the mixed dataset 1.3-2.1x (two
// sweeps of the benchmark, docs/benchmarks.md), while every raft entry, and so the memory etcd keeps for its
// recent entries, stays the size of a 16-put transaction. Larger transactions
// were faster still but grow that memory with their size.
const DefaultWriters = batches.DefaultWriters

// Options control a migration.
type Options struct {
	// PreflightOptions are what the checks before the first write go by:
	// the journal and snapshot, the quota, liveness, and how the lines
	// name the operator's inputs.
	guard.PreflightOptions
	DryRun     bool
	FailFast   bool
	BatchOps   int
	BatchBytes int
	Writers    int // concurrent write transactions; 0 = DefaultWriters
	// Progress, when set, is called after each page with the running totals.
	Progress func(Counts)
	// WriteContext is used for writes; it should outlive a SIGINT so in-flight
	// writes finish. nil = the run context.
	WriteContext context.Context
	// KeepStoredVersions leaves CRD status.storedVersions alone: the caller
	// decides the trim (storagemigration does, with the upstream controller's
	// generation check).
	KeepStoredVersions bool
	// Output, when set, is where the run writes instead of env.Client: an
	// output snapshot's writer, for a snapshot file read in place
	// (env.Source), named by OutputFile. Nothing else writes there and the
	// input is never modified (it is the undo): the preflight of a live etcd
	// (alarms, liveness, quota, the space guard) and the journal and snapshot
	// do not apply; the preflight says the output's room instead.
	Output     guard.Store
	OutputFile string
	// OnPreflight, when set, is given the checks passed, after the preflight
	// and the liveness window's verdict, before the first write (the run
	// directory's plan); an error stops the run with nothing written.
	OnPreflight func(checks []string) error
	// Lock, when set, is the writing run's lock, taken at the first write
	// before the snapshot starts (guard.FirstWrite.Lock).
	Lock func(context.Context) error
	// Decided, when set, is given each page of a dry run's decisions as it
	// is tallied (plan times a sample of the stale ones): the page is the
	// run's, copy what is kept.
	Decided func(page []reencode.Decision)
	// Watch, when set, is the liveness watch of the run this migration is
	// part of (the caller's, which it closes: storage version migrations
	// one resource after another, records written after): the migration
	// waits for its verdict and stops when it sees another writer. nil: the
	// migration starts its own (none with AllowLiveAPIServer).
	Watch *guard.Watch
}

// Done is how many objects are done with: decided, and written (or
// failed) when stale; what a progress bar shows (the scan may decide
// everything before the first write, holding the stale ones).
func (c Counts) Done() int64 {
	return c.Scanned - max(0, c.Stale-c.Rewritten-c.Conflicts-c.Failed)
}

// Counts are a summary's figures, overall or for one resource.
type Counts struct {
	Scanned    int64 `json:"scanned"`
	Current    int64 `json:"current"`
	Stale      int64 `json:"stale"`     // found stale (dry-run: would rewrite)
	Rewritten  int64 `json:"rewritten"` // written
	Conflicts  int64 `json:"conflicts"`
	Skipped    int64 `json:"skipped"` // never written: unreadable objects, orphaned keys and keys that are not objects
	Unreadable int64 `json:"unreadable"`
	// Orphaned counts keys no resource of the cluster owns (reencode.Orphaned):
	// left untouched, and not a failure (kube-apiserver never reads them).
	Orphaned int64 `json:"orphaned,omitempty"`
	Failed   int64 `json:"failed"`
	BytesOld int64 `json:"bytesRead"`
	BytesNew int64 `json:"bytesWritten"`
}

// ResourceSummary is one resource's line of a summary.
type ResourceSummary struct {
	Group    string         `json:"group"`
	Resource string         `json:"resource"`
	Reasons  map[string]int `json:"reasons,omitempty"`
	Counts
}

// Failure is one key that could not be migrated.
type Failure struct {
	Key    string `json:"key"`
	Status string `json:"status"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// FailureCause groups the failures of one cause: for an unreadable object its
// reason (undecryptable, ...), for a write what etcd answered
// (etcd-out-of-space, etcd-permission-denied, too-large, etcd-error, ...).
type FailureCause struct {
	Status   string `json:"status"` // unreadable or failed
	Cause    string `json:"cause"`
	Count    int64  `json:"count"`
	FirstKey string `json:"firstKey"`
	Error    string `json:"error"` // the first key's
}

// Summary is the result of a run.
type Summary struct {
	DryRun       bool               `json:"dryRun"`
	Revision     int64              `json:"revision"`
	Consistent   bool               `json:"consistent"`
	Restarts     []etcdscan.Restart `json:"restarts,omitempty"`
	Interrupted  bool               `json:"interrupted,omitempty"`
	Duration     time.Duration      `json:"-"`
	DurationText string             `json:"duration"`
	Summary      Counts             `json:"summary"`
	Resources    []ResourceSummary  `json:"resources"`
	Failures     []Failure          `json:"failures,omitempty"`
	Causes       []FailureCause     `json:"causes,omitempty"`
	Space        *guard.SpaceReport `json:"space,omitempty"`
	// WriteSizes is what the rewrite of the stale objects takes (a dry run's).
	WriteSizes *guard.WriteSizes `json:"writeSizes,omitempty"`
	CRDs       []CRDResult       `json:"crds,omitempty"`
	Preflight  []string          `json:"preflight,omitempty"`
	// FieldLoss lists, per custom resource and stored version, the fields
	// the rewrite dropped (a dry run: would drop) and how many objects
	// carried each (reencode.FieldLoss: paths and counts, never values):
	// what kube-apiserver's next write would have dropped too. A real run
	// counts the objects written.
	FieldLoss []reencode.FieldLoss `json:"fieldLoss,omitempty"`
	// Journal is the journal of a run that wrote: every rewritten object's
	// original value (its "intent" record's oldValue, as stored, still
	// encrypted if it was), what 'rollback' puts back.
	Journal string               `json:"journal,omitempty"`
	Writer  etcdscan.WriterStats `json:"writer"`
	// Backlog is the number of batches of decisions kept on disk while the
	// writers had no room for them (a compaction's wait), the reading and
	// deciding going on meanwhile.
	Backlog int `json:"backlog,omitempty"`
}

// Run migrates everything env selects. The returned summary is complete even when
// err is set (interrupted, fail-fast, preflight refusal).
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Summary, error) {
	start := time.Now()
	sum := &Summary{DryRun: opts.DryRun, Consistent: true}
	if env.Config.Revision != 0 {
		return sum, input.Errorf("migrate reads and writes the current revision: %s %d is for the read-only commands", input.Revision, env.Config.Revision)
	}
	t := newTally(opts.DryRun, env.Resolver.IsCustom)
	writeCtx := opts.WriteContext
	if writeCtx == nil {
		writeCtx = ctx
	}
	ew := &etcdscan.Writer{Client: env.Client, MaxOps: opts.BatchOps, MaxBytes: opts.BatchBytes, Kine: env.Target.APIServer().OnKine()}
	var w guard.Store = guard.EtcdStore{Writer: ew}
	if opts.Output != nil {
		w = opts.Output
	}

	// The run's first write waits for the liveness window's verdict and the
	// snapshot (first.Then opens the journal); the window runs while the
	// checks, the snapshot and the decisions go on (held: holder).
	first := &guard.FirstWrite{Client: env.Client, Lock: opts.Lock}
	// A dependency found gone while the first write still waits (a KMS
	// plugin, a conversion webhook, during the window or the snapshot) stops
	// the run at once: the wait is given up (gate), not sat out.
	gate, stopGate := context.WithCancel(ctx)
	defer stopGate()
	var journal *undo.Journal
	var sg *guard.SpaceGuard
	watch := opts.Watch
	if !opts.DryRun {
		var err error
		if watch == nil && opts.Output == nil {
			if watch, err = guard.StartWatch(ctx, env.Client, env.Resolver.Prefix(), opts.PreflightOptions); err != nil {
				return t.summary(sum, start), err
			}
			defer watch.Close()
		}
		if sg, err = preflight(ctx, env, opts, sum, watch, first, &journal); err != nil {
			return t.summary(sum, start), err
		}
		ew.Observer = watch.Observer()
		defer func() {
			if journal != nil {
				journal.Close()
			}
		}()
	}

	// The scan tallies each page and hands its stale decisions to the
	// writers; a writer's error stops the scan.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	batchOps := opts.BatchOps
	if batchOps <= 0 {
		batchOps = etcdscan.DefaultMaxOps
	}
	ws := batches.Start(opts.Writers, batchOps, cancel, func(ds []reencode.Decision) error {
		// An interruption, or a dependency found gone, while the first
		// batch waits writes nothing.
		if err := first.Open(gate); err != nil {
			if gate.Err() != nil {
				return nil
			}
			return err
		}
		return writeBatch(writeCtx, env, w, journal, sg, watch, ds, t, opts)
	})
	// While the first write waits, the decisions are held on disk (as the
	// room the preflight found allows) and the scan goes on. What the
	// writers have no room for yet, past what is held or after the wait (a
	// compaction's wait for room below the quota), is queued on disk too
	// (backlog), in the rest of that room, and the scan goes on.
	var hold *holder
	bl := newBacklog("", 0, ws, cancel)
	if !opts.DryRun && opts.Output == nil && opts.Journal != "" {
		room := sg.SpoolRoom()
		hold = newHolder(filepath.Dir(opts.Journal), room, func() { _ = first.Open(gate) })
		bl = newBacklog(filepath.Dir(opts.Journal), room-min(room, guard.SpoolMax), ws, cancel)
	}
	// A batch of what was held, once sent, is progress too: the writes
	// after the window report it as the scan's pages do.
	sendHeld := func(ctx context.Context, ds []reencode.Decision) error {
		err := ws.Send(ctx, ds)
		if opts.Progress != nil {
			opts.Progress(t.counts())
		}
		return err
	}
	stats, scanErr := env.Run(runCtx, 0, pipeline.Decide, func(page []reencode.Decision) error {
		stale, counts := t.page(page)
		if opts.DryRun && opts.Decided != nil {
			opts.Decided(page)
		}
		if opts.FailFast && counts.Unreadable > 0 {
			return errFailFast
		}
		if err := hold.send(runCtx, stale, bl.send, sendHeld); err != nil {
			return err
		}
		if opts.Progress != nil {
			opts.Progress(counts)
		}
		return nil
	})
	if errors.As(scanErr, new(*pipeline.DependencyError)) {
		stopGate()
	}
	// What was held is sent once the scan ended as it should (or at the
	// first unreadable object, as the batches queued before it are); a run
	// stopped by a dependency gone or an interruption sends nothing more.
	drain := scanErr == nil || errors.Is(scanErr, errFailFast)
	if drain {
		if err := hold.release(runCtx, sendHeld); err != nil && scanErr == nil {
			scanErr = err
		}
	}
	hold.close()
	// What the backlog keeps goes the same way; a batch of it that does not
	// read back stops the run (its error is the run's).
	if err := bl.finish(drain); err != nil {
		scanErr = err
	}
	sum.Backlog = bl.kept()
	writeErr := ws.Wait()
	hold.wait()
	if sg != nil {
		sg.Finish(writeCtx)
	}
	sum.Revision, sum.Consistent, sum.Restarts = stats.Revision, stats.Consistent, stats.Restarts
	sum.Writer = w.Stats()

	err := outcome(ctx, sum, opts, writeErr, scanErr)
	// Under --encryption-only no object moves to the storage version: the
	// decisions say nothing about CRDs' storedVersions.
	keepStored := opts.KeepStoredVersions || env.Planner.EncryptionOnly
	if err == nil && !opts.DryRun && !keepStored {
		// The scan decided every object of the resources in scope as of
		// its first revision: one that went on at a newer revision after a
		// compaction (--compact-history's own) read there the keys it had
		// not read yet, and a key last written at or before the first
		// revision holds the same bytes at any later one. A scan of one
		// namespace did not: then the re-check decodes every object.
		decidedAt := sum.Revision
		if env.Config.Namespace != "" {
			decidedAt = 0
		}
		sum.CRDs, err = TrimStoredVersions(writeCtx, env, t.crdPending, decidedAt, &t.crWrites, w, func(context.Context) (*undo.Journal, error) {
			if err := first.Open(ctx); err != nil {
				return nil, err
			}
			if err := watch.Stopped(); err != nil {
				return nil, err
			}
			return journal, nil
		})
	} else if err == nil && !keepStored {
		sum.CRDs = PlanStoredVersions(env, t.crdPending)
	}
	if first.Opened() {
		// Every write of the run, up to the last, is judged: a writer that
		// appeared is the run's outcome, whatever else it met.
		var we *liveness.WriterError
		if serr := watch.Settle(writeCtx); serr != nil && (err == nil || errors.As(serr, &we)) {
			err = serr
		}
	}
	return t.summary(sum, start), err
}

// Preflight is what a run of opts checks in env's etcd before its first
// write (its quota, alarms, the room of its undo and of etcd's growth),
// without writing: the check writerun runs in each other etcd of a run over
// several before the first write on any.
func Preflight(ctx context.Context, env *pipeline.Env, opts Options) error {
	_, _, err := guard.Preflight(ctx, env, opts.PreflightOptions)
	return err
}

// preflight is what a run that writes checks before its first write (a live
// etcd's, or the output snapshot's), recorded in sum: the space guard it
// returns (nil for an output snapshot) compacts only what watch has judged;
// first, the first write, saves the snapshot while the liveness window
// ends, then adds the window's verdict to the checks, hands them to
// OnPreflight and opens the journal (into journal; nil without one).
func preflight(ctx context.Context, env *pipeline.Env, opts Options, sum *Summary, watch *guard.Watch, first *guard.FirstWrite, journal **undo.Journal) (*guard.SpaceGuard, error) {
	var checks []string
	var sg *guard.SpaceGuard
	var err error
	if opts.Output != nil {
		checks, err = guard.OutputPreflight(ctx, env, opts.OutputFile, opts.PreflightOptions)
	} else {
		checks, sg, err = guard.Preflight(ctx, env, opts.PreflightOptions)
		first.Snapshot, first.Save = opts.Snapshot, opts.SaveSnapshot
	}
	sum.Preflight = checks
	if err != nil {
		return nil, err
	}
	if sg != nil {
		sum.Space = sg.Report()
		sg.Watched(watch)
	}
	first.Watch = watch
	first.Then = func(line string) error {
		if line != "" {
			checks = append(checks, line)
		}
		sum.Preflight = checks
		if opts.OnPreflight != nil {
			if err := opts.OnPreflight(checks); err != nil {
				return err
			}
		}
		if opts.Journal == "" {
			return nil
		}
		// With an output snapshot, its mod revisions are the output's.
		sum.Journal = opts.Journal
		j, err := undo.OpenJournal(opts.Journal)
		if err != nil {
			return err
		}
		*journal = j
		return nil
	}
	return sg, nil
}

// outcome is the run's error from the writers' and the scan's: a write's
// first, then fail-fast, an interruption (sum says so), the scan's.
func outcome(ctx context.Context, sum *Summary, opts Options, writeErr, scanErr error) error {
	var spaceErr *guard.SpaceError
	if errors.As(writeErr, &spaceErr) {
		spaceErr.Journal = opts.Journal
	}
	switch {
	case writeErr != nil:
		return writeErr
	case errors.As(scanErr, new(*pipeline.DependencyError)):
		var dep *pipeline.DependencyError
		errors.As(scanErr, &dep)
		sent := sum.Writer.Txns + sum.Writer.Fallbacks + sum.Writer.Singles
		return &StoppedError{Dependency: dep, Journal: opts.Journal, DryRun: opts.DryRun, Output: opts.Output != nil, BeforeFirstWrite: sent == 0}
	case errors.Is(scanErr, errFailFast):
		return input.Errorf("%s: stopped at the first unreadable object", input.FailFast)
	case scanErr != nil && ctx.Err() != nil:
		sum.Interrupted = true
		return fmt.Errorf("interrupted: in-flight writes finished; run again to resume (current objects are skipped)")
	}
	return scanErr
}

var errFailFast = errors.New("fail fast")

// StoppedError is a run stopped in the middle by something it depends on
// gone (pipeline.DependencyError: a KMS plugin that does not answer, the
// write encryption provider failing, a conversion webhook that stopped
// answering): no batch was sent after it was found, the batches in flight
// finished and are journaled, nothing was written for the objects that
// needed it. Run again once it is back: the objects written are current
// and skipped.
type StoppedError struct {
	Dependency *pipeline.DependencyError
	Journal    string
	DryRun     bool
	Output     bool // writing an output snapshot (nothing written to etcd)
	// BeforeFirstWrite: the run sent no write (it stopped while its first
	// write waited: what it had decided was dropped).
	BeforeFirstWrite bool
}

func (e *StoppedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stopped: %v", e.Dependency)
	switch {
	case e.DryRun:
		b.WriteString("; nothing was written (a dry run); once it answers again, run again")
		return b.String()
	case e.Output:
		b.WriteString("; the output snapshot was not written; once it answers again, run again")
		return b.String()
	case e.BeforeFirstWrite:
		b.WriteString("; it stopped before its first write: nothing was written; once it answers again, run migrate again")
		return b.String()
	}
	b.WriteString("; no batch was sent after it, the batches in flight finished")
	if e.Journal != "" {
		fmt.Fprintf(&b, " and are journaled in %s", e.Journal)
	}
	b.WriteString(", nothing was written for the objects that needed it; once it answers again, run migrate again: it picks up from what was written (or roll the run back)")
	return b.String()
}

func (e *StoppedError) Unwrap() error { return e.Dependency }

// writeBatch journals, writes and tallies one batch of stale decisions. It
// writes nothing once the writer met an error no retry fixes, once the run's
// liveness watch saw another writer, nor when the batch would take etcd's
// database past its quota (guard).
func writeBatch(ctx context.Context, env *pipeline.Env, w guard.Store, j *undo.Journal, sg *guard.SpaceGuard, watch *guard.Watch, ds []reencode.Decision, t *tally, opts Options) error {
	if w.Stopped() != nil {
		return nil // the run is stopping; the first error was returned
	}
	if err := watch.Stopped(); err != nil {
		return err // another writer: no new batch
	}

	puts := make([]etcdscan.Put, len(ds))
	var cost int64
	for i, d := range ds {
		puts[i] = etcdscan.Put{Key: d.Key, Value: d.NewValue, ModRevision: d.ModRevision, Read: d.Read}
		cost += guard.PutCost(d.Key, d.NewValue)
	}
	if sg != nil {
		if err := sg.Reserve(ctx, cost); err != nil {
			return err
		}
		defer sg.Done(cost)
	}
	if j != nil {
		old := make([][]byte, len(ds))
		for i, d := range ds {
			old[i] = d.OldValue
		}
		if err := j.Intents(puts, old); err != nil {
			return fmt.Errorf("%w (nothing of this batch was written)", err)
		}
	}
	results := w.Write(ctx, puts)
	if j != nil {
		if err := j.Done(results); err != nil {
			return err
		}
	}
	crash.At("written") // the tests' panic once a batch is written
	var stop error
	if key, fe := guard.FirstFatal(results); fe != nil && opts.Output != nil {
		stop = fmt.Errorf("write %s: %w", key, fe)
	} else if fe != nil {
		stop = guard.NewStopError(ctx, fe, key, opts.Journal, "migrate", func(ctx context.Context) ([]string, error) { return etcdscan.Alarms(ctx, env.Client) })
	}
	firstErr := t.written(ds, results, opts.FailFast)
	if stop != nil {
		return stop
	}
	return firstErr
}
