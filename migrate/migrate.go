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
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
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
const DefaultWriters = 16

// Options control a migration.
type Options struct {
	// PreflightOptions are what the checks before the first write go by:
	// the journal and snapshot, the quota, liveness, and how the lines
	// name the operator's inputs.
	undo.PreflightOptions
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
	Output     undo.Store
	OutputFile string
	// OnPreflight, when set, is given the checks passed, after the preflight
	// and before the first write (the run directory's plan); an error stops
	// the run with nothing written.
	OnPreflight func(checks []string) error
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
	Space        *undo.SpaceReport  `json:"space,omitempty"`
	// WriteSizes is what the rewrite of the stale objects takes (a dry run's).
	WriteSizes *undo.WriteSizes `json:"writeSizes,omitempty"`
	CRDs       []CRDResult      `json:"crds,omitempty"`
	Preflight  []string         `json:"preflight,omitempty"`
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
}

// maxFailuresListed bounds the failure list kept in memory and in the report.
const maxFailuresListed = 1000

type tally struct {
	mu        sync.Mutex
	total     Counts
	resources map[schema.GroupResource]*ResourceSummary
	failures  []Failure
	failedN   int
	causes    []FailureCause
	// crdPending counts, per custom resource, objects not (yet) in the storage version.
	crdPending map[schema.GroupResource]int64
	// crWrites are the revisions of the run's own writes of custom resources.
	crWrites Revisions
	// fieldLoss: the fields of the objects rewritten (a dry run: stale) that
	// the rewrite drops.
	fieldLoss reencode.FieldLosses
	// sizes: what the stale objects' rewrite takes (a dry run).
	sizes undo.WriteSizes
}

func (t *tally) res(gr schema.GroupResource) *ResourceSummary {
	r := t.resources[gr]
	if r == nil {
		r = &ResourceSummary{Group: gr.Group, Resource: gr.Resource, Reasons: map[string]int{}}
		t.resources[gr] = r
	}
	return r
}

func (t *tally) fail(f Failure) {
	t.failedN++
	found := false
	for i := range t.causes {
		if c := &t.causes[i]; c.Status == f.Status && c.Cause == f.Reason {
			c.Count++
			found = true
			break
		}
	}
	if !found {
		t.causes = append(t.causes, FailureCause{Status: f.Status, Cause: f.Reason, Count: 1, FirstKey: f.Key, Error: f.Error})
	}
	if len(t.failures) < maxFailuresListed {
		t.failures = append(t.failures, f)
	}
}

