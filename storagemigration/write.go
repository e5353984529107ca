package storagemigration

import (
	"context"
	"fmt"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdregistry "k8s.io/apiextensions-apiserver/pkg/registry/customresourcedefinition"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/rest"
	apiserverstorage "k8s.io/apiserver/pkg/storage"
	svmapi "k8s.io/kubernetes/pkg/apis/storagemigration"
	svmregistry "k8s.io/kubernetes/pkg/registry/storagemigration/storagemigration"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/updatepath"
)

// Manager is the field manager the tool's writes are recorded under in
// managedFields, as a client's writes through kube-apiserver would be.
const Manager = updatepath.Manager

// What kube-controller-manager 1.36 writes (pkg/controller/storageversionmigrator:
// storageversionmigrator.go, resourceversion.go, migrationrunner.go, which keep
// these strings unexported). Condition types come from the API packages.
const (
	reasonRunning      = "MigrationRunning"
	messageRunning     = "The migration is running"
	reasonCompleted    = "MigrationCompleted"
	messageCompleted   = "Migration completed"
	reasonSucceeded    = "StorageVersionMigrationSucceeded"
	reasonFailed       = "StorageVersionMigrationFailed"
	messageNoResource  = "resource does not exist in discovery"
	messageUnhandledFn = "migration encountered unhandled error: %s"

	crdReasonRunning      = "MigrationRunning"
	crdMessageRunningFn   = "Migration %s is running"
	crdReasonSucceeded    = "MigrationSucceeded"
	crdMessageSucceeded   = "The migration has succeeded"
	crdMessageUpdated     = " and the stored versions have been updated"
	crdMessageNotUpdated  = " but the stored versions have not been updated due to a generation mismatch"
	crdReasonFailed       = "MigrationFailed"
	crdMessageFailed      = "The migration has failed"
	crdConditionMigrating = apiextensions.CustomResourceDefinitionConditionType(apiextensionsv1.StorageMigrating)
)

var (
	crdKind = apiextensions.Kind("CustomResourceDefinition")
	// crdStatusStrategy is the apiextensions-apiserver's /status strategy.
	crdStatusStrategy = crdregistry.NewStatusStrategy(decode.ExtensionsScheme)
)

// versioner is kube-apiserver's etcd3 storage versioner: resourceVersion
// from the mod revision on read, cleared on write.
var versioner = apiserverstorage.APIObjectVersioner{}

// strategy is what the tool needs of a registry strategy: preparation and
// validation of a status update, and the fields its endpoint resets.
type strategy interface {
	rest.RESTUpdateStrategy
	rest.ResetFieldsStrategy
}

// writer does the tool's writes of requests and CRDs.
type writer struct {
	env  *pipeline.Env
	path *updatepath.Path
	ctrl controller
	w    *etcdscan.Writer
	// ctx is for writes: it outlives a SIGINT so a write in flight finishes.
	ctx     context.Context
	journal string
	now     func() time.Time

	// first is the run's first write: the liveness window's verdict and the
	// snapshot (when asked for) before it.
	first *guard.FirstWrite
	watch *guard.Watch
	// preflight, when set, gets the window's line.
	preflight *[]string
}

