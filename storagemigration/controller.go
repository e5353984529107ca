package storagemigration

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/pipeline"
)

// controller is what the target release's kube-controller-manager
// (pkg/controller/storageversionmigrator of that release) writes on the
// requests it finishes, where releases differ. 1.36 reads and writes them
// through storagemigration.k8s.io/v1beta1; 1.37, where the API is GA,
// through storagemigration.k8s.io/v1 (kube-apiserver 1.37 still stores them
// as v1beta1: its storage factory keeps that version for one release, which
// the target's storage configuration says), and says more: its Succeeded
// condition reads "Migration completed", and a request failed on an object
// counts what was not migrated.
type controller struct {
	// minor is the release's minor version (36, 37).
	minor int
}

// controllerOf is the controller of the release the tool writes for (the
// kube-apiserver's, kube-controller-manager runs the same): the release
// pipeline.Setup settled (--target-version, the manifest's image tag,
// kubeadm's ClusterConfiguration), else the release the tool links. The
// controller's code is its binary's: --emulated-version does not change it.
func controllerOf(env *pipeline.Env) (controller, error) {
	rel := env.Target.Release()
	v := rel.Version()
	if v.Major() != 1 {
		return controller{}, fmt.Errorf("storage version migration: release %q: want 1.MINOR", rel)
	}
	return controller{minor: int(v.Minor())}, nil
}

// writable says whether the tool can write what this release's controller
// writes. It reproduces the controllers of 1.36 and 1.37 only: 1.35's sets a
// Running condition before it migrates (1.36's does not), and 1.34's reads
// and writes storagemigration.k8s.io/v1alpha1.
func (c controller) writable() error {
	if c.minor < 36 {
		return input.Errorf("StorageVersionMigration requests for a 1.%d target: the tool writes what the storage version migrator of kube-controller-manager 1.36 and 1.37 writes, and 1.%d's writes other conditions (or another API version); migrate without %s and %s, and let that release's kube-controller-manager carry out the requests", c.minor, c.minor, input.Requested, input.Record)
	}
	return nil
}

// Writable says whether the tool can carry out requests and write records
// for the release env targets (see controller.writable); nil when it can.
func Writable(env *pipeline.Env) error {
	ctrl, err := controllerOf(env)
	if err != nil {
		return err
	}
	return ctrl.writable()
}

// apiVersion is the version of storagemigration.k8s.io the controller uses.
func (c controller) apiVersion() string {
	if c.minor >= 37 {
		return "v1"
	}
	return "v1beta1"
}

// succeededMessage is the message of the Succeeded condition.
func (c controller) succeededMessage() string {
	if c.minor >= 37 {
		return messageCompleted // runMigration: "Migration completed"
	}
	return "" // sync: setStatusConditions(..., migrationSuccessStatusReason, "")
}

// objectsFailedMessage is the Failed condition's message when objects of
// the resource could not be migrated (notMigrated of total): 1.37's
// failMigrationWithObjectsMigrated, 1.36's failMigration.
func (c controller) objectsFailedMessage(notMigrated, total int64, err string) string {
	if c.minor >= 37 {
		return fmt.Sprintf("%d/%d not yet migrated. "+messageUnhandledFn, notMigrated, total, err)
	}
	return fmt.Sprintf(messageUnhandledFn, err)
}

// requestContext is the context kube-apiserver's handler gives a request to
// gk's endpoint (subresource "" or "status") at version: the RequestInfo
// its declarative validation (1.37) takes the API version and subresource
// from.
func requestContext(ctx context.Context, gvk schema.GroupVersionKind, subresource, verb, name string) context.Context {
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	ctx = genericapirequest.WithNamespace(ctx, "")
	return genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true,
		Verb:              verb,
		APIPrefix:         "apis",
		APIGroup:          gvk.Group,
		APIVersion:        gvk.Version,
		Resource:          plural.Resource,
		Subresource:       subresource,
		Name:              name,
	})
}
