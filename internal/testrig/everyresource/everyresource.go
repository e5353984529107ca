// Package everyresource creates one object of every resource a running
// kube-apiserver persists and serves, in every API version it serves, for the
// tests that need a cluster holding "everything" (what a release wrote, what
// the tool must rewrite, what a no-op update must leave alone).
//
// The resources are enumerated through the server's own discovery, so a
// resource a release adds is noticed; the objects are Kubernetes' own
// storage-test stubs (k8s.io/kubernetes/test/integration/etcd, the data of
// its etcd storage path test) for the release the server runs or emulates,
// completed for an older release by that release's own stubs (generated,
// zz_generated_stubs.go), written through a dynamic client. Every object is created as kubectl's
// client-side apply creates it (the last-applied annotation, field manager
// kubectl-client-side-apply, an Update entry in managedFields); where the
// resource can be patched a server-side apply by another manager adds a
// label (an Apply entry), and where it has a status subresource the stub's
// status is applied to it (an Apply entry of subresource status).
//
// A served, persisted, creatable resource without a stub is not an error of
// Create: it is listed in Result.Missing and the caller's test decides.
package everyresource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	basever "k8s.io/component-base/version"
	etcddata "k8s.io/kubernetes/test/integration/etcd"
)

// Field managers of the objects Create writes.
const (
	// CreateManager creates every object, as `kubectl apply` does on
	// creation (client-side apply: an Update entry and the last-applied
	// annotation).
	CreateManager = "kubectl-client-side-apply"
	// ApplyManager adds AppliedLabel through server-side apply.
	ApplyManager = "everyresource-apply"
	// StatusManager applies the stub's status through server-side apply.
	StatusManager = "everyresource-status"
	// AppliedLabel is the label ApplyManager owns, value "true".
	AppliedLabel = "everyresource.kube-etcd-migrate/applied"
	// LastAppliedAnnotation is kubectl's client-side apply annotation.
	LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"
)

// DefaultNamespace holds the namespaced objects unless Options.Namespace says otherwise.
const DefaultNamespace = "everyresource"

// Options tune Create.
type Options struct {
	// Namespace of the namespaced objects, created if absent. Default DefaultNamespace.
	Namespace string
	// Version is the release whose stubs to use, e.g. "1.36". Default: the
	// server's emulated version, else its version (from /version).
	Version string
	// StatusRefused: a status stub the server refuses as invalid is not
	// an error of Create but listed in Result.StatusRefused (the object is
	// kept, without that status). Kubernetes' storage data has status stubs
	// only for the release it is of (1.37): an older release's validation
	// may refuse one (1.35 a StorageVersionMigration status without a
	// resourceVersion); the caller's test lists which it expects.
	StatusRefused bool
	// Skip, when set, leaves out the served resource versions (and the
	// kind discovery gives them) it returns true for: they are listed in
	// Result.Missing, nothing is written through them.
	Skip func(schema.GroupVersionResource, schema.GroupVersionKind) bool
}

// Object is one object Create wrote.
type Object struct {
	// GVR is the resource in the API version it was written through.
	GVR       schema.GroupVersionResource
	Kind      string
	Namespace string
	Name      string
	// EtcdPath is where Kubernetes' storage test expects it under the
	// default prefix /registry.
	EtcdPath string
	// Applied: a server-side apply (ApplyManager) added AppliedLabel.
	Applied bool
	// Status: the stub's status was applied (StatusManager).
	Status bool
}

func (o Object) String() string {
	if o.Namespace == "" {
		return o.GVR.String() + " " + o.Name
	}
	return o.GVR.String() + " " + o.Namespace + "/" + o.Name
}

// Result is what Create did.
type Result struct {
	// Version is the release whose stubs were used.
	Version string
	// Objects are the objects written, one per served resource and version.
	Objects []Object
	// Missing are the resources the server serves and persists (verbs
	// create and get) for which Kubernetes' storage data at Version has
	// no stub, or that Options.Skip left out: nothing of them was written.
	Missing []schema.GroupVersionResource
	// FromRelease are the resources among Objects whose stub is the older
	// release's own (zz_generated_stubs.go): the linked release's storage
	// data has none for them.
	FromRelease []schema.GroupVersionResource
	// StatusRefused are, with Options.StatusRefused, the objects whose
	// stub status the server refused as invalid, with its error.
	StatusRefused map[schema.GroupVersionResource]string
	// CRDs are the custom resource definitions created first
	// (etcddata.GetCustomResourceDefinitionData), whose custom resources
	// are among Objects.
	CRDs []string
}

