// Package updatepath does to a decoded built-in object what kube-apiserver's
// update handler does to it on a no-op update (GET, then PUT unchanged) before
// the storage layer encodes it: the field manager. kube-apiserver runs
// structured-merge-diff's updater on every write, with a type converter built
// from the OpenAPI models of the versions it serves; a managedFields entry whose
// apiVersion that converter does not know (a version no longer served, or never
// enabled by --runtime-config) is deleted, more than ten update managers are
// merged, and undecodable managedFields are dropped. This package builds the
// same type converters, the way kube-apiserver's generic server builds them
// (one for the legacy core group, one for every other group it installs, one
// each for the apiextensions and aggregator servers), from the served resources
// that the API enablement (--runtime-config) and the emulated version leave, and
// runs k8s.io/apimachinery's own field manager on the object. It changes only
// managedFields, and reports whether it did. A type served by two API groups
// (an Event: core v1 and events.k8s.io/v1, one storage) is judged through the
// group its managers wrote through: current when a no-op update through one
// of the groups its managedFields entries name leaves it unchanged. Where the field manager provably
// changes nothing (Memo, memo.go) it is skipped, unless
// Config.FullFieldManager.
package updatepath

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	utilopenapi "k8s.io/apiserver/pkg/util/openapi"
	basecompatibility "k8s.io/component-base/compatibility"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	openapibuilder3 "k8s.io/kube-openapi/pkg/builder3"
	openapicommon "k8s.io/kube-openapi/pkg/common"
	openapiutil "k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	generatedopenapi "k8s.io/kubernetes/pkg/generated/openapi"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Manager is the field manager name a no-op update by this tool would record.
// A no-op update changes no field, so no entry is ever added under it.
const Manager = "kube-etcd-migrate"

// Config is the served API: what kube-apiserver installs.
type Config struct {
	// ResourceConfig is the merged API enablement (defaults + --runtime-config);
	// nil = kube-apiserver's defaults.
	ResourceConfig *serverstorage.ResourceConfig
	// Effective is the effective (emulated) version.
	Effective basecompatibility.EffectiveVersion
	// EmulationForwardCompatible and RuntimeConfigEmulationForwardCompatible
	// are kube-apiserver's flags of those names.
	EmulationForwardCompatible              bool
	RuntimeConfigEmulationForwardCompatible bool
	// FullFieldManager runs the field manager on every object
	// (--full-field-manager): without it, objects whose kind and
	// managedFields the field manager was seen to leave unchanged skip it
	// (Memo, where this is proven exact).
	FullFieldManager bool
	// CheckShortcut runs both, the shortcut and the full field manager, on
	// every object and makes an object whose managedFields or verdict differ
	// an error (the e2e tests set it through CheckShortcutEnv).
	CheckShortcut bool
}

// CheckShortcutEnv, set to anything, makes the tool check the field manager
// shortcut against the full field manager on every object (Config.CheckShortcut):
// a test hook, twice the field manager's cost.
const CheckShortcutEnv = "KUBE_ETCD_MIGRATE_CHECK_FIELD_MANAGER_SHORTCUT"

// server is one of kube-apiserver's type converters and what it serves.
type server int

const (
	legacyServer     server = iota // /api: the core group
	kubeServer                     // /apis of kube-apiserver's own groups
	extensionsServer               // apiextensions-apiserver: apiextensions.k8s.io
	aggregatorServer               // kube-aggregator: apiregistration.k8s.io
)

// Path runs the field manager of a no-op update. It is safe for concurrent use.
type Path struct {
	cfg Config

	once       sync.Once
	initErr    error
	converters map[server]managedfields.TypeConverter
	// crSpec is the apiextensions server's models (CustomResourceStaticSpec);
	// the other servers' models are dropped once their converters are built
	// (those of the core server alone hold megabytes).
	crSpec    map[string]*spec.Schema
	preferred map[schema.GroupKind]schema.GroupVersionKind // served version a client would use

	// managers caches the field manager of each kind (nil: not served);
	// read by every decode worker, written once per kind.
	mu       sync.RWMutex
	managers map[schema.GroupKind]*managedfields.FieldManager

	// memo remembers the kinds and managedFields the field manager leaves
	// unchanged.
	memo Memo
}

// New returns the update path of kube-apiserver serving cfg. The type
// converters are built on first use (it takes a second or two).
func New(cfg Config) *Path {
	return &Path{cfg: cfg, managers: map[schema.GroupKind]*managedfields.FieldManager{}}
}

