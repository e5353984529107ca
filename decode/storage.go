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
	"k8s.io/apiserver/pkg/util/compatibility"
	basecompatibility "k8s.io/component-base/compatibility"
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
}

// StorageConfig builds the same storage codecs a kube-apiserver release builds
// (the linked one, or an older one it can emulate), for one storage media type.
type StorageConfig struct {
	factory   *serverstorage.DefaultStorageFactory
	mediaType string
	effective basecompatibility.EffectiveVersion
	release   string // the target kube-apiserver's release, MAJOR.MINOR

	// builtins maps each built-in group/resource to its internal kind.
	builtins map[schema.GroupResource]string

	mu     sync.Mutex
	codecs map[schema.GroupResource]*ResourceCodec
}

// NewStorageConfig returns the storage configuration of kube-apiserver release
// ("" = the linked one; see TargetEffectiveVersion) with --storage-media-type=
// mediaType ("" = protobuf), with its default API enablement.
func NewStorageConfig(release, mediaType string) (*StorageConfig, error) {
	return NewStorageConfigFor(StorageOptions{Release: release, MediaType: mediaType})
}

// StorageOptions are what decides storage versions: the target kube-apiserver's
// release and flags.
type StorageOptions struct {
	Release         string // the kube-apiserver release, MAJOR.MINOR; "" = the linked one
	EmulatedVersion string // its --emulated-version; "" = none (the release itself)
	MediaType       string // --storage-media-type; "" = protobuf
	// ResourceConfig is the API enablement merged with --runtime-config (a
	// version disabled there is not a storage version); nil = the defaults.
	ResourceConfig *serverstorage.ResourceConfig
}

// NewStorageConfigFor returns the storage configuration the target
// kube-apiserver builds from these flags.
func NewStorageConfigFor(o StorageOptions) (*StorageConfig, error) {
	mediaType := o.MediaType
	ev, err := TargetEffectiveVersion(o.Release, o.EmulatedVersion)
	if err != nil {
		return nil, err
	}
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
	release, emulated := targetRelease(o)
	cfg := kubeapiserver.NewStorageFactoryConfigEffectiveVersion(ev)
	cfg.ResourceEncodingOverrides = releaseOverrides(release, emulated, cfg.ResourceEncodingOverrides)
	cfg.APIResourceConfig = o.ResourceConfig
	if cfg.APIResourceConfig == nil {
		cfg.APIResourceConfig = controlplane.DefaultAPIResourceConfigSource()
	}
	cfg.DefaultResourceEncoding.SetEffectiveVersion(ev)
	factory, err := cfg.Complete(etcdOpts).New()
	if err != nil {
		return nil, fmt.Errorf("build kube-apiserver storage factory: %w", err)
	}
	return &StorageConfig{
		factory:   factory,
		mediaType: mediaType,
		effective: ev,
		release:   release,
		builtins:  builtinResources(),
		codecs:    map[schema.GroupResource]*ResourceCodec{},
	}, nil
}

// targetRelease is the release (MAJOR.MINOR) of the target kube-apiserver
// (TargetEffectiveVersion validated o), and whether it emulates an older one.
func targetRelease(o StorageOptions) (string, bool) {
	release := LinkedRelease()
	if v, err := parseMajorMinor(o.Release); o.Release != "" && err == nil {
		release = fmt.Sprintf("%d.%d", v.Major(), v.Minor())
	}
	if v, err := parseMajorMinor(o.EmulatedVersion); o.EmulatedVersion != "" && err == nil {
		return release, fmt.Sprintf("%d.%d", v.Major(), v.Minor()) != release
	}
	return release, false
}

