package decode

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	apiserveroptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/controlplane" // registers every built-in group into legacyscheme, as kube-apiserver does
	"k8s.io/kubernetes/pkg/kubeapiserver"

	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiregistrationinstall "k8s.io/kube-aggregator/pkg/apis/apiregistration/install"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationv1beta1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1beta1"

	"kube-etcd-migrate/release"
)

// Media types kube-apiserver stores with.
const (
	MediaTypeProtobuf = "application/vnd.kubernetes.protobuf"
	MediaTypeJSON     = "application/json"
	MediaTypeCBOR     = "application/cbor"
	MediaTypeYAML     = "application/yaml"
)

var (
	// CRDGroupResource and APIServiceGroupResource are stored by the apiextensions
	// and aggregator servers, with their own schemes and JSON codecs.
	CRDGroupResource        = schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}
	APIServiceGroupResource = schema.GroupResource{Group: "apiregistration.k8s.io", Resource: "apiservices"}

	// ExtensionsScheme holds the apiextensions types (CRDs) and ExtensionsCodecs their codecs.
	ExtensionsScheme = runtime.NewScheme()
	ExtensionsCodecs = serializer.NewCodecFactory(ExtensionsScheme)
	// AggregatorScheme holds the apiregistration types (APIServices).
	AggregatorScheme = runtime.NewScheme()
	AggregatorCodecs = serializer.NewCodecFactory(AggregatorScheme)
)

func init() {
	apiextensionsinstall.Install(ExtensionsScheme)
	apiregistrationinstall.Install(AggregatorScheme)
}

// ResourceCodec is what kube-apiserver's storage layer uses for one resource: the
// codec that decodes any stored version into the internal version (with defaulting)
// and encodes into the storage version and media type.
type ResourceCodec struct {
	GroupResource  schema.GroupResource
	Kind           string // internal kind, e.g. "Deployment"
	Codec          runtime.Codec
	StorageVersion schema.GroupVersion
	MediaType      string
	// Scheme is the scheme the codec's types live in (legacyscheme, apiextensions or aggregator).
	Scheme *runtime.Scheme
	// Codecs is the codec factory of Scheme.
	Codecs serializer.CodecFactory

	keep *keeper // nil: Codec does not decode through one
}

// StorageConfig builds the same storage codecs a kube-apiserver release builds
// (the linked one, or an older one it can emulate), for one storage media type.
type StorageConfig struct {
	factory   *serverstorage.DefaultStorageFactory
	mediaType string
	release   release.Release // the target kube-apiserver's
	// types and hasTypes: release.TypesOf the target release, found once
	// (ReleaseTypes is asked for every object rewritten).
	types    release.Types
	hasTypes bool

	// builtins maps each built-in group/resource to its internal kind.
	builtins map[schema.GroupResource]string

	mu     sync.Mutex
	codecs map[schema.GroupResource]*ResourceCodec

	keep *keeper // what its built-in codecs decode through
}

// NewStorageConfig returns the storage configuration of the linked
// kube-apiserver with --storage-media-type=mediaType ("" = protobuf), with its
// default API enablement: what decoding reads with.
func NewStorageConfig(mediaType string) (*StorageConfig, error) {
	return NewStorageConfigFor(StorageOptions{MediaType: mediaType})
}

// StorageOptions are what decides storage versions: the target kube-apiserver's
// release and flags.
type StorageOptions struct {
	// Release is the kube-apiserver release, with its --emulated-version and
	// effective version; the zero Release is the linked one.
	Release   release.Release
	MediaType string // --storage-media-type; "" = protobuf
	// ResourceConfig is the API enablement merged with --runtime-config (a
	// version disabled there is not a storage version); nil = the defaults.
	ResourceConfig *serverstorage.ResourceConfig
}

// NewStorageConfigFor returns the storage configuration the target
// kube-apiserver builds from these flags.
func NewStorageConfigFor(o StorageOptions) (*StorageConfig, error) {
	mediaType := o.MediaType
	if mediaType == "" {
		mediaType = MediaTypeProtobuf
	}
	switch mediaType {
	case MediaTypeProtobuf, MediaTypeJSON, MediaTypeYAML:
	default:
		return nil, &MediaTypeError{MediaType: mediaType}
	}
	etcdOpts := apiserveroptions.NewEtcdOptions(storagebackend.NewDefaultConfig("/registry", nil))
	etcdOpts.DefaultStorageMediaType = mediaType
	ev := o.Release.Effective()
	cfg := kubeapiserver.NewStorageFactoryConfigEffectiveVersion(ev)
	cfg.ResourceEncodingOverrides = releaseOverrides(o.Release, cfg.ResourceEncodingOverrides)
	cfg.APIResourceConfig = o.ResourceConfig
	if cfg.APIResourceConfig == nil {
		cfg.APIResourceConfig = controlplane.DefaultAPIResourceConfigSource()
	}
	cfg.DefaultResourceEncoding.SetEffectiveVersion(ev)
	factory, err := cfg.Complete(etcdOpts).New()
	if err != nil {
		return nil, fmt.Errorf("build kube-apiserver storage factory: %w", err)
	}
	builtins := builtinResources()
	keep := newKeeper()
	keep.install(factory, groupsOf(builtins))
	types, hasTypes := release.TypesOf(o.Release.String())
	return &StorageConfig{
		types:     types,
		hasTypes:  hasTypes,
		factory:   factory,
		mediaType: mediaType,
		release:   o.Release,
		builtins:  builtins,
		codecs:    map[schema.GroupResource]*ResourceCodec{},
		keep:      keep,
	}, nil
}