// Apply runs the field manager of a no-op update on obj, an internal object as
// decoded from storage, and reports whether its managedFields changed. obj is
// changed in place.
func (p *Path) Apply(obj runtime.Object) (changed bool, err error) {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return false, nil // no metadata: the field manager leaves it alone
	}
	before := acc.GetManagedFields()
	if len(before) == 0 {
		// With no managedFields the field manager does nothing on an update
		// (it never starts tracking an existing object on update).
		return false, nil
	}
	gvks, _, err := p.scheme(obj).ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return false, fmt.Errorf("field manager: kind of %T: %v", obj, err)
	}
	kinds, err := p.updateKinds(gvks, before)
	if err != nil {
		return false, err
	}
	switch len(kinds) {
	case 0:
		return p.applyAs(gvks[0].GroupKind(), obj, acc, before)
	case 1:
		return p.applyAs(kinds[0], obj, acc, before)
	}
	// Served by several groups (an Event, as events and as
	// events.events.k8s.io): each group's endpoint has its own field
	// manager, and a no-op update through either keeps what that one
	// keeps. The object is current when one of them leaves it unchanged;
	// else it is written as the first, the group its managers name first,
	// writes it (see updateKinds).
	var first runtime.Object
	var firstErr error
	for i, gk := range kinds {
		try := obj.DeepCopyObject()
		tryAcc, err := meta.Accessor(try)
		if err != nil {
			return false, err
		}
		changed, err := p.applyAs(gk, try, tryAcc, tryAcc.GetManagedFields())
		if err == nil && !changed {
			return false, nil
		}
		if i == 0 {
			first, firstErr = try, err
		}
	}
	if firstErr != nil {
		return false, firstErr
	}
	firstAcc, err := meta.Accessor(first)
	if err != nil {
		return false, err
	}
	// The field manager changes managedFields only.
	acc.SetManagedFields(firstAcc.GetManagedFields())
	return true, nil
}

// updateKinds lists the kinds, one per API group, through which
// kube-apiserver serves obj's type and so could update it (gvks are the
// scheme's kinds of the internal type; an Event is the core group's Event
// and events.k8s.io's), in the order Apply tries their no-op updates: the
// groups named by the apiVersions of the object's managedFields entries
// (the groups its managers wrote through) first, the core group before
// the others, then the groups no entry names. It is nil for a type of one
// group, and leaves out the groups kube-apiserver does not serve it through.
func (p *Path) updateKinds(gvks []schema.GroupVersionKind, entries []metav1.ManagedFieldsEntry) ([]schema.GroupKind, error) {
	if len(gvks) < 2 {
		return nil, nil
	}
	p.once.Do(func() { p.initErr = p.init() })
	if p.initErr != nil {
		return nil, p.initErr
	}
	named := map[string]bool{}
	for _, e := range entries {
		if gv, err := schema.ParseGroupVersion(e.APIVersion); err == nil {
			named[gv.Group] = true
		}
	}
	var kinds []schema.GroupKind
	for _, gvk := range gvks {
		gk := gvk.GroupKind()
		if _, served := p.preferred[gk]; served && !slices.Contains(kinds, gk) {
			kinds = append(kinds, gk)
		}
	}
	sort.SliceStable(kinds, func(i, j int) bool {
		if named[kinds[i].Group] != named[kinds[j].Group] {
			return named[kinds[i].Group]
		}
		return kinds[i].Group < kinds[j].Group
	})
	return kinds, nil
}

// applyAs runs the no-op update's field manager of gk's endpoint on obj.
func (p *Path) applyAs(gk schema.GroupKind, obj runtime.Object, acc metav1.Object, before []metav1.ManagedFieldsEntry) (changed bool, err error) {
	fm, err := p.manager(gk, obj)
	if err != nil {
		return false, err
	}
	if fm == nil {
		return false, nil
	}
	// The field manager panics on some input (an undecodable fieldsV1 on an
	// object without a UID: it then converts the live object, managedFields
	// included, to a typed value); kube-apiserver's handler turns that into
	// an internal error, and the update fails.
	defer func() {
		if r := recover(); r != nil {
			changed, err = false, fmt.Errorf("field manager of %s: kube-apiserver's update would fail: it panics on these managedFields", gk)
		}
	}()
	if p.cfg.FullFieldManager {
		return fullUpdate(fm, obj, acc, before), nil
	}
	if p.cfg.CheckShortcut {
		ref := obj.DeepCopyObject()
		refAcc, err := meta.Accessor(ref)
		if err != nil {
			return false, err
		}
		refChanged := fullUpdate(fm, ref, refAcc, refAcc.GetManagedFields())
		changed := p.shortcut(fm, gk, obj, acc, before)
		if changed != refChanged || !reflect.DeepEqual(acc.GetManagedFields(), refAcc.GetManagedFields()) {
			return false, fmt.Errorf("field manager of %s: the shortcut gives other managedFields than the full field manager (changed %v, %v; %s)", gk, changed, refChanged, CheckShortcutEnv)
		}
		return changed, nil
	}
	return p.shortcut(fm, gk, obj, acc, before), nil
}