// releaseOverrides are the storage-version overrides of the storage factory
// of the target kube-apiserver. For a previous release, run without
// --emulated-version, whose real kube-apiserver's storage versions were
// generated (releaseStorageVersions, go run ./internal/releasegen), each
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
func releaseOverrides(release string, emulated bool, overrides []schema.GroupVersionResource) []schema.GroupVersionResource {
	if release == LinkedRelease() {
		return overrides
	}
	target, err := parseMajorMinor(release)
	if err != nil {
		return overrides
	}
	kinds := builtinResources()
	byGR := map[schema.GroupResource]schema.GroupVersionResource{}
	for _, o := range overrides {
		if introducedAfter(o.GroupVersion(), kinds[o.GroupResource()], target) {
			continue
		}
		byGR[o.GroupResource()] = o
	}
	versions, ok := releaseStorageVersions[release]
	if !ok || emulated {
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

// ReleaseTypes are the protobuf and JSON fields of an older release's Go types
// (releasegen): Kinds maps a stored kind (schema.GroupVersionKind.String())
// to its type, Types each type to its fields' message types by number, JSON
// to its fields' object types by name.
type ReleaseTypes struct {
	Release string
	Kinds   map[string]string
	Types   map[string]map[int32]string
	// JSON are the same types' JSON members, in the order encoding/json
	// writes them ("*": a map's values).
	JSON map[string][]JSONField
}

// JSONField is one JSON member of a release's Go type (releasegen): its name,
// the type of an object member ("" for any other), and the JSON that type
// writes for a zero value ("" when it leaves a zero value out).
type JSONField struct {
	Name, Type, Zero string
}

// ReleaseTypes returns the protobuf fields of the Go types of the target
// release, when it is a previous one whose types were generated; false for
// the linked release.
func (s *StorageConfig) ReleaseTypes() (ReleaseTypes, bool) {
	kinds, ok := releaseProtoKinds[s.release]
	if !ok {
		return ReleaseTypes{}, false
	}
	return ReleaseTypes{Release: s.release, Kinds: kinds, Types: releaseProtoTypes[s.release], JSON: releaseJSONTypes[s.release]}, true
}

// EffectiveVersion returns the effective version of the real kube-apiserver of
// release v ("" = the linked one), as TargetEffectiveVersion(v, "").
func EffectiveVersion(v string) (basecompatibility.MutableEffectiveVersion, error) {
	return TargetEffectiveVersion(v, "")
}

// TargetEffectiveVersion returns the effective version of kube-apiserver of
// release ("" = the linked one) run with --emulated-version=emulated ("" =
// none), reproduced by the linked kube-apiserver's own compatibility code.
//
// Storage versions follow the minimum compatibility version: a version of a
// resource is stored only once every release from it on can read it. A real
// kube-apiserver of release R emulating E has min compatibility E-1, clamped
// to its own floor R-3. The linked binary emulating an older release clamps
// to its own, newer floor instead (1.37 emulating 1.34: 1.34, where a real
// 1.34 has 1.33, and would store DRA objects as resource.k8s.io/v1 where a
// real 1.34 stores v1beta2). So the minimum compatibility version is set to
// what the target release itself has, after the linked binary has validated
// the emulation.
func TargetEffectiveVersion(release, emulated string) (basecompatibility.MutableEffectiveVersion, error) {
	ev := compatibility.DefaultBuildEffectiveVersion()
	if release == "" && emulated == "" {
		return ev, nil
	}
	binary := ev.BinaryVersion()
	allowed := ev.AllowedEmulationVersionRange()
	rel := version.MajorMinor(binary.Major(), binary.Minor())
	if release != "" {
		parsed, err := parseMajorMinor(release)
		if err != nil {
			return nil, NewReleaseError(release, "--target-version %q: %w (allowed %s)", release, err, TargetRange())
		}
		rel = parsed
	}
	emu := rel
	if emulated != "" {
		parsed, err := parseMajorMinor(emulated)
		if err != nil {
			return nil, fmt.Errorf("--emulated-version %q: %w (allowed %s)", emulated, err, allowed)
		}
		if parsed.GreaterThan(rel) {
			return nil, fmt.Errorf("--emulated-version %s: kube-apiserver %s cannot emulate a newer release", emulated, rel)
		}
		emu = parsed
	}
	if rel.GreaterThan(version.MajorMinor(binary.Major(), binary.Minor())) {
		return nil, NewReleaseError(release, "--target-version %s: newer than the Kubernetes release this tool carries (%d.%d); use a kube-etcd-migrate built with Kubernetes %s (allowed %s)", rel, binary.Major(), binary.Minor(), rel, TargetRange())
	}
	ev.SetEmulationVersion(emu)
	if errs := ev.Validate(); len(errs) > 0 {
		if emulated != "" {
			return nil, fmt.Errorf("--emulated-version %s: kube-apiserver %d.%d cannot emulate it: allowed %s", emu, binary.Major(), binary.Minor(), allowed)
		}
		return nil, NewReleaseError(release, "--target-version %s: kube-apiserver %d.%d cannot reproduce it: allowed %s", rel, binary.Major(), binary.Minor(), TargetRange())
	}
	ev.SetMinCompatibilityVersion(minCompatibility(rel, emu))
	return ev, nil
}

// minCompatibility is kube-apiserver release rel's default
// --min-compatibility-version when it emulates emu: emu-1, but not below its
// floor rel-3 (k8s.io/apiserver's compatibility.DefaultBuildEffectiveVersion;
// its lower bound, 1.31, is below every release the linked one reaches).
func minCompatibility(rel, emu *version.Version) *version.Version {
	floor := version.MajorMinor(rel.Major(), rel.Minor()).SubtractMinor(3)
	minCompat := version.MajorMinor(emu.Major(), emu.Minor()).SubtractMinor(1)
	if minCompat.LessThan(floor) {
		return floor
	}
	return minCompat
}

// TargetRange is the range of --target-version the linked kube-apiserver can
// reproduce, "1.34..1.37".
func TargetRange() string {
	vs := TargetVersions()
	if len(vs) == 0 {
		return "none"
	}
	return vs[0] + ".." + vs[len(vs)-1]
}

// TargetVersions lists the releases --target-version accepts, oldest first:
// the linked release and those its emulation reaches.
func TargetVersions() []string {
	ev := compatibility.DefaultBuildEffectiveVersion()
	bv := ev.BinaryVersion()
	var out []string
	for m := int(bv.Minor()); m >= 0; m-- {
		probe := compatibility.DefaultBuildEffectiveVersion()
		probe.SetEmulationVersion(version.MajorMinor(bv.Major(), uint(m)))
		if len(probe.Validate()) > 0 {
			break
		}
		out = append([]string{fmt.Sprintf("%d.%d", bv.Major(), m)}, out...)
	}
	return out
}

// Effective is the effective version this configuration emulates.
func (s *StorageConfig) Effective() basecompatibility.EffectiveVersion { return s.effective }

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
		return nil, fmt.Errorf("resource %s is not a built-in resource of kube-apiserver %s", gr, LinkedRelease())
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

func parseMajorMinor(v string) (*version.Version, error) {
	parsed, err := version.ParseGeneric(strings.TrimPrefix(v, "v"))
	if err != nil {
		return nil, fmt.Errorf("not a MAJOR.MINOR version")
	}
	return version.MajorMinor(parsed.Major(), parsed.Minor()), nil
}

// LinkedRelease is the Kubernetes release (MAJOR.MINOR) whose kube-apiserver
// code the tool carries, e.g. "1.37", from the linked modules' build version.
func LinkedRelease() string {
	bv := compatibility.DefaultBuildEffectiveVersion().BinaryVersion()
	return fmt.Sprintf("%d.%d", bv.Major(), bv.Minor())
}
