// Package storagemigration speaks the cluster's own storage migration API
// (storagemigration.k8s.io/v1beta1, KEP-4192) offline. It reads the
// StorageVersionMigration requests in etcd like any object, carries out the
// pending ones (each spec.resource mapped to a built-in resource the target
// kube-apiserver serves or to a CRD, and migrated alone by package migrate on
// a narrowed pipeline), and records the outcome in each request as
// kube-controller-manager 1.36's storage version migrator leaves a finished
// one: its Running, Succeeded and Failed conditions with the controller's
// reasons and messages, status.resourceVersion, and for a CRD the
// StorageMigrating condition and status.storedVersions trimmed under the
// controller's generation check. It also writes finished requests recording
// the tool's own migrations. Every write goes through kube-apiserver's own
// create or status-update path (registry strategy, validation, field
// manager), the target storage codec and the encryption configured for the
// resource (reencode.Planner.Encode), and is a compare-and-swap on the key's
// mod revision: a conflict means someone else handled the object, and is
// reported, never retried blindly.
package storagemigration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	svmapi "k8s.io/kubernetes/pkg/apis/storagemigration"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
)

// GroupResource is where the requests are stored.
var GroupResource = svmapi.Resource("storageversionmigrations")

// kind is the requests' kind.
var kind = svmapi.Kind("StorageVersionMigration")

// Phase is where a request stands, read from its conditions as the
// controller reads them.
type Phase string

const (
	// Pending: no Running, Succeeded or Failed condition is true.
	Pending Phase = "Pending"
	// Running: the controller (or this tool) started it and did not finish.
	Running Phase = "Running"
	// Succeeded and Failed are final: the controller never runs it again.
	Succeeded Phase = "Succeeded"
	Failed    Phase = "Failed"
)

// Request is one StorageVersionMigration found in etcd.
type Request struct {
	Name     string    `json:"name"`
	Group    string    `json:"group"`
	Resource string    `json:"resource"`
	Created  time.Time `json:"creationTimestamp"`
	Phase    Phase     `json:"phase"`
	// ResourceVersion is status.resourceVersion: the resource's list
	// revision the migration covers, once started.
	ResourceVersion string `json:"statusResourceVersion,omitempty"`
	Key             string `json:"key"`

	modRevision int64
	obj         *svmapi.StorageVersionMigration
}

// GroupResource is spec.resource.
func (r Request) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}
}

// Finished reports whether the request is Succeeded or Failed.
func (r Request) Finished() bool { return r.Phase == Succeeded || r.Phase == Failed }

func newRequest(key string, modRevision int64, svm *svmapi.StorageVersionMigration) Request {
	return Request{
		Name:            svm.Name,
		Group:           svm.Spec.Resource.Group,
		Resource:        svm.Spec.Resource.Resource,
		Created:         svm.CreationTimestamp.Time,
		Phase:           phase(svm),
		ResourceVersion: svm.Status.ResourceVersion,
		Key:             key,
		modRevision:     modRevision,
		obj:             svm,
	}
}

// phase reads the conditions the way the controller does (isTerminal,
// isRunning in migrationrunner.go).
func phase(svm *svmapi.StorageVersionMigration) Phase {
	c := svm.Status.Conditions
	switch {
	case meta.IsStatusConditionTrue(c, string(svmapi.MigrationSucceeded)):
		return Succeeded
	case meta.IsStatusConditionTrue(c, string(svmapi.MigrationFailed)):
		return Failed
	case meta.IsStatusConditionTrue(c, string(svmapi.MigrationRunning)):
		return Running
	}
	return Pending
}

// Requests are the StorageVersionMigrations of one etcd revision.
type Requests struct {
	Revision int64
	// All holds every readable request, oldest first (creationTimestamp,
	// then name: the controller's order).
	All []Request
	// Unreadable says, per key that could not be read, why (never a value).
	Unreadable []string
}

// List reads every StorageVersionMigration in etcd (at env.Config.Revision,
// or the current revision) through the pipeline's decoder.
func List(ctx context.Context, env *pipeline.Env) (*Requests, error) {
	prefix, err := env.Resolver.KeyPrefix(GroupResource, "")
	if err != nil {
		return nil, err
	}
	out := &Requests{}
	opts := etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: env.Config.PageSize, Revision: env.Config.Revision, KeepRevision: env.Config.Revision > 0}
	stats, err := env.Source.Scan(ctx, opts, func(page []etcdscan.KV) error {
		for _, kv := range page {
			obj, err := env.Decoder.Decode(ctx, kv)
			if err != nil {
				out.Unreadable = append(out.Unreadable, err.Error())
				continue
			}
			svm, ok := obj.Internal.(*svmapi.StorageVersionMigration)
			if !ok {
				out.Unreadable = append(out.Unreadable, fmt.Sprintf("%s: holds %T, not a StorageVersionMigration", kv.Key, obj.Internal))
				continue
			}
			out.All = append(out.All, newRequest(kv.Key, kv.ModRevision, svm))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read StorageVersionMigrations under %s: %w", prefix, err)
	}
	out.Revision = stats.Revision
	sort.SliceStable(out.All, func(i, j int) bool { return before(out.All[i], out.All[j]) })
	return out, nil
}

// before is the controller's compareSVM: creationTimestamp, then name.
func before(a, b Request) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return strings.Compare(a.Name, b.Name) < 0
}

// Pending lists the requests neither Succeeded nor Failed in the order the
// controller carries them out: one at a time per resource, the one already
// Running first, then the oldest; resources in the order of their oldest
// request.
func (rs *Requests) Pending() []Request {
	var out []Request
	first := map[schema.GroupResource]int{}
	for _, r := range rs.All {
		if r.Finished() {
			continue
		}
		if _, ok := first[r.GroupResource()]; !ok {
			first[r.GroupResource()] = len(first)
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if fa, fb := first[a.GroupResource()], first[b.GroupResource()]; fa != fb {
			return fa < fb
		}
		return a.Phase == Running && b.Phase != Running
	})
	return out
}

// Finished counts the Succeeded and Failed requests.
func (rs *Requests) Finished() int {
	n := 0
	for _, r := range rs.All {
		if r.Finished() {
			n++
		}
	}
	return n
}