// Run migrates everything env selects. The returned summary is complete even when
// err is set (interrupted, fail-fast, preflight refusal).
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Summary, error) {
	start := time.Now()
	sum := &Summary{DryRun: opts.DryRun, Consistent: true}
	if env.Config.Revision != 0 {
		return sum, input.Errorf("migrate reads and writes the current revision: %s %d is for the read-only commands", input.Revision, env.Config.Revision)
	}
	t := &tally{resources: map[schema.GroupResource]*ResourceSummary{}, crdPending: map[schema.GroupResource]int64{}}
	writeCtx := opts.WriteContext
	if writeCtx == nil {
		writeCtx = ctx
	}
	var w undo.Store = undo.EtcdStore{Writer: &etcdscan.Writer{Client: env.Client, MaxOps: opts.BatchOps, MaxBytes: opts.BatchBytes}}
	if opts.Output != nil {
		w = opts.Output
	}
	batchOps := opts.BatchOps
	if batchOps <= 0 {
		batchOps = etcdscan.DefaultMaxOps
	}
	writers := opts.Writers
	if writers <= 0 {
		writers = DefaultWriters
	}

	var journal *undo.Journal
	var guard *undo.SpaceGuard
	if !opts.DryRun {
		var checks []string
		var err error
		if opts.Output != nil {
			checks, err = undo.OutputPreflight(ctx, env, opts.OutputFile, opts.PreflightOptions)
		} else {
			checks, guard, err = undo.Preflight(ctx, env, opts.PreflightOptions)
		}
		sum.Preflight = checks
		if err != nil {
			return finish(sum, t, start), err
		}
		if guard != nil {
			sum.Space = guard.Report()
		}
		if opts.OnPreflight != nil {
			if err := opts.OnPreflight(checks); err != nil {
				return finish(sum, t, start), fmt.Errorf("%w (nothing was written)", err)
			}
		}
		if opts.Journal != "" {
			// With an output snapshot, its mod revisions are the output's.
			sum.Journal = opts.Journal
			journal, err = undo.OpenJournal(opts.Journal)
			if err != nil {
				return finish(sum, t, start), err
			}
			defer journal.Close()
		}
	}

	// Writers: batches of stale decisions, bounded queue.
	type batch struct{ ds []reencode.Decision }
	queue := make(chan batch, writers)
	var writeErr error
	var werrOnce sync.Once
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	snapshotTaken := opts.Snapshot == ""
	var snapMu sync.Mutex
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range queue {
				if err := writeBatch(writeCtx, env, w, journal, guard, b.ds, t, opts, &snapMu, &snapshotTaken); err != nil {
					werrOnce.Do(func() { writeErr = err; cancel() })
				}
			}
		}()
	}

	stats, scanErr := env.Run(runCtx, 0, pipeline.Decide, func(page []reencode.Decision) error {
		var stale []reencode.Decision
		t.mu.Lock()
		for _, d := range page {
			t.total.Scanned++
			t.total.BytesOld += int64(d.OldSize)
			if d.Status == reencode.NotObject {
				t.total.Skipped++
				continue
			}
			if d.Status == reencode.Orphaned {
				t.total.Orphaned++
				t.total.Skipped++
				continue
			}
			r := t.res(d.Resource)
			r.Scanned++
			r.BytesOld += int64(d.OldSize)
			switch d.Status {
			case reencode.Current:
				t.total.Current++
				r.Current++
			case reencode.Unreadable:
				t.total.Unreadable++
				t.total.Skipped++
				r.Unreadable++
				r.Skipped++
				r.Reasons[string(d.Err.Reason)]++
				t.fail(Failure{Key: d.Key, Status: string(d.Status), Reason: string(d.Err.Reason), Error: d.Err.Error()})
			case reencode.Stale:
				t.total.Stale++
				r.Stale++
				for _, reason := range d.Reasons {
					r.Reasons[string(reason)]++
				}
				if opts.DryRun {
					t.sizes.Add(d)
					t.total.BytesNew += int64(len(d.NewValue))
					r.BytesNew += int64(len(d.NewValue))
					t.fieldLoss.Add(&d)
				} else {
					stale = append(stale, d)
				}
			}
			if env.Resolver.IsCustom(d.Resource) && d.Status != reencode.Current {
				t.crdPending[d.Resource]++
			}
		}
		counts := t.total
		t.mu.Unlock()
		if opts.FailFast && counts.Unreadable > 0 {
			return errFailFast
		}
		for len(stale) > 0 {
			n := min(batchOps, len(stale))
			select {
			case queue <- batch{ds: stale[:n:n]}:
			case <-runCtx.Done():
				return runCtx.Err()
			}
			stale = stale[n:]
		}
		if opts.Progress != nil {
			opts.Progress(counts)
		}
		return nil
	})
	close(queue)
	wg.Wait()
	if guard != nil {
		guard.Finish(writeCtx)
	}
	sum.Revision, sum.Consistent, sum.Restarts = stats.Revision, stats.Consistent, stats.Restarts
	sum.Writer = w.Stats()

	var err error
	var spaceErr *undo.SpaceError
	if errors.As(writeErr, &spaceErr) {
		spaceErr.Journal = opts.Journal
	}
	switch {
	case writeErr != nil:
		err = writeErr
	case errors.Is(scanErr, errFailFast):
		err = input.Errorf("%s: stopped at the first unreadable object", input.FailFast)
	case scanErr != nil && ctx.Err() != nil:
		sum.Interrupted = true
		err = fmt.Errorf("interrupted: in-flight writes finished; run again to resume (current objects are skipped)")
	case scanErr != nil:
		err = scanErr
	}
	// Under --encryption-only no object moves to the storage version: the
	// decisions say nothing about CRDs' storedVersions.
	keepStored := opts.KeepStoredVersions || env.Planner.EncryptionOnly
	if err == nil && !opts.DryRun && !keepStored {
		// The scan decided every object of the resources in scope at one
		// revision, unless it restarted after a compaction or read one
		// namespace: then the re-check decodes every object.
		decidedAt := sum.Revision
		if !sum.Consistent || env.Config.Namespace != "" {
			decidedAt = 0
		}
		sum.CRDs, err = TrimStoredVersions(writeCtx, env, t.crdPending, decidedAt, &t.crWrites, w, journal)
	} else if err == nil && !keepStored {
		sum.CRDs = PlanStoredVersions(env, t.crdPending)
	}
	return finish(sum, t, start), err
}