// shortcut skips the field manager where Memo knows it changes nothing, and
// runs it otherwise.
func (p *Path) shortcut(fm *managedfields.FieldManager, gk schema.GroupKind, obj runtime.Object, acc metav1.Object, before []metav1.ManagedFieldsEntry) bool {
	key := p.memo.Key(gk.String(), acc.GetUID() != "", before)
	defer key.Done()
	if key.Known() {
		return false
	}
	changed, failed := update(fm, obj, acc, before)
	if !changed && !failed {
		key.Remember()
	}
	return changed
}

// fullUpdate is kube-apiserver's no-op update: UpdateNoErrors(live, new)
// with the live object a copy of the new one.
func fullUpdate(fm *managedfields.FieldManager, obj runtime.Object, acc metav1.Object, before []metav1.ManagedFieldsEntry) bool {
	kept := make([]metav1.ManagedFieldsEntry, len(before))
	copy(kept, before)
	live := obj.DeepCopyObject()
	out := fm.UpdateNoErrors(live, obj, Manager)
	after := kept
	if outAcc, err := meta.Accessor(out); err == nil {
		after = outAcc.GetManagedFields()
		if out != obj {
			acc.SetManagedFields(after)
		}
	}
	return !apiequality.Semantic.DeepEqual(kept, after)
}

// update is fullUpdate that also says whether the field manager failed:
// Update, and on its error what UpdateNoErrors does then (the live object's
// managedFields, a copy of the stored ones, are kept).
func update(fm *managedfields.FieldManager, obj runtime.Object, acc metav1.Object, before []metav1.ManagedFieldsEntry) (changed, failed bool) {
	kept := make([]metav1.ManagedFieldsEntry, len(before))
	copy(kept, before)
	live := obj.DeepCopyObject()
	out, err := fm.Update(live, obj, Manager)
	if err != nil {
		liveAcc, aerr := meta.Accessor(live)
		if aerr != nil {
			acc.SetManagedFields(kept)
		} else {
			acc.SetManagedFields(liveAcc.GetManagedFields())
		}
		return !apiequality.Semantic.DeepEqual(kept, acc.GetManagedFields()), true
	}
	after := kept
	if outAcc, err := meta.Accessor(out); err == nil {
		after = outAcc.GetManagedFields()
		if out != obj {
			acc.SetManagedFields(after)
		}
	}
	return !apiequality.Semantic.DeepEqual(kept, after), false
}

func (p *Path) scheme(obj runtime.Object) *runtime.Scheme {
	switch {
	case legacyscheme.Scheme.Recognizes(kindOf(legacyscheme.Scheme, obj)):
		return legacyscheme.Scheme
	case apiextensionsapiserver.Scheme.Recognizes(kindOf(apiextensionsapiserver.Scheme, obj)):
		return apiextensionsapiserver.Scheme
	}
	return aggregatorscheme.Scheme
}

func kindOf(s *runtime.Scheme, obj runtime.Object) schema.GroupVersionKind {
	gvks, _, err := s.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return schema.GroupVersionKind{}
	}
	return gvks[0]
}

