package storagemigration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	svmapi "k8s.io/kubernetes/pkg/apis/storagemigration"
	svmregistry "k8s.io/kubernetes/pkg/registry/storagemigration/storagemigration"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
)

// Options control a run of the pending requests.
type Options struct {
	// Migrate are the options of each resource's migration: dry run,
	// journal (which also gets the old values of the requests and CRDs the
	// tool updates), snapshot (taken once, before the first write of the
	// run), live-apiserver check, batches, writers, write context.
	Migrate migrate.Options
	// Now is the clock of conditions and records (tests); nil = time.Now.
	Now func() time.Time
}

// Results of a request.
const (
	// ResultSucceeded and ResultFailed: the request now says so.
	ResultSucceeded = "Succeeded"
	ResultFailed    = "Failed"
	// ResultWouldSucceed and ResultWouldFail: a dry run's verdict.
	ResultWouldSucceed = "would-succeed"
	ResultWouldFail    = "would-fail"
	// ResultConflict: the request changed or went away while the tool
	// worked on it: someone else handled it. The tool did not retry.
	ResultConflict = "conflict"
	// ResultFinished: it was found finished when read again before starting.
	ResultFinished = "finished"
	// ResultLeftRunning: the migration did not finish (failed writes, an
	// interruption); the request stays Running for a later run of the tool,
	// or kube-controller-manager, to finish.
	ResultLeftRunning = "left-running"
	// ResultSkipped: not something the tool can carry out; left as it was.
	ResultSkipped = "skipped"
)

// Outcome is what became of one request.
type Outcome struct {
	Name     string `json:"name"`
	Group    string `json:"group"`
	Resource string `json:"resource"`
	Result   string `json:"result"`
	// Message is the Failed condition's message, or why the request was
	// skipped, left running or found changed.
	Message string `json:"message,omitempty"`
	// ResourceVersion is the request's status.resourceVersion.
	ResourceVersion string           `json:"statusResourceVersion,omitempty"`
	CRD             *CRDOutcome      `json:"crd,omitempty"`
	Migration       *migrate.Summary `json:"migration,omitempty"`
}

// CRDOutcome is the CRD's StorageMigrating condition and storedVersions as
// the run left them.
type CRDOutcome struct {
	Name           string   `json:"name"`
	StoredVersions []string `json:"storedVersions"`
	Reason         string   `json:"reason,omitempty"`
	Message        string   `json:"message,omitempty"`
}

// Result is a run of the pending requests.
type Result struct {
	DryRun     bool      `json:"dryRun"`
	Preflight  []string  `json:"preflight,omitempty"`
	Requests   []Outcome `json:"requests"`
	Finished   int       `json:"finished"`
	Unreadable []string  `json:"unreadable,omitempty"`
}

// RunRequested carries out the pending requests one after another, in the
// controller's order, each on its own resource only, and records each
// outcome in the request. Nothing is written when the target kube-apiserver
// does not serve the API or the preflight refuses. The result is complete
// as far as the run went when err is set.
func RunRequested(ctx context.Context, env *pipeline.Env, opts Options) (*Result, error) {
	res := &Result{DryRun: opts.Migrate.DryRun, Requests: []Outcome{}}
	if env.Filter != nil {
		return res, input.Errorf("the requests name their resources: %s and %s do not apply", input.Resource, input.Namespace)
	}
	if env.Config.Revision != 0 {
		return res, input.Errorf("requests are carried out at the current revision: %s %d is for the read-only commands", input.Revision, env.Config.Revision)
	}
	served, why, err := Serving(env)
	if err != nil {
		return res, err
	}
	if !served {
		return res, fmt.Errorf("%s; kube-controller-manager would not act on requests either (nothing was written)", why)
	}
	reqs, err := List(ctx, env)
	if err != nil {
		return res, err
	}
	res.Finished, res.Unreadable = reqs.Finished(), reqs.Unreadable
	pending := reqs.Pending()
	if len(pending) == 0 {
		return res, nil
	}
	if !opts.Migrate.DryRun {
		if opts.Migrate.Watch == nil {
			// One watch for every request: its window runs while the
			// checks go on, the first write waits for it.
			w, err := guard.StartWatch(ctx, env.Client, env.Resolver.Prefix(), opts.Migrate.PreflightOptions)
			if err != nil {
				return res, err
			}
			defer w.Close()
			opts.Migrate.Watch = w
		}
		res.Preflight, _, err = guard.Preflight(ctx, env, opts.Migrate.PreflightOptions)
		if err != nil {
			return res, err
		}
	}
	wr, err := newWriter(env, opts.Migrate, opts.Now)
	if err != nil {
		return res, err
	}
	wr.preflight = &res.Preflight
	for _, r := range pending {
		out, err := wr.run(ctx, r, opts)
		res.Requests = append(res.Requests, out)
		if err != nil {
			return res, fmt.Errorf("request %s (%s): %w", r.Name, r.GroupResource(), err)
		}
	}
	// Every write, up to the last, is judged.
	return res, wr.settle()
}