var errFailFast = errors.New("fail fast")

func finish(sum *Summary, t *tally, start time.Time) *Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	sum.Summary = t.total
	sum.Resources = sum.Resources[:0]
	for _, r := range t.resources {
		sum.Resources = append(sum.Resources, *r)
	}
	sort.Slice(sum.Resources, func(i, j int) bool {
		a, b := sum.Resources[i], sum.Resources[j]
		return schema.GroupResource{Group: a.Group, Resource: a.Resource}.String() < schema.GroupResource{Group: b.Group, Resource: b.Resource}.String()
	})
	sum.Failures = t.failures
	sum.FieldLoss = t.fieldLoss.List()
	sum.Causes = append(sum.Causes[:0], t.causes...)
	if sum.DryRun {
		sizes := t.sizes
		sum.WriteSizes = &sizes
	}
	sum.Duration = time.Since(start)
	sum.DurationText = sum.Duration.Round(time.Millisecond).String()
	return sum
}

// writeBatch journals, writes and tallies one batch of stale decisions. It
// writes nothing once the writer met an error no retry fixes, nor when the
// batch would take etcd's database past its quota (guard).
func writeBatch(ctx context.Context, env *pipeline.Env, w undo.Store, j *undo.Journal, guard *undo.SpaceGuard, ds []reencode.Decision, t *tally, opts Options, snapMu *sync.Mutex, snapshotTaken *bool) error {
	if w.Stopped() != nil {
		return nil // the run is stopping; the first error was returned
	}
	snapMu.Lock()
	if !*snapshotTaken {
		if err := etcdscan.Snapshot(ctx, env.Client, opts.Snapshot); err != nil {
			snapMu.Unlock()
			return fmt.Errorf("snapshot %s: %w (nothing was written)", opts.Snapshot, err)
		}
		*snapshotTaken = true
	}
	snapMu.Unlock()

	puts := make([]etcdscan.Put, len(ds))
	var cost int64
	for i, d := range ds {
		puts[i] = etcdscan.Put{Key: d.Key, Value: d.NewValue, ModRevision: d.ModRevision, Read: d.Read}
		cost += undo.PutCost(d.Key, d.NewValue)
	}
	if guard != nil {
		if err := guard.Reserve(ctx, cost); err != nil {
			return err
		}
		defer guard.Done(cost)
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
	var stop error
	if key, fe := undo.FirstFatal(results); fe != nil && opts.Output != nil {
		stop = fmt.Errorf("write %s: %w", key, fe)
	} else if fe != nil {
		stop = undo.NewStopError(ctx, fe, key, opts.Journal, "migrate", func(ctx context.Context) ([]string, error) { return etcdscan.Alarms(ctx, env.Client) })
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var firstErr error
	for i, r := range results {
		d := ds[i]
		rs := t.res(d.Resource)
		switch r.Status {
		case etcdscan.Written:
			t.total.Rewritten++
			rs.Rewritten++
			t.total.BytesNew += int64(len(d.NewValue))
			rs.BytesNew += int64(len(d.NewValue))
			if env.Resolver.IsCustom(d.Resource) {
				t.crdPending[d.Resource]--
				t.crWrites.Add(r.NewModRevision)
			}
			t.fieldLoss.Add(&d)
		case etcdscan.Conflict:
			// Someone else wrote it since it was read: the writer stored it fresh.
			t.total.Conflicts++
			rs.Conflicts++
		default:
			t.total.Failed++
			rs.Failed++
			t.fail(Failure{Key: d.Key, Status: "failed", Reason: undo.WriteCause(r.Err), Error: r.Err.Error()})
			if opts.FailFast && firstErr == nil {
				firstErr = input.Errorf("%s: write %s: %v", input.FailFast, d.Key, r.Err)
			}
		}
	}
	if stop != nil {
		return stop
	}
	return firstErr
}