func newWriter(env *pipeline.Env, o migrate.Options, now func() time.Time) (*writer, error) {
	path, err := updatePath(env)
	if err != nil {
		return nil, err
	}
	ctrl, err := controllerOf(env)
	if err != nil {
		return nil, err
	}
	if err := ctrl.writable(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	ctx := o.WriteContext
	if ctx == nil {
		ctx = context.Background()
	}
	wr := &writer{
		env: env, path: path, ctrl: ctrl, ctx: ctx, now: now, journal: o.Journal, watch: o.Watch,
		w: &etcdscan.Writer{Client: env.Client, MaxOps: o.BatchOps, MaxBytes: o.BatchBytes, Observer: o.Watch.Observer()},
	}
	wr.first = &guard.FirstWrite{Watch: o.Watch, Client: env.Client, Snapshot: o.Snapshot, Lock: o.Lock, Then: func(line string) error {
		if line != "" && wr.preflight != nil {
			*wr.preflight = append(*wr.preflight, line)
		}
		return nil
	}}
	return wr, nil
}

// settle says, once the writes are over, whether anything but the run
// wrote under the prefix meanwhile (nil when the run wrote nothing).
func (wr *writer) settle() error {
	if !wr.first.Opened() {
		return nil
	}
	return wr.watch.Settle(wr.ctx)
}

// stored is one key as read now.
type stored struct {
	key         string
	value       []byte
	modRevision int64
	// revision is etcd's revision when it was read.
	revision int64
	obj      runtime.Object
}

// get reads and decodes a key; nil when it does not exist.
func (wr *writer) get(ctx context.Context, key string) (*stored, error) {
	rctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultCommandTimeout)
	defer cancel()
	resp, err := wr.env.Client.Get(rctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	kv := resp.Kvs[0]
	obj, err := wr.env.Decoder.Decode(ctx, etcdscan.KV{Key: key, Value: kv.Value, ModRevision: kv.ModRevision, Lease: kv.Lease})
	if err != nil {
		return nil, err
	}
	// As kube-apiserver's storage layer reads it: the mod revision is the
	// object's resourceVersion, which an update must carry.
	if err := versioner.UpdateObject(obj.Internal, uint64(kv.ModRevision)); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return &stored{key: key, value: kv.Value, modRevision: kv.ModRevision, revision: resp.Header.Revision, obj: obj.Internal}, nil
}

// updateStatus runs kube-apiserver's update path of a /status endpoint on
// upd, a changed copy of old: the endpoint's field manager records the
// change under Manager, then rest.BeforeUpdate runs the status strategy
// (spec and metadata kept from old) and its validation.
func (wr *writer) updateStatus(ctx context.Context, gk schema.GroupKind, s strategy, old, upd runtime.Object) (runtime.Object, error) {
	fm, err := wr.path.FieldManager(gk, "status", s)
	if err != nil {
		return nil, err
	}
	if fm != nil {
		upd = fm.UpdateNoErrors(old, upd, Manager)
	}
	name := ""
	if a, err := meta.Accessor(old); err == nil {
		name = a.GetName()
	}
	if err := rest.BeforeUpdate(s, requestContext(ctx, wr.gvk(gk), "status", "update", name), upd, old); err != nil {
		return nil, fmt.Errorf("kube-apiserver would refuse the status update: %w", err)
	}
	return upd, nil
}

// gvk is the version of gk a request is made at: the one the target
// kube-apiserver serves to clients (StorageVersionMigrations: the one its
// controller uses).
func (wr *writer) gvk(gk schema.GroupKind) schema.GroupVersionKind {
	if gvk, served, err := wr.path.ServedVersion(gk); err == nil && served {
		return gvk
	}
	if gk == kind {
		return gk.WithVersion(wr.ctrl.apiVersion())
	}
	return gk.WithVersion("v1")
}

// create runs kube-apiserver's create path on obj, a new request: the
// endpoint's field manager records it under Manager, then the registry
// store's system fields (uid, creationTimestamp) and rest.BeforeCreate with
// the strategy (status cleared, validation).
func (wr *writer) create(ctx context.Context, obj *svmapi.StorageVersionMigration) (*svmapi.StorageVersionMigration, error) {
	fm, err := wr.path.FieldManager(kind, "", svmregistry.Strategy)
	if err != nil {
		return nil, err
	}
	var out runtime.Object = obj
	if fm != nil {
		out = fm.UpdateNoErrors(&svmapi.StorageVersionMigration{}, obj, Manager)
	}
	created, ok := out.(*svmapi.StorageVersionMigration)
	if !ok {
		return nil, fmt.Errorf("field manager returned %T", out)
	}
	rest.FillObjectMetaSystemFields(created)
	if err := rest.BeforeCreate(svmregistry.Strategy, requestContext(ctx, wr.gvk(kind), "", "create", ""), created); err != nil {
		return nil, fmt.Errorf("kube-apiserver would refuse to create it: %w", err)
	}
	return created, nil
}

// put encodes obj as the target kube-apiserver stores gr and writes it at
// key if the key still has modRevision (0: only if it does not exist),
// journaling the old value of an existing key first. The first write waits
// for the liveness window's verdict and the etcd snapshot, when asked for;
// none is sent once another writer was seen.
func (wr *writer) put(ctx context.Context, gr schema.GroupResource, key string, obj runtime.Object, old []byte, modRevision int64) (etcdscan.PutResult, error) {
	// As kube-apiserver's storage layer writes it: no resourceVersion.
	if err := versioner.PrepareObjectForStorage(obj); err != nil {
		return etcdscan.PutResult{}, fmt.Errorf("%s: %w", key, err)
	}
	value, err := wr.env.Planner.Encode(ctx, gr, key, obj)
	if err != nil {
		return etcdscan.PutResult{}, err
	}
	if err := wr.first.Open(ctx); err != nil {
		return etcdscan.PutResult{}, err
	}
	if err := wr.watch.Stopped(); err != nil {
		return etcdscan.PutResult{}, err // another writer: nothing more is sent
	}
	p := etcdscan.Put{Key: key, Value: value, ModRevision: modRevision}
	var j *undo.Journal
	// A creation is not journaled: a rollback would put back an empty value.
	if wr.journal != "" && modRevision != 0 {
		j, err = undo.OpenJournal(wr.journal)
		if err != nil {
			return etcdscan.PutResult{}, err
		}
		if err := j.Intents([]etcdscan.Put{p}, [][]byte{old}); err != nil {
			j.Close()
			return etcdscan.PutResult{}, fmt.Errorf("%w (nothing was written)", err)
		}
	}
	res := wr.w.Write(wr.ctx, []etcdscan.Put{p})[0]
	if j != nil {
		err := j.Done([]etcdscan.PutResult{res})
		if cerr := j.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("journal: %w", cerr)
		}
		if err != nil {
			return res, err
		}
	}
	if res.Status == etcdscan.Failed {
		return res, res.Err
	}
	return res, nil
}