// manager is the field manager of gk's endpoint in its preferred served
// version, nil when kube-apiserver serves gk in no version (then no update
// through the API can happen).
func (p *Path) manager(gk schema.GroupKind, obj runtime.Object) (*managedfields.FieldManager, error) {
	p.once.Do(func() { p.initErr = p.init() })
	if p.initErr != nil {
		return nil, p.initErr
	}
	p.mu.RLock()
	fm, ok := p.managers[gk]
	p.mu.RUnlock()
	if ok {
		return fm, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if fm, ok := p.managers[gk]; ok {
		return fm, nil
	}
	gvk, ok := p.preferred[gk]
	if !ok {
		p.managers[gk] = nil
		return nil, nil
	}
	// Reset fields only filter fields an update changes; a no-op changes none.
	fm, err := p.newFieldManager(gvk, p.scheme(obj), "", nil)
	if err != nil {
		return nil, err
	}
	p.managers[gk] = fm
	return fm, nil
}

func (p *Path) newFieldManager(gvk schema.GroupVersionKind, s *runtime.Scheme, subresource string, resetFields map[fieldpath.APIVersion]fieldpath.Filter) (*managedfields.FieldManager, error) {
	fm, err := managedfields.NewDefaultFieldManager(
		p.converters[serverOf(gvk.Group)],
		runtime.UnsafeObjectConvertor(s),
		s,
		s,
		gvk,
		schema.GroupVersion{Group: gvk.Group, Version: runtime.APIVersionInternal},
		subresource,
		resetFields,
	)
	if err != nil {
		return nil, fmt.Errorf("field manager for %s: %w", gvk, err)
	}
	return fm, nil
}

// FieldManager is the field manager kube-apiserver installs on the endpoint
// of gk (subresource "" or "status") in the preferred version it serves, with
// the reset fields of the endpoint's storage strategy, as the generic
// apiserver's installer builds it. Writers of objects other than no-op
// updates (a create, a status update) run it as kube-apiserver's create and
// update handlers do: UpdateNoErrors(live, new, manager), live being a new
// empty object on create. It is nil, with no error, when kube-apiserver
// serves gk in no version.
func (p *Path) FieldManager(gk schema.GroupKind, subresource string, strategy rest.ResetFieldsStrategy) (*managedfields.FieldManager, error) {
	p.once.Do(func() { p.initErr = p.init() })
	if p.initErr != nil {
		return nil, p.initErr
	}
	gvk, ok := p.preferred[gk]
	if !ok {
		return nil, nil
	}
	var reset map[fieldpath.APIVersion]fieldpath.Filter
	if strategy != nil {
		reset = fieldpath.NewExcludeFilterSetMap(strategy.GetResetFields())
	}
	return p.newFieldManager(gvk, schemeOf(gk.Group), subresource, reset)
}

// ServedVersion is the version of gk kube-apiserver serves that a client
// would use (its preferred one), and whether it serves gk at all: its
// resource enabled by the API enablement (--runtime-config) and available at
// the emulated version. Feature gates that keep a group's REST storage from
// being installed are the caller's to check.
func (p *Path) ServedVersion(gk schema.GroupKind) (schema.GroupVersionKind, bool, error) {
	p.once.Do(func() { p.initErr = p.init() })
	if p.initErr != nil {
		return schema.GroupVersionKind{}, false, p.initErr
	}
	gvk, ok := p.preferred[gk]
	return gvk, ok, nil
}

// CustomResourceStaticSpec is the OpenAPI spec kube-apiserver's
// apiextensions server hands its custom resource handler (the
// StaticOpenAPISpec its generic server sets in the APIGroupInfo of
// apiextensions.k8s.io while building that group's type converter, from
// the resources it serves), on which apiextensions-apiserver builds the
// type converter of every CRD. It is nil when that server serves nothing.
// The models are shared: callers must not change them.
func (p *Path) CustomResourceStaticSpec() (map[string]*spec.Schema, error) {
	p.once.Do(func() { p.initErr = p.init() })
	if p.initErr != nil {
		return nil, p.initErr
	}
	return p.crSpec, nil
}

// schemeOf is the scheme of the server that serves group.
func schemeOf(group string) *runtime.Scheme {
	switch serverOf(group) {
	case extensionsServer:
		return apiextensionsapiserver.Scheme
	case aggregatorServer:
		return aggregatorscheme.Scheme
	}
	return legacyscheme.Scheme
}

func serverOf(group string) server {
	switch group {
	case "":
		return legacyServer
	case "apiextensions.k8s.io":
		return extensionsServer
	case "apiregistration.k8s.io":
		return aggregatorServer
	}
	return kubeServer
}

// kindStorage stands for a REST storage of one kind: what kube-apiserver's
// emulation filter asks of a storage is the kind it serves.
type kindStorage struct{ obj runtime.Object }

func (k kindStorage) New() runtime.Object { return k.obj.DeepCopyObject() }
func (k kindStorage) Destroy()            {}

var _ rest.Storage = kindStorage{}

// init finds the served resources per group and builds the type converters as
// genericapiserver.getOpenAPIModels does.
func (p *Path) init() error {
	rc := p.cfg.ResourceConfig
	if rc == nil {
		return fmt.Errorf("updatepath: no API resource configuration")
	}
	evaluator, err := genericapiserver.NewResourceExpirationEvaluatorFromOptions(genericapiserver.ResourceExpirationEvaluatorOptions{
		CurrentVersion:                          p.cfg.Effective.EmulationVersion(),
		Prerelease:                              p.cfg.Effective.BinaryVersion().PreRelease(),
		EmulationForwardCompatible:              p.cfg.EmulationForwardCompatible,
		RuntimeConfigEmulationForwardCompatible: p.cfg.RuntimeConfigEmulationForwardCompatible,
	})
	if err != nil {
		return fmt.Errorf("updatepath: %w", err)
	}
	defs := utilopenapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions)
	namer := openapinamer.NewDefinitionNamer(legacyscheme.Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme)
	openAPIConfig := genericapiserver.DefaultOpenAPIV3Config(defs, namer)

	names := map[server][]string{}
	p.preferred = map[schema.GroupKind]schema.GroupVersionKind{}
	for _, s := range []*runtime.Scheme{legacyscheme.Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme} {
		for _, group := range groups(s) {
			served, err := servedKinds(s, group, rc, evaluator)
			if err != nil {
				return err
			}
			for _, v := range s.PrioritizedVersionsForGroup(group) {
				for _, k := range served[v.Version] {
					obj, err := s.New(v.WithKind(k))
					if err != nil {
						return fmt.Errorf("updatepath: %w", err)
					}
					names[serverOf(group)] = append(names[serverOf(group)], openapiutil.GetCanonicalTypeName(obj))
					gk := schema.GroupKind{Group: group, Kind: k}
					if _, ok := p.preferred[gk]; !ok {
						p.preferred[gk] = v.WithKind(k)
					}
				}
			}
		}
	}
	p.converters = map[server]managedfields.TypeConverter{}
	for srv, ns := range names {
		tc, models, err := typeConverter(openAPIConfig, ns)
		if err != nil {
			return fmt.Errorf("updatepath: type converter: %w", err)
		}
		p.converters[srv] = tc
		if srv == extensionsServer {
			p.crSpec = models
		}
	}
	return nil
}