// run carries out one request as the controller would: mark it Running
// (and the CRD StorageMigrating) with the revision it covers, migrate the
// resource, then record Succeeded or Failed, finish the CRD and complete
// Running. Each write is a compare-and-swap; a conflict ends the request's
// turn.
func (wr *writer) run(ctx context.Context, r Request, opts Options) (Outcome, error) {
	out := Outcome{Name: r.Name, Group: r.Group, Resource: r.Resource, ResourceVersion: r.ResourceVersion}
	cur, err := wr.get(ctx, r.Key)
	if err != nil {
		return out, err
	}
	if cur == nil {
		out.Result, out.Message = ResultConflict, "deleted since it was read"
		return out, nil
	}
	svm, ok := cur.obj.(*svmapi.StorageVersionMigration)
	if !ok {
		return out, fmt.Errorf("%s: holds %T, not a StorageVersionMigration", r.Key, cur.obj)
	}
	if cur.modRevision != r.modRevision {
		r = newRequest(r.Key, cur.modRevision, svm)
		if r.Finished() {
			out.Result, out.Message = ResultFinished, fmt.Sprintf("found %s when read again: finished by someone else", r.Phase)
			return out, nil
		}
	}
	gr := r.GroupResource()
	t, err := resolve(wr.env, gr)
	if err != nil {
		return out, err
	}
	dry := opts.Migrate.DryRun
	switch t.kind {
	case unsupported:
		out.Result, out.Message = ResultSkipped, t.note
		return out, nil
	case missing:
		// The resource-version controller fails it (after a minute of
		// grace for discovery to catch up, which etcd does not need).
		out.Message = messageNoResource
		if dry {
			out.Result = ResultWouldFail
			return out, nil
		}
		upd := svm.DeepCopy()
		now := metav1.NewTime(wr.now())
		setCondition(upd, svmapi.MigrationRunning, reasonRunning, messageRunning, now)
		setCondition(upd, svmapi.MigrationFailed, reasonFailed, messageNoResource, now)
		completeRunning(upd, now)
		return wr.finish(ctx, out, cur, svm, upd, ResultFailed)
	}

	narrow, err := wr.env.Narrow(t.scan)
	if err != nil {
		return out, err
	}
	mopts := opts.Migrate
	mopts.Snapshot = "" // taken by the writer before the run's first write
	mopts.KeepStoredVersions = true
	if dry {
		sum, err := migrate.Run(ctx, narrow, mopts)
		out.Migration = sum
		if err != nil {
			return out, err
		}
		out.Result = ResultWouldSucceed
		if msg := unreadableMessage(sum); msg != "" {
			out.Result, out.Message = ResultWouldFail, wr.ctrl.objectsFailedMessage(sum.Summary.Unreadable, objects(sum.Summary), msg)
		}
		if t.crd != nil {
			out.CRD = &CRDOutcome{Name: t.crd.Object.Name, StoredVersions: t.crd.StoredVersions}
			if out.Result == ResultWouldSucceed {
				out.CRD.StoredVersions = []string{t.crd.StorageVersion}
				out.CRD.Message = "storedVersions would be trimmed"
			}
		}
		return out, nil
	}

	// 1. Running, the CRD StorageMigrating, and status.resourceVersion.
	expect := cur.modRevision
	if r.Phase != Running || svm.Status.ResourceVersion == "" {
		if r.Phase != Running && t.crd != nil {
			if err := wr.markCRD(ctx, t.crd, r.Name); err != nil {
				return out, err
			}
		}
		upd := svm.DeepCopy()
		setCondition(upd, svmapi.MigrationRunning, reasonRunning, messageRunning, metav1.NewTime(wr.now()))
		if upd.Status.ResourceVersion == "" {
			upd.Status.ResourceVersion = strconv.FormatInt(cur.revision, 10)
		}
		written, err := wr.updateStatus(ctx, kind, svmregistry.StatusStrategy, svm, upd)
		if err != nil {
			return out, fmt.Errorf("%s: %w", r.Key, err)
		}
		pr, err := wr.put(ctx, GroupResource, r.Key, written, cur.value, cur.modRevision)
		if err != nil {
			return out, err
		}
		if pr.Status == etcdscan.Conflict {
			out.Result, out.Message = ResultConflict, fmt.Sprintf("changed since it was read (%v): someone else is handling it", pr.Err)
			return out, nil
		}
		expect = pr.NewModRevision
		out.ResourceVersion = upd.Status.ResourceVersion
	}

	// 2. The migration of that resource alone.
	sum, err := migrate.Run(ctx, narrow, mopts)
	out.Migration = sum
	if err != nil {
		out.Result, out.Message = ResultLeftRunning, err.Error()
		return out, err
	}
	if sum.Summary.Failed > 0 {
		out.Result = ResultLeftRunning
		out.Message = fmt.Sprintf("%d write(s) failed: the request stays Running; run again to finish it", sum.Summary.Failed)
		return out, nil
	}
	success, message := true, ""
	if msg := unreadableMessage(sum); msg != "" {
		success, message = false, wr.ctrl.objectsFailedMessage(sum.Summary.Unreadable, objects(sum.Summary), msg)
	}

	// 3. The CRD: the tool re-checks its objects before storedVersions may
	// lose a version, then finishes StorageMigrating as the runner does.
	if t.crd != nil {
		if success {
			n, err := migrate.NotInStorageVersion(ctx, narrow, t.crd)
			if err != nil {
				return out, err
			}
			if n > 0 {
				success, message = false, wr.ctrl.objectsFailedMessage(int64(n), objects(sum.Summary), fmt.Sprintf("%d object(s) of %s not stored in %s/%s when re-checked after the migration", n, gr, gr.Group, t.crd.StorageVersion))
			}
		}
		out.CRD, err = wr.finishCRD(ctx, t.crd, success)
		if err != nil {
			return out, err
		}
	}

	// 4. Succeeded or Failed, and Running completed.
	cur, err = wr.get(ctx, r.Key)
	if err != nil {
		return out, err
	}
	if cur == nil || cur.modRevision != expect {
		out.Result, out.Message = ResultConflict, "changed while the tool migrated its resource: someone else handled it; its status was left as they wrote it"
		return out, nil
	}
	if svm, ok = cur.obj.(*svmapi.StorageVersionMigration); !ok {
		return out, fmt.Errorf("%s: holds %T, not a StorageVersionMigration", r.Key, cur.obj)
	}
	upd := svm.DeepCopy()
	now := metav1.NewTime(wr.now())
	result := ResultSucceeded
	if success {
		setCondition(upd, svmapi.MigrationSucceeded, reasonSucceeded, wr.ctrl.succeededMessage(), now)
	} else {
		result = ResultFailed
		setCondition(upd, svmapi.MigrationFailed, reasonFailed, message, now)
		out.Message = message
	}
	completeRunning(upd, now)
	return wr.finish(ctx, out, cur, svm, upd, result)
}

