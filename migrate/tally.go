package migrate

import (
	"errors"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/reencode"
)

// maxFailuresListed bounds the failure list kept in memory and in the report.
const maxFailuresListed = 1000

// tally is a run's running account, shared by the scan (page) and the
// writers (written): what was scanned, found and written, overall and per
// resource, the failures by cause, the custom resources not yet in their
// storage version, the fields the rewrites drop and, for a dry run, what the
// rewrite would take. Its methods lock it; Summary is its end.
type tally struct {
	mu sync.Mutex
	// dryRun: stale objects are counted as if written (their new sizes,
	// their field losses), never handed to the writers.
	dryRun bool
	// isCustom says whether a resource is a custom resource (whose pending
	// objects and writes the storedVersions trim reads).
	isCustom  func(schema.GroupResource) bool
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
	sizes guard.WriteSizes
}

func newTally(dryRun bool, isCustom func(schema.GroupResource) bool) *tally {
	return &tally{
		dryRun:     dryRun,
		isCustom:   isCustom,
		resources:  map[schema.GroupResource]*ResourceSummary{},
		crdPending: map[schema.GroupResource]int64{},
	}
}

// page counts a page of the scan's decisions and returns the stale ones to
// write (none in a dry run) and the running totals.
func (t *tally) page(page []reencode.Decision) (stale []reencode.Decision, counts Counts) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.dryRun {
		n := 0
		for i := range page {
			if page[i].Status == reencode.Stale {
				n++
			}
		}
		if n > 0 {
			stale = make([]reencode.Decision, 0, n)
		}
	}
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
			if t.dryRun {
				t.sizes.Add(d)
				t.total.BytesNew += int64(len(d.NewValue))
				r.BytesNew += int64(len(d.NewValue))
				t.fieldLoss.Add(&d)
			} else {
				stale = append(stale, d)
			}
		}
		if t.isCustom(d.Resource) && d.Status != reencode.Current {
			t.crdPending[d.Resource]++
		}
	}
	return stale, t.total
}

// counts is the run's figures so far.
func (t *tally) counts() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// written counts the results of writing the decisions ds. With failFast,
// the first failed write is returned as the error that stops the run.
func (t *tally) written(ds []reencode.Decision, results []etcdscan.PutResult, failFast bool) error {
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
			if t.isCustom(d.Resource) {
				t.crdPending[d.Resource]--
				t.crWrites.Add(r.NewModRevision)
			}
			t.fieldLoss.Add(&d)
		case etcdscan.Conflict:
			// Someone else wrote it since it was read: the writer stored it fresh.
			t.total.Conflicts++
			rs.Conflicts++
		case etcdscan.Failed:
			if errors.As(r.Err, new(*liveness.WriterError)) {
				continue // not sent: another writer stopped the run (its error says so)
			}
			fallthrough
		default:
			t.total.Failed++
			rs.Failed++
			t.fail(Failure{Key: d.Key, Status: "failed", Reason: guard.WriteCause(r.Err), Error: r.Err.Error()})
			if failFast && firstErr == nil {
				firstErr = input.Errorf("%s: write %s: %v", input.FailFast, d.Key, r.Err)
			}
		}
	}
	return firstErr
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

// summary fills sum with the tally, the run having started at start.
func (t *tally) summary(sum *Summary, start time.Time) *Summary {
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
