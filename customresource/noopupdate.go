package customresource

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/conversion"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	registrycustomresource "k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured/unstructuredscheme"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/rest"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"kube-etcd-migrate/updatepath"
)

// noOpUpdate is what getOrCreateServingInfoFor builds for the update handler
// of one CRD, once: the type converter, the CR converter, and the request
// version a client would update through.
type noOpUpdate struct {
	typeConverter managedfields.TypeConverter
	converter     runtime.ObjectConvertor // the safe converter (conversion.safeConverterWrapper)
	kind          schema.GroupVersionKind // in the request version; Kind = Version = "" when nothing is served
	resetFields   map[fieldpath.APIVersion]fieldpath.Filter
}

// noOpUpdateState caches a Codec's noOpUpdate.
type noOpUpdateState struct {
	once sync.Once
	u    *noOpUpdate
	err  error
}

// NoOpUpdate does to obj, a custom resource as Decode returned it, what
// apiextensions-apiserver's update handler does on a no-op update (GET, then
// PUT unchanged) before the storage layer encodes it: its field manager
// (managedfields.NewDefaultCRDFieldManager, UpdateNoErrors), built as
// getOrCreateServingInfoFor builds it for the CRD. The type converter comes
// from the OpenAPI models of every version in spec.versions, served or not
// (builder.BuildOpenAPIV3, merged with builder.MergeSpecsV3 onto the static
// spec of Options.StaticOpenAPISpec); the object converter is the CRD's own
// (conversion.NewCRConverterFactory), which refuses versions not in
// spec.versions. So an object with a managedFields entry of a version removed
// from the CRD loses its managedFields (the field manager fails, and kube-
// apiserver's UpdateNoErrors then clears them all), while entries of listed
// versions are kept as they are. The update goes through the newest served
// version, as discovery lists it first; a CRD that serves nothing cannot be
// updated, and an object without managedFields is left alone (the field
// manager does not start tracking an existing object on update).
//
// It changes only obj's managedFields and reports whether they changed. A
// conversion between two versions of the CRD that fails (a conversion webhook
// unreachable or refusing) is an error here, not cleared managedFields: it is
// the run's failure, not what the next write through kube-apiserver would do.
func (c *Codec) NoOpUpdate(obj *unstructured.Unstructured) (bool, error) {
	if !c.check || c.full || obj == nil {
		return c.noOpUpdate(obj, c.full)
	}
	// Options.CheckShortcut: the full field manager on a copy, beside.
	ref := obj.DeepCopy()
	refChanged, refErr := c.noOpUpdate(ref, true)
	changed, err := c.noOpUpdate(obj, false)
	if (err == nil) != (refErr == nil) || changed != refChanged ||
		!reflect.DeepEqual(obj.Object["metadata"], ref.Object["metadata"]) {
		return false, fmt.Errorf("field manager of CRD %s: the shortcut gives other managedFields than the full field manager (changed %v, %v; errors %v, %v; %s)", c.name, changed, refChanged, err, refErr, updatepath.CheckShortcutEnv)
	}
	return changed, err
}