// releaseOverrides are the storage-version overrides of the storage factory
// of the target kube-apiserver. For a previous release, run without
// --emulated-version, whose real kube-apiserver's storage versions were
// generated (release.StorageVersions, go run ./internal/build/releasegen), each
// built-in resource is stored in the version that release stores it in:
// the linked kube-apiserver's emulation alone applies the linked release's
// overrides whatever the emulated version (1.37 emulating 1.36 stores
// DeviceTaintRules as resource.k8s.io/v1beta2, 1.36 as v1alpha3). A
// resource stored in another group's version (cohabitation) or in a version
// the linked release no longer has keeps what the linked code computes.
//
// Without generated versions, an override of the linked release to a
// version introduced after the target release (by the version's own
// lifecycle, APILifecycleIntroduced) is dropped: that release has no such
// version and could not read what it stores (1.37's DeviceTaintRules
// override to v1beta2, introduced in 1.36, for a 1.35 target).
func releaseOverrides(rel release.Release, overrides []schema.GroupVersionResource) []schema.GroupVersionResource {
	if rel.IsLinked() {
		return overrides
	}
	target := rel.Version()
	kinds := builtinResources()
	byGR := map[schema.GroupResource]schema.GroupVersionResource{}
	for _, o := range overrides {
		if introducedAfter(o.GroupVersion(), kinds[o.GroupResource()], target) {
			continue
		}
		byGR[o.GroupResource()] = o
	}
	versions, ok := release.StorageVersions(rel.String())
	if !ok || rel.Emulates() {
		versions = nil
	}
	for resource, version := range versions {
		gr := schema.ParseGroupResource(resource)
		gv, err := schema.ParseGroupVersion(version)
		if err != nil || gv.Group != gr.Group || !legacyscheme.Scheme.IsVersionRegistered(gv) {
			continue
		}
		byGR[gr] = gv.WithResource(gr.Resource)
	}
	out := make([]schema.GroupVersionResource, 0, len(byGR))
	for _, o := range byGR {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// introducedAfter reports whether kind in gv was introduced after release,
// by its prerelease lifecycle (false for a version without one: GA).
func introducedAfter(gv schema.GroupVersion, kind string, release *version.Version) bool {
	if kind == "" {
		return false
	}
	obj, err := legacyscheme.Scheme.New(gv.WithKind(kind))
	if err != nil {
		return false
	}
	lc, ok := obj.(interface{ APILifecycleIntroduced() (int, int) })
	if !ok {
		return false
	}
	major, minor := lc.APILifecycleIntroduced()
	return version.MajorMinor(uint(major), uint(minor)).GreaterThan(release)
}

// ReleaseTypes returns the protobuf and JSON fields of the Go types of the
// target release, when it is a previous one whose types were generated
// (release.TypesOf); false for the linked release.
func (s *StorageConfig) ReleaseTypes() (release.Types, bool) {
	return s.types, s.hasTypes
}

// MediaType is the storage media type for built-in resources.
func (s *StorageConfig) MediaType() string { return s.mediaType }

// ResourcePrefix is the etcd key segment kube-apiserver uses for a resource
// (without the leading prefix), e.g. "minions" for nodes.
func (s *StorageConfig) ResourcePrefix(gr schema.GroupResource) string {
	switch gr {
	case CRDGroupResource, APIServiceGroupResource:
		return gr.Group + "/" + gr.Resource
	}
	return s.factory.ResourcePrefix(gr)
}

// BuiltinResources lists the built-in group/resources known to the scheme, sorted.
func (s *StorageConfig) BuiltinResources() []schema.GroupResource {
	out := make([]schema.GroupResource, 0, len(s.builtins)+2)
	for gr := range s.builtins {
		out = append(out, gr)
	}
	out = append(out, CRDGroupResource, APIServiceGroupResource)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// IsBuiltin reports whether gr is a built-in (non custom) resource.
func (s *StorageConfig) IsBuiltin(gr schema.GroupResource) bool {
	if gr == CRDGroupResource || gr == APIServiceGroupResource {
		return true
	}
	_, ok := s.builtins[gr]
	return ok
}

// Codec returns the storage codec kube-apiserver uses for gr.
func (s *StorageConfig) Codec(gr schema.GroupResource) (*ResourceCodec, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.codecs[gr]; ok {
		return c, nil
	}
	c, err := s.newCodec(gr)
	if err != nil {
		return nil, err
	}
	s.codecs[gr] = c
	return c, nil
}

func (s *StorageConfig) newCodec(gr schema.GroupResource) (*ResourceCodec, error) {
	switch gr {
	case CRDGroupResource:
		// pkg/controlplane/apiserver/apiextensions.go: LegacyCodec(v1beta1, v1), JSON,
		// "prefer the more compact serialization (v1beta1) for storage".
		return &ResourceCodec{
			GroupResource:  gr,
			Kind:           "CustomResourceDefinition",
			Codec:          ExtensionsCodecs.LegacyCodec(apiextensionsv1beta1.SchemeGroupVersion, apiextensionsv1.SchemeGroupVersion),
			StorageVersion: apiextensionsv1beta1.SchemeGroupVersion,
			MediaType:      MediaTypeJSON,
			Scheme:         ExtensionsScheme,
			Codecs:         ExtensionsCodecs,
		}, nil
	case APIServiceGroupResource:
		// pkg/controlplane/apiserver/aggregator.go: LegacyCodec(v1, v1beta1), JSON.
		return &ResourceCodec{
			GroupResource:  gr,
			Kind:           "APIService",
			Codec:          AggregatorCodecs.LegacyCodec(apiregistrationv1.SchemeGroupVersion, apiregistrationv1beta1.SchemeGroupVersion),
			StorageVersion: apiregistrationv1.SchemeGroupVersion,
			MediaType:      MediaTypeJSON,
			Scheme:         AggregatorScheme,
			Codecs:         AggregatorCodecs,
		}, nil
	}
	kind, ok := s.builtins[gr]
	if !ok {
		// Raw-storage keys (service range allocations, master leases): the apiserver
		// asks its storage factory for these group/resources with the stored kind.
		kind = KindFor(gr)
		ok = kind != ""
	}
	if !ok {
		return nil, fmt.Errorf("resource %s is not a built-in resource of kube-apiserver %s", gr, release.Linked())
	}
	example, err := legacyscheme.Scheme.New(schema.GroupVersionKind{Group: gr.Group, Version: runtime.APIVersionInternal, Kind: kind})
	if err != nil {
		return nil, fmt.Errorf("resource %s: %w", gr, err)
	}
	cfg, err := s.factory.NewConfig(gr, example)
	if err != nil {
		return nil, fmt.Errorf("resource %s: storage config: %w", gr, err)
	}
	gv, err := storageVersionOf(cfg.EncodeVersioner, gr, kind)
	if err != nil {
		return nil, err
	}
	return &ResourceCodec{
		GroupResource:  gr,
		Kind:           kind,
		Codec:          cfg.Codec,
		StorageVersion: gv,
		MediaType:      s.mediaType,
		Scheme:         legacyscheme.Scheme,
		Codecs:         legacyscheme.Codecs,
		keep:           s.keep,
	}, nil
}

// storageVersionOf asks the encode versioner which version it encodes kind into.
func storageVersionOf(v runtime.GroupVersioner, gr schema.GroupResource, kind string) (schema.GroupVersion, error) {
	var candidates []schema.GroupVersionKind
	for _, gv := range legacyscheme.Scheme.PrioritizedVersionsAllGroups() {
		gvk := gv.WithKind(kind)
		if legacyscheme.Scheme.Recognizes(gvk) {
			candidates = append(candidates, gvk)
		}
	}
	target, ok := v.KindForGroupVersionKinds(candidates)
	if !ok {
		return schema.GroupVersion{}, fmt.Errorf("resource %s: no storage version for kind %s", gr, kind)
	}
	return target.GroupVersion(), nil
}

// groupsOf returns the groups of resources, each once.
func groupsOf(resources map[schema.GroupResource]string) []string {
	seen := map[string]bool{}
	var out []string
	for gr := range resources {
		if !seen[gr.Group] {
			seen[gr.Group] = true
			out = append(out, gr.Group)
		}
	}
	sort.Strings(out)
	return out
}

// builtinResources derives every persisted built-in resource from the scheme: each
// kind registered in an internal version that has a matching "List" kind (the
// apiserver's REST storage lists what it stores), named as kube-apiserver names it.
func builtinResources() map[schema.GroupResource]string {
	out := map[schema.GroupResource]string{}
	for gvk := range legacyscheme.Scheme.AllKnownTypes() {
		if gvk.Version != runtime.APIVersionInternal || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		if !legacyscheme.Scheme.Recognizes(gvk.GroupVersion().WithKind(gvk.Kind + "List")) {
			continue
		}
		plural, _ := meta.UnsafeGuessKindToResource(gvk.GroupVersion().WithKind(gvk.Kind))
		gr := schema.GroupResource{Group: gvk.Group, Resource: plural.Resource}
		out[gr] = gvk.Kind
	}
	return out
}
