package storagemigration

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/features"

	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/updatepath"
)

// targetKind says what a request's spec.resource is to the target
// kube-apiserver.
type targetKind int

const (
	// builtin: a resource kube-apiserver stores and serves.
	builtin targetKind = iota
	// custom: the custom resources of a CRD found in etcd.
	custom
	// missing: not served at all; the controller fails the request
	// ("resource does not exist in discovery").
	missing
	// unsupported: served but not stored in etcd (a review, a binding):
	// the controller fails it as not migratable; the tool cannot say which
	// verbs kube-apiserver serves for it, and leaves it to the controller.
	unsupported
)

// target is what a request migrates.
type target struct {
	kind targetKind
	// scan is the resource whose keys are rewritten: spec.resource, or the
	// resource it shares its storage with (events.events.k8s.io: events).
	scan schema.GroupResource
	crd  *pipeline.CRD
	note string
}

// resolve maps spec.resource as the controller's REST mapper would (an
// exact group and resource served by the target kube-apiserver, or a CRD).
func resolve(env *pipeline.Env, gr schema.GroupResource) (target, error) {
	for _, c := range env.CRDs {
		if c.Resource == gr {
			return target{kind: custom, scan: gr, crd: c}, nil
		}
	}
	if env.Storage.IsBuiltin(gr) {
		rc, err := env.Target.Storage().Codec(gr)
		if err != nil {
			return target{}, err
		}
		path, err := updatePath(env)
		if err != nil {
			return target{}, err
		}
		_, served, err := path.ServedVersion(schema.GroupKind{Group: gr.Group, Kind: rc.Kind})
		if err != nil {
			return target{}, err
		}
		if !served {
			return target{kind: missing, note: fmt.Sprintf("the target kube-apiserver serves %s in no version (--runtime-config, --emulated-version)", gr)}, nil
		}
		return target{kind: builtin, scan: storageOwner(env, gr)}, nil
	}
	if servedNotStored(gr) {
		return target{kind: unsupported, note: fmt.Sprintf("kube-apiserver does not store %s in etcd: nothing to migrate; kube-controller-manager fails such a request as not migratable (no list/update/patch), the tool leaves it pending", gr)}, nil
	}
	return target{kind: missing, note: fmt.Sprintf("no built-in resource or CRD named %s", gr)}, nil
}

// storageOwner is the resource whose keys hold gr's objects: gr itself, or
// the resource it cohabits with (events.events.k8s.io is stored as events).
func storageOwner(env *pipeline.Env, gr schema.GroupResource) schema.GroupResource {
	if _, err := env.Resolver.KeyPrefix(gr, ""); err == nil {
		return gr
	}
	info, err := env.Resolver.Resolve(env.Resolver.Prefix() + "/" + env.Storage.ResourcePrefix(gr) + "/" + "x")
	if err != nil {
		return gr
	}
	return info.Resource
}

// servedNotStored reports whether kube-apiserver's scheme has a kind named
// like gr that it does not persist (no list kind: TokenReview, Binding...).
func servedNotStored(gr schema.GroupResource) bool {
	for gvk := range legacyscheme.Scheme.AllKnownTypes() {
		if gvk.Group != gr.Group || gvk.Version != runtime.APIVersionInternal || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		if plural, _ := meta.UnsafeGuessKindToResource(gvk); plural.Resource == gr.Resource {
			return true
		}
	}
	return false
}

// updatePath is the target kube-apiserver's update path (its field
// managers and served versions), which pipeline.Setup builds.
func updatePath(env *pipeline.Env) (*updatepath.Path, error) {
	p, ok := env.Planner.Update.(*updatepath.Path)
	if !ok || p == nil {
		return nil, fmt.Errorf("storage version migration: the pipeline has no kube-apiserver update path")
	}
	return p, nil
}

// Serving reports whether the target kube-apiserver serves the
// StorageVersionMigration API (storagemigration.k8s.io), and when it does
// not, why, naming the kube-apiserver flags that would make it. Without it
// the cluster can neither read the requests nor record a migration, and
// kube-controller-manager does not act on them.
func Serving(env *pipeline.Env) (bool, string, error) {
	api := env.Target.APIServer()
	path, err := updatePath(env)
	if err != nil {
		return false, "", err
	}
	_, served, err := path.ServedVersion(kind)
	if err != nil {
		return false, "", err
	}
	gate := api.FeatureGate().Enabled(features.StorageVersionMigrator)
	var why []string
	if !gate {
		why = append(why, "the StorageVersionMigrator feature gate is off (--feature-gates=StorageVersionMigrator=true; on by default from 1.37)")
	}
	if !served {
		ctrl, err := controllerOf(env)
		if err != nil {
			return false, "", err
		}
		if v := ctrl.apiVersion(); v == "v1" {
			why = append(why, "storagemigration.k8s.io/v1 is not served (--runtime-config=storagemigration.k8s.io/v1=true; on by default from 1.37)")
		} else {
			why = append(why, "storagemigration.k8s.io/"+v+" is not served (--runtime-config=storagemigration.k8s.io/"+v+"=true, from --emulated-version 1.35)")
		}
	}
	if len(why) > 0 {
		return false, "the target kube-apiserver does not serve StorageVersionMigrations: " + strings.Join(why, " and "), nil
	}
	return true, "", nil
}