func (c *Codec) noOpUpdate(obj *unstructured.Unstructured, full bool) (bool, error) {
	if obj == nil || obj.Object == nil {
		return false, errors.New("customresource: nil object")
	}
	before := obj.GetManagedFields()
	if len(before) == 0 {
		return false, nil
	}
	c.noOp.once.Do(func() { c.noOp.u, c.noOp.err = c.newNoOpUpdate() })
	if c.noOp.err != nil {
		return false, c.noOp.err
	}
	u := c.noOp.u
	if u.kind.Version == "" {
		return false, nil
	}
	// A CRD converted by a webhook runs the field manager on every object:
	// the webhook is not known to be deterministic, and its failure is the
	// run's (below). Without one, conversions only set apiVersion and fail
	// only for versions the CRD does not list, so updatepath.Memo's proof
	// holds for custom resources too, the CRD and the object's apiVersion in
	// the key.
	var key updatepath.MemoKey
	memo := !full && c.webhook == nil
	if memo {
		key = c.memo.Key("crd "+c.name+" "+obj.GetAPIVersion(), obj.GetUID() != "", before)
		defer key.Done()
		if key.Known() {
			return false, nil
		}
	}
	// The converter records its own failures for this object: the field
	// manager turns every error into cleared managedFields.
	conv := &checkedConvertor{ObjectConvertor: u.converter, versions: c.versions, group: c.group}
	fm, err := managedfields.NewDefaultCRDFieldManager(u.typeConverter, conv, defaulter{c}, unstructuredscheme.NewUnstructuredCreator(),
		u.kind, u.kind.GroupVersion(), "", u.resetFields)
	if err != nil {
		return false, fmt.Errorf("CRD %s: field manager: %w", c.name, err)
	}
	// The live object read from storage and the request's object, which a
	// no-op update sends back unchanged.
	live, req := obj.DeepCopy(), obj.DeepCopy()
	var out runtime.Object
	failed := false
	if memo {
		// UpdateNoErrors, knowing whether it failed: on an error it keeps
		// the live object's managedFields.
		if out, err = fm.Update(live, req, c.manager); err != nil {
			failed = true
			req.SetManagedFields(live.GetManagedFields())
			out = req
		}
	} else {
		out = fm.UpdateNoErrors(live, req, c.manager)
	}
	if conv.err != nil {
		if down := c.webhookDown(context.Background(), conv.err); down != nil {
			return false, down
		}
		return false, fmt.Errorf("field manager of CRD %s: %w", c.name, conv.err)
	}
	if conv.converted && c.webhook != nil {
		c.webhook.answered.Store(true)
	}
	outU, ok := out.(*unstructured.Unstructured)
	if !ok {
		return false, fmt.Errorf("field manager of CRD %s returned %T", c.name, out)
	}
	// What the field manager wrote is what the storage layer encodes.
	md, ok := obj.Object["metadata"].(map[string]interface{})
	if !ok {
		return false, fmt.Errorf("%s: no metadata object", obj.GroupVersionKind())
	}
	if mf, found, _ := unstructured.NestedFieldNoCopy(outU.Object, "metadata", "managedFields"); found {
		md["managedFields"] = mf
	} else {
		delete(md, "managedFields")
	}
	changed := !apiequality.Semantic.DeepEqual(before, obj.GetManagedFields())
	if memo && !changed && !failed {
		key.Remember()
	}
	return changed, nil
}

// newNoOpUpdate builds the type converter, the CR converter and the reset
// fields of the update handler as getOrCreateServingInfoFor does.
func (c *Codec) newNoOpUpdate() (*noOpUpdate, error) {
	if c.staticSpec == nil {
		return nil, fmt.Errorf("CRD %s: no static OpenAPI spec (Options.StaticOpenAPISpec): the field manager cannot run", c.name)
	}
	static, err := c.staticSpec()
	if err != nil {
		return nil, fmt.Errorf("CRD %s: static OpenAPI spec: %w", c.name, err)
	}
	crd := c.crd
	u := &noOpUpdate{}

	// buildOpenAPIModelsForApply; on error the handler logs it and goes on
	// without models, as without a static spec: a deduced type converter.
	var typeConverter managedfields.TypeConverter = managedfields.NewDeducedTypeConverter()
	if models, err := openAPIModels(static, crd); err == nil && len(models) > 0 {
		typeConverter, err = managedfields.NewTypeConverter(models, crd.Spec.PreserveUnknownFields)
		if err != nil {
			// kube-apiserver refuses to serve the CRD.
			return nil, fmt.Errorf("CRD %s: type converter: %w", c.name, err)
		}
	}
	u.typeConverter = typeConverter

	factory, err := conversion.NewCRConverterFactory(c.resolver, withTimeout(c.httpTimeout))
	if err != nil {
		return nil, fmt.Errorf("CRD %s: converter: %w", c.name, err)
	}
	u.converter, _, err = factory.NewConverter(crd)
	if err != nil {
		return nil, fmt.Errorf("CRD %s: converter: %w", c.name, err)
	}

	// The newest served version: what discovery lists first.
	var served []apiextensionsv1.CustomResourceDefinitionVersion
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served = append(served, v)
		}
	}
	if len(served) == 0 {
		return u, nil
	}
	sort.SliceStable(served, func(i, j int) bool {
		return version.CompareKubeAwareVersionStrings(served[i].Name, served[j].Name) > 0
	})
	u.kind = schema.GroupVersionKind{Group: c.group, Version: served[0].Name, Kind: c.kind}

	// The reset fields of the CRD's strategy in that version (status, with a
	// status subresource), as scopeWithFieldManager filters them.
	subresources, err := apiextensionshelpers.GetSubresourcesForVersion(crd, served[0].Name)
	if err != nil {
		return nil, fmt.Errorf("CRD %s version %s: subresources: %w", c.name, served[0].Name, err)
	}
	var status *apiextensionsinternal.CustomResourceSubresourceStatus
	if subresources != nil && subresources.Status != nil {
		status = &apiextensionsinternal.CustomResourceSubresourceStatus{}
	}
	strategy := registrycustomresource.NewStrategy(nil, crd.Spec.Scope == apiextensionsv1.NamespaceScoped, u.kind, nil, nil, nil, status, nil, nil)
	u.resetFields = fieldpath.NewExcludeFilterSetMap(strategy.GetResetFields())
	return u, nil
}