func typeConverter(cfg *openapicommon.OpenAPIV3Config, names []string) (managedfields.TypeConverter, map[string]*spec.Schema, error) {
	sort.Strings(names)
	models, err := openapibuilder3.BuildOpenAPIDefinitionsForResources(cfg, names...)
	if err != nil {
		return nil, nil, err
	}
	tc, err := managedfields.NewTypeConverter(models, false)
	return tc, models, err
}

// groups lists a scheme's API groups.
func groups(s *runtime.Scheme) []string {
	seen := map[string]bool{}
	var out []string
	for _, gv := range s.PrioritizedVersionsAllGroups() {
		if !seen[gv.Group] {
			seen[gv.Group] = true
			out = append(out, gv.Group)
		}
	}
	return out
}

// servedKinds lists, per version of group, the persisted kinds kube-apiserver
// serves: enabled by the resource configuration and not removed or not yet
// introduced at the emulated version (kube-apiserver's own filter).
func servedKinds(s *runtime.Scheme, group string, rc *serverstorage.ResourceConfig, evaluator genericapiserver.ResourceExpirationEvaluator) (map[string][]string, error) {
	storage := map[string]map[string]rest.Storage{}
	for _, gv := range s.PrioritizedVersionsForGroup(group) {
		for kind := range s.KnownTypes(gv) {
			if strings.HasSuffix(kind, "List") || !s.Recognizes(gv.WithKind(kind+"List")) {
				continue
			}
			plural, _ := meta.UnsafeGuessKindToResource(gv.WithKind(kind))
			if !rc.ResourceEnabled(plural) {
				continue
			}
			obj, err := s.New(gv.WithKind(kind))
			if err != nil {
				return nil, fmt.Errorf("updatepath: %w", err)
			}
			if storage[gv.Version] == nil {
				storage[gv.Version] = map[string]rest.Storage{}
			}
			storage[gv.Version][plural.Resource] = kindStorage{obj}
		}
	}
	if err := evaluator.RemoveUnavailableKinds(group, s, storage, rc); err != nil {
		return nil, fmt.Errorf("updatepath: served kinds of %q: %w", group, err)
	}
	out := map[string][]string{}
	for v, rs := range storage {
		for _, st := range rs {
			gvks, _, err := s.ObjectKinds(st.New())
			if err != nil || len(gvks) == 0 {
				continue
			}
			out[v] = append(out[v], gvks[0].Kind)
		}
		sort.Strings(out[v])
	}
	return out, nil
}