// Create writes one object of every resource the server behind cfg
// persists, in every version it serves. It returns an error naming every
// object it could not write (all of them are attempted).
func Create(ctx context.Context, cfg *rest.Config, opts Options) (*Result, error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0 // many requests, no client-side throttling
	cfg.WarningHandler = rest.NoWarnings{}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ext, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Version: opts.Version}
	emulated := false
	if res.Version == "" {
		if res.Version, emulated, err = serverVersion(dc); err != nil {
			return nil, err
		}
	}
	data := etcddata.GetEtcdStorageDataForNamespaceServedAt(opts.Namespace, res.Version, emulated)
	if emulated {
		// Kubernetes' storage data leaves alpha versions out when emulating
		// (its storage test serves none then), but a server emulating an
		// older release with --runtime-config and AllAlpha serves them: take
		// their stubs from the data of that release read without emulation,
		// else from the data of the binary's own release (alpha APIs are not
		// emulated: the binary may serve one the older release did not have).
		for _, v := range []string{res.Version, binaryVersion(dc, res.Version)} {
			for gvr, d := range etcddata.GetEtcdStorageDataForNamespaceServedAt(opts.Namespace, v, false) {
				if _, ok := data[gvr]; !ok && strings.Contains(gvr.Version, "alpha") {
					data[gvr] = d
				}
			}
		}
	}

	// An older release's own storage-test stubs (generated from its
	// k8s.io/kubernetes/test/integration/etcd by internal/build/releasegen) for the
	// versions the linked release's data has no stub for: the alpha
	// versions the linked release no longer has (1.34's storage.k8s.io/v1alpha1
	// VolumeAttributesClasses).
	fromRelease := map[schema.GroupVersionResource]bool{}
	for key, stub := range releaseStubs[res.Version] {
		parts := strings.SplitN(key, "/", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("generated stub %q: not group/version/resource", key)
		}
		gvr := schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}
		if d, ok := data[gvr]; !ok || d.Stub == "" {
			data[gvr] = etcddata.StorageData{Stub: stub[0], ExpectedEtcdPath: strings.ReplaceAll(stub[1], "/NAMESPACE/", "/"+opts.Namespace+"/")}
			fromRelease[gvr] = true
		}
	}

	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": opts.Namespace}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", opts.Namespace, err)
	}
	for _, crd := range etcddata.GetCustomResourceDefinitionData() {
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create CustomResourceDefinition %s: %w", crd.Name, err)
		}
		res.CRDs = append(res.CRDs, crd.Name)
	}
	for _, crd := range etcddata.GetCustomResourceDefinitionData() {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return etcddata.CrdExistsInDiscovery(ext, crd), nil
		})
		if err != nil {
			return nil, fmt.Errorf("CustomResourceDefinition %s: its versions are not in discovery: %w", crd.Name, err)
		}
	}

	resources, err := persisted(dc)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, r := range resources {
		d, ok := data[r.gvr]
		if !ok || d.Stub == "" || (opts.Skip != nil && opts.Skip(r.gvr, r.kind)) {
			res.Missing = append(res.Missing, r.gvr)
			continue
		}
		obj, err := create(ctx, dyn, r, d, opts.Namespace)
		var refused statusRefused
		if opts.StatusRefused && errors.As(err, &refused) {
			if res.StatusRefused == nil {
				res.StatusRefused = map[schema.GroupVersionResource]string{}
			}
			res.StatusRefused[r.gvr] = refused.err.Error()
			err = nil
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res.Objects = append(res.Objects, obj)
		if fromRelease[r.gvr] {
			res.FromRelease = append(res.FromRelease, r.gvr)
		}
	}
	return res, errors.Join(errs...)
}

// serverVersion is the release the server runs or emulates, "MAJOR.MINOR".
func serverVersion(dc discovery.DiscoveryInterface) (string, bool, error) {
	info, err := dc.ServerVersion()
	if err != nil {
		return "", false, fmt.Errorf("server version: %w", err)
	}
	binary, err := version.ParseGeneric(info.GitVersion)
	if err != nil {
		return "", false, fmt.Errorf("server version %q: %w", info.GitVersion, err)
	}
	v := fmt.Sprintf("%d.%d", binary.Major(), binary.Minor())
	if info.EmulationMajor != "" && info.EmulationMinor != "" {
		e := info.EmulationMajor + "." + strings.TrimSuffix(info.EmulationMinor, "+")
		return e, e != v, nil
	}
	return v, false, nil
}

// binaryVersion is the release of the server's binary, "MAJOR.MINOR": from
// /version, or, when that does not say (an in-process test server's version
// is not stamped), the release of the linked kube-apiserver.
func binaryVersion(dc discovery.DiscoveryInterface, emulated string) string {
	if info, err := dc.ServerVersion(); err == nil {
		if v, err := version.ParseGeneric(info.GitVersion); err == nil && v.AtLeast(version.MustParseGeneric(emulated)) {
			return fmt.Sprintf("%d.%d", v.Major(), v.Minor())
		}
	}
	return basever.DefaultKubeBinaryVersion
}

// resource is one served resource that can be created and read.
type resource struct {
	gvr        schema.GroupVersionResource
	kind       schema.GroupVersionKind
	namespaced bool
	patch      bool // server-side apply possible
	status     bool // a status subresource that can be patched
}