// openAPIModels is apiextensions-apiserver's buildOpenAPIModelsForApply: the
// OpenAPI v3 spec of every version in spec.versions merged onto the static
// spec (nil models without one).
func openAPIModels(static map[string]*spec.Schema, crd *apiextensionsv1.CustomResourceDefinition) (map[string]*spec.Schema, error) {
	if static == nil {
		return nil, nil
	}
	specs := []*spec3.OpenAPI{{
		Version:    "3.0.0",
		Info:       &spec.Info{InfoProps: spec.InfoProps{Title: "Kubernetes CRD Swagger", Version: "v0.1.0"}},
		Components: &spec3.Components{Schemas: static},
	}}
	for _, v := range crd.Spec.Versions {
		s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{})
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	merged, err := builder.MergeSpecsV3(specs...)
	if err != nil {
		return nil, err
	}
	return merged.Components.Schemas, nil
}

// withTimeout bounds each conversion webhook call the CR converter makes by
// Options.HTTPTimeout, as the tool's own webhook client (kube-apiserver's
// default is 30 s).
func withTimeout(timeout time.Duration) webhook.AuthenticationInfoResolverWrapper {
	return func(r webhook.AuthenticationInfoResolver) webhook.AuthenticationInfoResolver {
		set := func(cfg *rest.Config, err error) (*rest.Config, error) {
			if cfg != nil {
				cfg.Timeout = timeout
			}
			return cfg, err
		}
		return &webhook.AuthenticationInfoResolverDelegator{
			ClientConfigForFunc: func(hostPort string) (*rest.Config, error) {
				return set(r.ClientConfigFor(hostPort))
			},
			ClientConfigForServiceFunc: func(name, namespace string, port int) (*rest.Config, error) {
				return set(r.ClientConfigForService(name, namespace, port))
			},
		}
	}
}

// checkedConvertor is the CR converter as the field manager uses it,
// remembering the first failure of a conversion between two versions listed
// in the CRD. The CR converter refuses any other version by itself: that
// failure is kube-apiserver's too.
type checkedConvertor struct {
	runtime.ObjectConvertor
	versions map[string]bool
	group    string
	err      error
	// converted: a conversion between two listed versions succeeded (a
	// webhook's, when the CRD has one: it answered).
	converted bool
}

func (c *checkedConvertor) listed(gv schema.GroupVersion) bool {
	return gv.Group == c.group && c.versions[gv.Version]
}

func (c *checkedConvertor) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	from := in.GetObjectKind().GroupVersionKind()
	out, err := c.ObjectConvertor.ConvertToVersion(in, target)
	to, ok := target.KindForGroupVersionKinds([]schema.GroupVersionKind{from})
	between := ok && c.listed(from.GroupVersion()) && c.listed(to.GroupVersion())
	if err != nil && c.err == nil && between {
		c.err = fmt.Errorf("converting %s to %s: %w", from.GroupVersion(), to.GroupVersion(), err)
	}
	if err == nil && between && from.GroupVersion() != to.GroupVersion() {
		c.converted = true
	}
	return out, err
}

func (c *checkedConvertor) Convert(in, out, context interface{}) error {
	err := c.ObjectConvertor.Convert(in, out, context)
	if err != nil && c.err == nil {
		inObj, ok1 := in.(runtime.Object)
		outObj, ok2 := out.(runtime.Object)
		if ok1 && ok2 && c.listed(inObj.GetObjectKind().GroupVersionKind().GroupVersion()) && c.listed(outObj.GetObjectKind().GroupVersionKind().GroupVersion()) {
			c.err = fmt.Errorf("converting %s to %s: %w", inObj.GetObjectKind().GroupVersionKind().GroupVersion(), outObj.GetObjectKind().GroupVersionKind().GroupVersion(), err)
		}
	}
	return err
}

// defaulter is apiextensions-apiserver's unstructuredDefaulter for the CRD's
// objects: the structural defaults of the object's version.
type defaulter struct{ c *Codec }

func (d defaulter) Default(obj runtime.Object) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	gvk := u.GroupVersionKind()
	if gvk.Group != d.c.group || gvk.Kind != d.c.kind {
		return
	}
	structuraldefaulting.Default(u.Object, d.c.schemas[gvk.Version])
}