// setCondition is the controller's setStatusConditions (util.go): a True
// condition of the type is appended unless one that is True or False is
// already there.
func setCondition(svm *svmapi.StorageVersionMigration, t svmapi.MigrationConditionType, reason, message string, now metav1.Time) {
	c := svm.Status.Conditions
	if meta.IsStatusConditionTrue(c, string(t)) || meta.IsStatusConditionFalse(c, string(t)) {
		return
	}
	svm.Status.Conditions = append(c, metav1.Condition{
		Type:               string(t),
		Status:             metav1.ConditionTrue,
		LastTransitionTime: now,
		Reason:             reason,
		Message:            message,
	})
}

// completeRunning is the runner's cleanupAdmission on the request: a true
// Running condition turns False once the request is Succeeded or Failed.
func completeRunning(svm *svmapi.StorageVersionMigration, now metav1.Time) {
	c := meta.FindStatusCondition(svm.Status.Conditions, string(svmapi.MigrationRunning))
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	meta.SetStatusCondition(&svm.Status.Conditions, metav1.Condition{
		Type:               string(svmapi.MigrationRunning),
		Status:             metav1.ConditionFalse,
		LastTransitionTime: now,
		Reason:             reasonCompleted,
		Message:            messageCompleted,
		ObservedGeneration: svm.Generation,
	})
}

// setCRDCondition sets the StorageMigrating condition as the controller's
// server-side apply of it does: every field given, so the entry of that
// type is replaced (or appended).
func setCRDCondition(crd *apiextensions.CustomResourceDefinition, c apiextensions.CustomResourceDefinitionCondition) {
	for i := range crd.Status.Conditions {
		if crd.Status.Conditions[i].Type == c.Type {
			crd.Status.Conditions[i] = c
			return
		}
	}
	crd.Status.Conditions = append(crd.Status.Conditions, c)
}