// finish writes a request's final status.
func (wr *writer) finish(ctx context.Context, out Outcome, cur *stored, old, upd *svmapi.StorageVersionMigration, result string) (Outcome, error) {
	written, err := wr.updateStatus(ctx, kind, svmregistry.StatusStrategy, old, upd)
	if err != nil {
		return out, fmt.Errorf("%s: %w", cur.key, err)
	}
	pr, err := wr.put(ctx, GroupResource, cur.key, written, cur.value, cur.modRevision)
	if err != nil {
		return out, err
	}
	if pr.Status == etcdscan.Conflict {
		out.Result, out.Message = ResultConflict, fmt.Sprintf("changed since it was read (%v): someone else handled it", pr.Err)
		return out, nil
	}
	out.Result = result
	out.ResourceVersion = upd.Status.ResourceVersion
	return out, nil
}

// unreadableMessage says which objects a migration could not read ("" when
// none): the controller fails a request on an object it cannot migrate.
// objects are the objects of a run's resource: what the controller counts
// as its total (the objects of its informer's list).
func objects(c migrate.Counts) int64 { return c.Current + c.Stale + c.Unreadable }

func unreadableMessage(sum *migrate.Summary) string {
	n := sum.Summary.Unreadable
	if n == 0 {
		return ""
	}
	msg := fmt.Sprintf("%d object(s) could not be read and were left untouched", n)
	for _, f := range sum.Failures {
		if f.Status == "unreadable" {
			msg += ", first " + f.Error
			break
		}
	}
	return msg
}