// persisted lists every resource in every served version that supports
// create and get (kube-apiserver's persisted resources: the virtual ones,
// reviews and the like, have create only), in discovery's order with
// ResourceQuotas last, so that no quota admission stands in the way of the
// other objects of the namespace.
func persisted(dc discovery.DiscoveryInterface) ([]resource, error) {
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	var out []resource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, fmt.Errorf("discovery: %w", err)
		}
		sub := map[string]bool{}
		for _, r := range l.APIResources {
			if strings.HasSuffix(r.Name, "/status") && slices.Contains(r.Verbs, "patch") {
				sub[strings.TrimSuffix(r.Name, "/status")] = true
			}
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "create") || !slices.Contains(r.Verbs, "get") {
				continue
			}
			kind := gv.WithKind(r.Kind)
			if r.Group != "" || r.Version != "" {
				kind = schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}
			}
			out = append(out, resource{
				gvr:        gv.WithResource(r.Name),
				kind:       kind,
				namespaced: r.Namespaced,
				patch:      slices.Contains(r.Verbs, "patch"),
				status:     sub[r.Name],
			})
		}
	}
	slices.SortStableFunc(out, func(a, b resource) int {
		qa, qb := a.gvr.GroupResource() == resourceQuotas, b.gvr.GroupResource() == resourceQuotas
		switch {
		case qa == qb:
			return 0
		case qa:
			return 1
		}
		return -1
	})
	return out, nil
}

var resourceQuotas = schema.GroupResource{Resource: "resourcequotas"}

// noStatusApply are resources whose status the stub cannot set by apply:
// a CertificateSigningRequest's conditions are set through its approval
// subresource (Kubernetes' own apply-status test leaves it out too).
var noStatusApply = map[schema.GroupResource]bool{
	{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}: true,
}

// create writes one object of r from its stub: created as client-side
// apply does, then a label by server-side apply, then the stub's status.
func create(ctx context.Context, dyn dynamic.Interface, r resource, d etcddata.StorageData, namespace string) (Object, error) {
	var stub map[string]any
	// Integers as int64, as the API machinery reads JSON: with
	// --feature-gates=AllAlpha=true the test process's clients prefer CBOR
	// (ClientsPreferCBOR; kube-apiserver's gates back client-go's), and a
	// float64 there is refused for an integer field.
	if err := utiljson.Unmarshal([]byte(d.Stub), &stub); err != nil {
		return Object{}, fmt.Errorf("%s: stub: %w", r.gvr, err)
	}
	u := &unstructured.Unstructured{Object: stub}
	u.SetAPIVersion(r.kind.GroupVersion().String())
	u.SetKind(r.kind.Kind)
	if !r.namespaced {
		namespace = ""
	}
	u.SetNamespace(namespace)
	o := Object{GVR: r.gvr, Kind: r.kind.Kind, Namespace: namespace, Name: u.GetName(), EtcdPath: d.ExpectedEtcdPath}

	// kubectl apply on creation: the applied configuration as the
	// last-applied annotation, created by its own field manager.
	applied, err := json.Marshal(u.Object)
	if err != nil {
		return o, fmt.Errorf("%s: %w", o, err)
	}
	ann := u.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[LastAppliedAnnotation] = string(applied) + "\n"
	u.SetAnnotations(ann)
	ri := dyn.Resource(r.gvr).Namespace(namespace)
	if _, err := ri.Create(ctx, u, metav1.CreateOptions{FieldManager: CreateManager}); err != nil {
		return o, fmt.Errorf("create %s: %w", o, err)
	}

	if r.patch {
		cfg := &unstructured.Unstructured{}
		cfg.SetAPIVersion(u.GetAPIVersion())
		cfg.SetKind(u.GetKind())
		cfg.SetName(o.Name)
		cfg.SetNamespace(namespace)
		cfg.SetLabels(map[string]string{AppliedLabel: "true"})
		if _, err := ri.Apply(ctx, o.Name, cfg, metav1.ApplyOptions{FieldManager: ApplyManager, Force: true}); err != nil {
			return o, fmt.Errorf("server-side apply %s: %w", o, err)
		}
		o.Applied = true
	}

	if r.status && !noStatusApply[r.gvr.GroupResource()] {
		status := &unstructured.Unstructured{}
		if err := utiljson.Unmarshal([]byte(d.GetStatusStub()), &status.Object); err != nil {
			return o, fmt.Errorf("%s: status stub: %w", r.gvr, err)
		}
		status.SetAPIVersion(u.GetAPIVersion())
		status.SetKind(u.GetKind())
		status.SetName(o.Name)
		status.SetNamespace(namespace)
		if _, err := ri.ApplyStatus(ctx, o.Name, status, metav1.ApplyOptions{FieldManager: StatusManager, Force: true}); err != nil {
			if apierrors.IsInvalid(err) {
				return o, statusRefused{fmt.Errorf("apply status of %s: %w", o, err)}
			}
			return o, fmt.Errorf("apply status of %s: %w", o, err)
		}
		o.Status = true
	}
	return o, nil
}

// statusRefused is create's error when the server refused the stub's status
// as invalid: the object itself was written.
type statusRefused struct{ err error }

func (e statusRefused) Error() string { return e.err.Error() }
func (e statusRefused) Unwrap() error { return e.err }
