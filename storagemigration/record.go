package storagemigration

import (
	"context"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	svmapi "k8s.io/kubernetes/pkg/apis/storagemigration"
	svmregistry "k8s.io/kubernetes/pkg/registry/storagemigration/storagemigration"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
)

// ManagedByLabel marks the requests the tool writes as records
// (app.kubernetes.io/managed-by=kube-etcd-migrate).
const ManagedByLabel = "app.kubernetes.io/managed-by"

// RecordName names the record of a migration of gr started at started:
// kube-etcd-migrate-20060102-150405-<resource>[.<group>] (UTC).
func RecordName(started time.Time, gr schema.GroupResource) string {
	return Manager + "-" + started.UTC().Format("20060102-150405") + "-" + gr.String()
}

// Recorded is one record the tool wrote (or could not).
type Recorded struct {
	Name     string `json:"name"`
	Group    string `json:"group"`
	Resource string `json:"resource"`
	// Result: "Succeeded" or "Failed" (the record written, in that state),
	// "exists" (a request of that name is already there: nothing written),
	// "skipped" (not a resource the cluster's API serves: no request can
	// name it).
	Result  string `json:"result"`
	Message string `json:"message,omitempty"`
}

// Record writes, for each resource sum says the migration rewrote, a
// StorageVersionMigration in the state kube-controller-manager leaves a
// finished one in (Running completed, Succeeded, or Failed when objects of
// the resource were left unreadable or unwritten), with the scan revision as
// status.resourceVersion, created through kube-apiserver's create and
// status-update paths. It refuses, writing nothing, when the target
// kube-apiserver does not serve the API. started is when the migration
// started (it is in the names).
func Record(ctx context.Context, env *pipeline.Env, sum *migrate.Summary, started time.Time, o migrate.Options, now func() time.Time) ([]Recorded, error) {
	served, why, err := Serving(env)
	if err != nil {
		return nil, err
	}
	if !served {
		return nil, fmt.Errorf("%s: no record was written", why)
	}
	prefix, err := env.Resolver.KeyPrefix(GroupResource, "")
	if err != nil {
		return nil, err
	}
	o.Snapshot = "" // the migration took it
	wr, err := newWriter(env, o, now)
	if err != nil {
		return nil, err
	}
	out := []Recorded{}
	for _, r := range sum.Resources {
		if r.Rewritten == 0 {
			continue
		}
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		rec := Recorded{Name: RecordName(started, gr), Group: gr.Group, Resource: gr.Resource}
		t, err := resolve(env, gr)
		if err != nil {
			return out, err
		}
		if t.kind != builtin && t.kind != custom {
			rec.Result, rec.Message = "skipped", t.note
			out = append(out, rec)
			continue
		}
		message := ""
		switch {
		case r.Unreadable > 0:
			message = wr.ctrl.objectsFailedMessage(r.Unreadable+r.Failed, objects(r.Counts), fmt.Sprintf("%d object(s) could not be read and were left untouched", r.Unreadable))
		case r.Failed > 0:
			message = wr.ctrl.objectsFailedMessage(r.Failed, objects(r.Counts), fmt.Sprintf("%d write(s) failed", r.Failed))
		}
		if err := wr.record(ctx, prefix+rec.Name, &rec, gr, sum.Revision, message); err != nil {
			return out, fmt.Errorf("record %s: %w", rec.Name, err)
		}
		out = append(out, rec)
	}
	// Every write, up to the last, is judged (with o.Watch, the run's).
	return out, wr.settle()
}

// record creates one finished request, as a client would create it and
// then the controller complete its status.
func (wr *writer) record(ctx context.Context, key string, rec *Recorded, gr schema.GroupResource, revision int64, failure string) error {
	created, err := wr.create(ctx, &svmapi.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{Name: rec.Name, Labels: map[string]string{ManagedByLabel: Manager}},
		Spec:       svmapi.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: gr.Group, Resource: gr.Resource}},
	})
	if err != nil {
		return err
	}
	// The created object as it would come back from storage, with a
	// resourceVersion (which the status update must carry and the write
	// clears).
	if err := versioner.UpdateObject(created, 1); err != nil {
		return err
	}
	upd := created.DeepCopy()
	now := metav1.NewTime(wr.now())
	setCondition(upd, svmapi.MigrationRunning, reasonRunning, messageRunning, now)
	upd.Status.ResourceVersion = strconv.FormatInt(revision, 10)
	rec.Result = ResultSucceeded
	if failure == "" {
		setCondition(upd, svmapi.MigrationSucceeded, reasonSucceeded, wr.ctrl.succeededMessage(), now)
	} else {
		rec.Result, rec.Message = ResultFailed, failure
		setCondition(upd, svmapi.MigrationFailed, reasonFailed, failure, now)
	}
	completeRunning(upd, now)
	written, err := wr.updateStatus(ctx, kind, svmregistry.StatusStrategy, created, upd)
	if err != nil {
		return err
	}
	pr, err := wr.put(ctx, GroupResource, key, written, nil, 0)
	if err != nil {
		return err
	}
	if pr.Status == etcdscan.Conflict {
		rec.Result, rec.Message = "exists", "a StorageVersionMigration of that name exists already: nothing written"
	}
	return nil
}