// crdConflictRetries is how often a CRD status write is retried after a
// conflict, each time re-read and re-decided: the controller's
// retry.RetryOnConflict(retry.DefaultRetry) makes five attempts.
const crdConflictRetries = 5

// markCRD is the runner's markAsActive on the CRD: StorageMigrating True,
// observing the CRD's generation, which the finish compares.
func (wr *writer) markCRD(ctx context.Context, crd *pipeline.CRD, request string) error {
	_, err := wr.updateCRD(ctx, crd, func(c *apiextensions.CustomResourceDefinition) {
		setCRDCondition(c, apiextensions.CustomResourceDefinitionCondition{
			Type:               crdConditionMigrating,
			Status:             apiextensions.ConditionTrue,
			LastTransitionTime: metav1.NewTime(wr.now()),
			Reason:             crdReasonRunning,
			Message:            fmt.Sprintf(crdMessageRunningFn, request),
			ObservedGeneration: c.Generation,
		})
	})
	return err
}

// finishCRD is the runner's finishCRDMigration: StorageMigrating False with
// the outcome, and on success status.storedVersions trimmed to the storage
// version when the CRD's generation is the one StorageMigrating observed.
func (wr *writer) finishCRD(ctx context.Context, crd *pipeline.CRD, success bool) (*CRDOutcome, error) {
	out := &CRDOutcome{Name: crd.Object.Name}
	c, err := wr.updateCRD(ctx, crd, func(c *apiextensions.CustomResourceDefinition) {
		cond := apiextensions.FindCRDCondition(c, crdConditionMigrating)
		canUpdate := cond != nil && cond.ObservedGeneration == c.Generation
		reason, msg := crdReasonFailed, crdMessageFailed
		if success {
			reason, msg = crdReasonSucceeded, crdMessageSucceeded+crdMessageNotUpdated
			if canUpdate {
				msg = crdMessageSucceeded + crdMessageUpdated
			}
		}
		setCRDCondition(c, apiextensions.CustomResourceDefinitionCondition{
			Type:               crdConditionMigrating,
			Status:             apiextensions.ConditionFalse,
			LastTransitionTime: metav1.NewTime(wr.now()),
			Reason:             reason,
			Message:            msg,
			ObservedGeneration: c.Generation,
		})
		if success && canUpdate {
			for _, v := range c.Spec.Versions {
				if v.Storage {
					c.Status.StoredVersions = []string{v.Name}
					break
				}
			}
		}
		out.Reason, out.Message = reason, msg
	})
	if err != nil {
		return nil, err
	}
	if c != nil {
		out.StoredVersions = slices.Clone(c.Status.StoredVersions)
	}
	return out, nil
}

// updateCRD applies change to the CRD's status through the apiextensions
// /status update path and writes it with compare-and-swap, re-reading and
// re-deciding after a conflict. A CRD deleted meanwhile is left alone (nil).
func (wr *writer) updateCRD(ctx context.Context, crd *pipeline.CRD, change func(*apiextensions.CustomResourceDefinition)) (*apiextensions.CustomResourceDefinition, error) {
	for attempt := 1; ; attempt++ {
		cur, err := wr.get(ctx, crd.Key)
		if err != nil || cur == nil {
			return nil, err
		}
		old, ok := cur.obj.(*apiextensions.CustomResourceDefinition)
		if !ok {
			return nil, fmt.Errorf("%s: holds %T, not a CRD", crd.Key, cur.obj)
		}
		upd := old.DeepCopy()
		change(upd)
		written, err := wr.updateStatus(ctx, crdKind, crdStatusStrategy, old, upd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", crd.Key, err)
		}
		pr, err := wr.put(ctx, decode.CRDGroupResource, crd.Key, written, cur.value, cur.modRevision)
		if err != nil {
			return nil, err
		}
		if pr.Status == etcdscan.Written {
			return upd, nil
		}
		if attempt == crdConflictRetries {
			return nil, errors.New(crd.Key + ": the CRD kept changing; its StorageMigrating condition was not written")
		}
	}
}
