package customresource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiextensionsoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"kube-etcd-migrate/internal/jsondoc"
	"kube-etcd-migrate/updatepath"
)

// DefaultHTTPTimeout bounds one conversion webhook call when Options.HTTPTimeout is 0.
const DefaultHTTPTimeout = 30 * time.Second

// Media types reported in StoredInfo.MediaType.
const (
	MediaTypeJSON = "json"
	MediaTypeCBOR = "cbor"
)

// selfDescribedCBOR is the tag kube-apiserver's CBOR serializer puts in front of every
// value (cbor.serializer.RecognizesData).
var selfDescribedCBOR = []byte{0xd9, 0xd9, 0xf7}

// Options tune NewCodec.
type Options struct {
	// WebhookURLs maps "namespace/name" of a conversion webhook Service to an address
	// reachable offline (ParseWebhookAddress: "https://host:port/path" or
	// "host:port/path", the path optional), which overrides ServiceEndpoints. The
	// request goes to its path, or to the path of the CRD's service reference when it
	// has none, and TLS still verifies the serving certificate against the CRD's
	// caBundle for the name <name>.<namespace>.svc, exactly as kube-apiserver does (it
	// dials the resolved endpoint with that server name), so a pod's address or a
	// kubectl port-forward to the service works. URL-configured webhooks are called
	// directly.
	WebhookURLs map[string]string
	// ServiceEndpoints resolves the Service of a conversion webhook to its ready
	// endpoints (serviceresolver, over the Services and EndpointSlices in etcd) when
	// WebhookURLs has no address for it; the first endpoint that completes a TLS
	// handshake is called. nil: only WebhookURLs.
	ServiceEndpoints ServiceEndpoints
	// WebhookHint, given "namespace/name" of a webhook Service, says how the
	// operator gives an address for it; it ends the error when the Service cannot
	// be reached.
	WebhookHint func(service string) string
	// HTTPTimeout bounds each conversion webhook call (0: DefaultHTTPTimeout).
	HTTPTimeout time.Duration
	// StaticOpenAPISpec gives the static OpenAPI spec kube-apiserver's
	// apiextensions server builds its CRDs' type converters on
	// (updatepath.Path.CustomResourceStaticSpec). NoOpUpdate calls it once,
	// on first use, and fails without it.
	StaticOpenAPISpec func() (map[string]*spec.Schema, error)
	// Manager is the field manager name NoOpUpdate updates as; a no-op
	// update changes no field, so no entry is ever added under it.
	Manager string
	// FullFieldManager runs the field manager on every object
	// (--full-field-manager). Without it, a CRD without a conversion webhook
	// skips it for objects whose apiVersion and managedFields it was seen to
	// leave unchanged (updatepath.Memo, where this is proven exact).
	FullFieldManager bool
	// Memo is where the shortcut remembers its verdicts, shared by every
	// CRD's codec and the built-ins (updatepath.Path.Memo) so that their
	// keys share one budget; nil: the codec's own.
	Memo *updatepath.Memo
	// CheckShortcut runs both, the shortcut and the full field manager, and
	// makes an object on which they differ an error
	// (updatepath.CheckShortcutEnv, a test hook).
	CheckShortcut bool
}

// StoredInfo describes a stored value.
type StoredInfo struct {
	GVK       schema.GroupVersionKind
	MediaType string // MediaTypeJSON or MediaTypeCBOR
}

// Codec reads and writes the objects of one CRD as kube-apiserver does.
// It is safe for concurrent use.
type Codec struct {
	group, kind           string
	name                  string
	storageVersion        string
	versions              map[string]bool // every spec.versions[].name (crConverter.validVersions)
	schemas               map[string]*structuralschema.Structural
	preserveUnknownFields bool
	storage               runtime.Codec
	mediaType             string            // what storage encodes to: MediaTypeJSON or MediaTypeCBOR
	webhook               *webhookConverter // nil for the None strategy

	// NoOpUpdate's configuration and its field manager's parts, built on first use.
	crd         *apiextensionsv1.CustomResourceDefinition // defaulted as kube-apiserver reads it
	resolver    *offlineServiceResolver                   // the webhook's Service, for both converters
	httpTimeout time.Duration
	staticSpec  func() (map[string]*spec.Schema, error)
	manager     string
	noOp        noOpUpdateState
	full        bool             // Options.FullFieldManager
	check       bool             // Options.CheckShortcut
	memo        *updatepath.Memo // managedFields NoOpUpdate leaves unchanged (Options.Memo)
}

// NewCodec builds the codec of crd's custom resources, as getOrCreateServingInfoFor
// builds the storage of a CRD.
func NewCodec(crd *apiextensionsv1.CustomResourceDefinition, opts Options) (*Codec, error) {
	if crd == nil {
		return nil, errors.New("customresource: nil CRD")
	}
	crd = crd.DeepCopy()
	if err := overrideWebhookPath(crd, opts.WebhookURLs); err != nil {
		return nil, err
	}
	storageVersion, err := apiextensionshelpers.GetCRDStorageVersion(crd)
	if err != nil {
		return nil, fmt.Errorf("CRD %s: %w", crd.Name, err)
	}
	// getOrCreateServingInfoFor uses status.acceptedNames.kind (and refuses to serve the
	// CRD while it is empty). Offline, a CRD read from etcd may not be established yet:
	// fall back to spec.names.kind, which is what acceptedNames becomes.
	kind := crd.Status.AcceptedNames.Kind
	if kind == "" {
		kind = crd.Spec.Names.Kind
	}
	if kind == "" {
		return nil, fmt.Errorf("CRD %s: no kind in status.acceptedNames or spec.names", crd.Name)
	}
	c := &Codec{
		group:                 crd.Spec.Group,
		kind:                  kind,
		name:                  crd.Name,
		storageVersion:        storageVersion,
		versions:              map[string]bool{},
		schemas:               map[string]*structuralschema.Structural{},
		preserveUnknownFields: crd.Spec.PreserveUnknownFields,
		crd:                   crd,
		resolver: &offlineServiceResolver{
			crd:       crd.Name,
			urls:      opts.WebhookURLs,
			endpoints: opts.ServiceEndpoints,
			hint:      opts.WebhookHint,
		},
		httpTimeout: opts.HTTPTimeout,
		staticSpec:  opts.StaticOpenAPISpec,
		manager:     opts.Manager,
		full:        opts.FullFieldManager,
		check:       opts.CheckShortcut,
		memo:        opts.Memo,
	}
	if c.httpTimeout <= 0 {
		c.httpTimeout = DefaultHTTPTimeout
	}
	if c.memo == nil {
		c.memo = &updatepath.Memo{}
	}
	// The CRD as kube-apiserver's decoder hands it to the CRD handler.
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(c.crd)

	// Structural schemas per version: getOrCreateServingInfoFor.
	for _, v := range crd.Spec.Versions {
		c.versions[v.Name] = true
		val, err := apiextensionshelpers.GetSchemaForVersion(crd, v.Name)
		if err != nil {
			return nil, fmt.Errorf("CRD %s version %s: %w", crd.Name, v.Name, err)
		}
		if val == nil {
			continue
		}
		internalValidation := &apiextensionsinternal.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, internalValidation, nil); err != nil {
			return nil, fmt.Errorf("CRD %s version %s: converting the schema to the internal version: %w", crd.Name, v.Name, err)
		}
		s, err := structuralschema.NewStructural(internalValidation.OpenAPIV3Schema)
		if !crd.Spec.PreserveUnknownFields && err != nil {
			// The apiserver refuses to serve such a CRD ("the server could not properly
			// serve the CR schema"); so do we.
			return nil, fmt.Errorf("CRD %s version %s: schema is not structural: %w", crd.Name, v.Name, err)
		}
		if !crd.Spec.PreserveUnknownFields {
			s = s.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(s); err != nil {
				return nil, fmt.Errorf("CRD %s version %s: pruning defaults: %w", crd.Name, v.Name, err)
			}
		}
		c.schemas[v.Name] = s
	}

	// The storage serializer, as kube-apiserver builds it for every CRD.
	c.storage, c.mediaType, err = storageSerializer()
	if err != nil {
		return nil, fmt.Errorf("CRD %s: %w", crd.Name, err)
	}

	// Converter: conversion.CRConverterFactory.NewConverter.
	strategy := apiextensionsv1.NoneConverter
	if crd.Spec.Conversion != nil && crd.Spec.Conversion.Strategy != "" {
		strategy = crd.Spec.Conversion.Strategy
	}
	switch strategy {
	case apiextensionsv1.NoneConverter:
	case apiextensionsv1.WebhookConverter:
		if cc := crd.Spec.Conversion.Webhook; cc != nil && cc.ClientConfig != nil {
			c.resolver.caBundle = cc.ClientConfig.CABundle
		}
		c.webhook, err = newWebhookConverter(crd, c.resolver, opts)
		if err != nil {
			return nil, fmt.Errorf("CRD %s: conversion webhook: %w", crd.Name, err)
		}
	default:
		return nil, fmt.Errorf("unknown conversion strategy %q for CRD %s", strategy, crd.Name)
	}
	return c, nil
}

// overrideWebhookPath puts the path of the address given for the Service of
// crd's conversion webhook (Options.WebhookURLs), if it has one, in place of
// the service reference's path: both converters (the tool's and the CR
// converter of NoOpUpdate) build their client from the CRD.
func overrideWebhookPath(crd *apiextensionsv1.CustomResourceDefinition, urls map[string]string) error {
	conv := crd.Spec.Conversion
	if conv == nil || conv.Webhook == nil || conv.Webhook.ClientConfig == nil || conv.Webhook.ClientConfig.Service == nil {
		return nil
	}
	svc := conv.Webhook.ClientConfig.Service
	key := svc.Namespace + "/" + svc.Name
	addr, ok := urls[key]
	if !ok {
		return nil
	}
	_, path, err := ParseWebhookAddress(addr)
	if err != nil {
		return fmt.Errorf("CRD %s: address for conversion webhook service %s: %w", crd.Name, key, err)
	}
	if path != "" {
		svc.Path = &path
	}
	return nil
}

// storageSerializer is the serializer of custom resources' storage config, taken from
// apiextensions-apiserver's own options.NewCRDRESTOptionsGetter (which kube-apiserver
// calls with its etcd options; only the codec is used here): it encodes with
// UnstructuredJSONScheme, or CBOR when the process's CBORServingAndStorage gate is on
// (alpha in 1.36 and 1.37; apiserverconfig.Config.Apply sets the gates as
// kube-apiserver does), and decodes CBOR and JSON whatever the gate. The media type it
// writes is read from an encoded probe object, not derived from the gate a second time.
func storageSerializer() (runtime.Codec, string, error) {
	etcd := genericoptions.NewEtcdOptions(storagebackend.NewDefaultConfig("", nil))
	getter := apiextensionsoptions.NewCRDRESTOptionsGetter(*etcd, nil, nil)
	opts, err := getter.GetRESTOptions(schema.GroupResource{}, nil)
	if err != nil {
		return nil, "", fmt.Errorf("custom resource storage config: %w", err)
	}
	codec := opts.StorageConfig.Codec
	if codec == nil {
		return nil, "", errors.New("custom resource storage config has no codec")
	}
	probe := &unstructured.Unstructured{Object: map[string]interface{}{"apiVersion": "probe.invalid/v1", "kind": "Probe"}}
	var buf bytes.Buffer
	if err := codec.Encode(probe, &buf); err != nil {
		return nil, "", fmt.Errorf("custom resource storage codec: %w", err)
	}
	mt := MediaTypeJSON
	if bytes.HasPrefix(buf.Bytes(), selfDescribedCBOR) {
		mt = MediaTypeCBOR
	}
	return codec, mt, nil
}

// StorageMediaType is the media type kube-apiserver, configured as this process's
// feature gates say, writes custom resources in: MediaTypeJSON, or MediaTypeCBOR with
// CBORServingAndStorage on.
func StorageMediaType() (string, error) {
	_, mt, err := storageSerializer()
	return mt, err
}

// MediaType is the media type objects are written in: MediaTypeJSON, or MediaTypeCBOR
// when the CBORServingAndStorage gate is on.
func (c *Codec) MediaType() string { return c.mediaType }

// StorageVersion is the version objects are written in (spec.versions[].storage).
func (c *Codec) StorageVersion() string { return c.storageVersion }

// StorageGVK is the group/version/kind objects are written in.
func (c *Codec) StorageGVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: c.group, Version: c.storageVersion, Kind: c.kind}
}

// Decode is the apiserver's read path for a stored value, stopping before the
// conversion to a request version: it decodes JSON or CBOR, checks that the stored
// group/kind are the CRD's and the stored version is one of spec.versions (served or
// not: the apiserver reads any version it knows), prunes unknown fields in the stored
// version's schema (unless preserveUnknownFields), coerces metadata dropping malformed
// fields, sets metadata.generation=1 when missing, and applies the stored version's
// structural defaults. The object is returned in the stored version.
func (c *Codec) Decode(plaintext []byte) (*unstructured.Unstructured, StoredInfo, error) {
	u, info, err := c.decodeRaw(plaintext)
	if err != nil {
		return nil, info, err
	}
	// schemaCoercingDecoder in crdConversionRESTOptionsGetter: dropInvalidMetadata and
	// repairGeneration are set on the storage read path only.
	if err := c.coerce(u, true, true); err != nil {
		return nil, info, fmt.Errorf("%s: %w", info.GVK, err)
	}
	// unstructuredDefaulter.Default, run by the versioning codec before conversion, in
	// the version the object was decoded in.
	structuraldefaulting.Default(u.Object, c.schemas[info.GVK.Version])
	return u, info, nil
}

// decodeRaw decodes the stored bytes with the storage decoder and checks the GVK,
// without pruning, coercion or defaulting.
func (c *Codec) decodeRaw(plaintext []byte) (*unstructured.Unstructured, StoredInfo, error) {
	info := StoredInfo{MediaType: MediaTypeJSON}
	if bytes.HasPrefix(plaintext, selfDescribedCBOR) {
		info.MediaType = MediaTypeCBOR
	}
	u := &unstructured.Unstructured{}
	obj, _, err := c.storage.Decode(plaintext, nil, u)
	if err != nil {
		return nil, info, fmt.Errorf("decoding %s custom resource of %s: %w", info.MediaType, c.name, sanitizeDecodeError(err))
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.Object == nil {
		return nil, info, fmt.Errorf("decoding %s custom resource of %s: not a JSON object", info.MediaType, c.name)
	}
	apiVersion, _, err := unstructured.NestedString(u.Object, "apiVersion")
	if err != nil {
		return nil, info, fmt.Errorf("custom resource of %s: apiVersion: %w", c.name, err)
	}
	kind, _, err := unstructured.NestedString(u.Object, "kind")
	if err != nil {
		return nil, info, fmt.Errorf("custom resource of %s: kind: %w", c.name, err)
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, info, fmt.Errorf("custom resource of %s: %w", c.name, err)
	}
	info.GVK = gv.WithKind(kind)
	if gv.Group != c.group || kind != c.kind {
		return nil, info, fmt.Errorf("stored object is %s, not a %s.%s of CRD %s", info.GVK, c.kind, c.group, c.name)
	}
	// crConverter.ConvertToVersion refuses to convert from a version that is not in
	// spec.versions ("request to convert CR from an invalid group/version").
	if !c.versions[gv.Version] {
		return nil, info, fmt.Errorf("stored version %s is not in spec.versions of CRD %s: the apiserver cannot read it", info.GVK.GroupVersion(), c.name)
	}
	if _, ok := u.Object["metadata"].(map[string]interface{}); !ok {
		// The apiserver would dereference a nil ObjectMeta here (repairGeneration).
		return nil, info, fmt.Errorf("%s: stored object has no metadata object", info.GVK)
	}
	return u, info, nil
}

// sanitizeDecodeError drops the serializers' "missing kind" messages, which quote the
// whole value (it may hold secrets).
func sanitizeDecodeError(err error) error {
	switch {
	case runtime.IsMissingKind(err):
		return errors.New("object 'Kind' is missing")
	case runtime.IsMissingVersion(err):
		return errors.New("object 'apiVersion' is missing")
	}
	return err
}

// coerce reproduces unstructuredSchemaCoercer.apply (customresource_handler.go): ObjectMeta
// round-trip through metav1.ObjectMeta (dropping malformed fields on the storage read
// path), pruning and removal of non-nullable nulls without default in the object's
// version schema, objectmeta.Coerce of embedded resources, and the generation repair.
func (c *Codec) coerce(u *unstructured.Unstructured, dropInvalidMetadata, repairGeneration bool) error {
	kind, foundKind, err := unstructured.NestedString(u.Object, "kind")
	if err != nil {
		return err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(u.Object, "apiVersion")
	if err != nil {
		return err
	}
	objectMeta, foundObjectMeta, _, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{
		DropMalformedFields: dropInvalidMetadata,
	})
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return err
	}
	if gv.Group == c.group && kind == c.kind {
		s := c.schemas[gv.Version]
		if !c.preserveUnknownFields {
			structuralpruning.PruneWithOptions(u.Object, s, true, structuralschema.UnknownFieldPathOptions{})
			structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, s)
		}
		if ferr, _ := schemaobjectmeta.CoerceWithOptions(nil, u.Object, s, false, schemaobjectmeta.CoerceOptions{
			DropInvalidFields: dropInvalidMetadata,
		}); ferr != nil {
			return ferr
		}
		// "fixup missing generation in very old CRs"
		if repairGeneration && objectMeta != nil && objectMeta.Generation == 0 {
			objectMeta.Generation = 1
		}
	}
	// restore meta fields, starting clean
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if foundObjectMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, objectMeta); err != nil {
			return err
		}
	}
	return nil
}

// Encode is the apiserver's write path for obj (typically what Decode returned):
// versioner.PrepareObjectForStorage (clears metadata.resourceVersion and selfLink), then
// the storage codec: when obj is not already in the storage version, conversion (None:
// only apiVersion changes; Webhook: a ConversionReview) followed by pruning and metadata
// coercion in the storage version's schema (schemaCoercingConverter), then the storage
// serializer: UnstructuredJSONScheme (encoding/json of the map: sorted keys, HTML-safe
// escaping, trailing newline), or CBOR with the CBORServingAndStorage gate on. An object already in the storage version is serialised as is, as
// versioning.codec.doEncode short-circuits. obj is not modified.
func (c *Codec) Encode(ctx context.Context, obj *unstructured.Unstructured) ([]byte, error) {
	value, _, err := c.EncodeDropping(ctx, obj)
	return value, err
}

// EncodeDropping is Encode, also naming the fields the write drops: the paths
// (never the values) that obj, converted to the storage version, has and the
// storage version's schema prunes (schemaCoercingConverter after the
// conversion), e.g. a field of an old version's schema that the storage
// version's lacks under conversion None. Array indices are written [*]; the
// paths are sorted, each once. kube-apiserver's next write of the object
// drops the same fields. An object already in the storage version drops
// nothing.
func (c *Codec) EncodeDropping(ctx context.Context, obj *unstructured.Unstructured) ([]byte, []string, error) {
	if obj == nil || obj.Object == nil {
		return nil, nil, errors.New("customresource: nil object")
	}
	from := obj.GroupVersionKind()
	to := c.StorageGVK()
	to.Kind = from.Kind
	if from.Version == "" {
		// versioning.codec would encode it untouched; an object without apiVersion
		// cannot be read back, so refuse.
		return nil, nil, fmt.Errorf("custom resource of %s has no apiVersion", c.name)
	}
	if from.Group != to.Group {
		return nil, nil, fmt.Errorf("%s is not in group %s of CRD %s", from, c.group, c.name)
	}
	var u *unstructured.Unstructured
	if from != to {
		// The conversion and the coercion after it change the object.
		u = obj.DeepCopy()
	} else {
		// Only metadata's two fields below change before the serializer,
		// which writes nothing: a copy of the two maps on the way suffices.
		u = shallowCopy(obj)
	}
	u.SetResourceVersion("")
	u.SetSelfLink("")
	var dropped []string
	if from != to {
		converted, err := c.convert(ctx, u, to.GroupVersion())
		if err != nil {
			return nil, nil, err
		}
		before := converted.DeepCopy()
		// schemaCoercingConverter.ConvertToVersion: coercer without dropInvalidMetadata.
		if err := c.coerce(converted, false, false); err != nil {
			return nil, nil, fmt.Errorf("%s after conversion to %s: %w", from, to.GroupVersion(), err)
		}
		d := jsondoc.Diff(before.Object, converted.Object)
		dropped = fieldPaths(append(d.Removed, d.Changed...))
		u = converted
	}
	var buf bytes.Buffer
	if err := c.storage.Encode(u, &buf); err != nil {
		return nil, nil, fmt.Errorf("encoding %s: %w", u.GroupVersionKind(), err)
	}
	return buf.Bytes(), dropped, nil
}

// shallowCopy copies obj's top-level map and its metadata map; every other
// value is shared with obj.
func shallowCopy(obj *unstructured.Unstructured) *unstructured.Unstructured {
	out := make(map[string]interface{}, len(obj.Object))
	for k, v := range obj.Object {
		out[k] = v
	}
	if md, ok := obj.Object["metadata"].(map[string]interface{}); ok {
		cp := make(map[string]interface{}, len(md))
		for k, v := range md {
			cp[k] = v
		}
		out["metadata"] = cp
	}
	return &unstructured.Unstructured{Object: out}
}

// fieldPaths writes the array indices of diffValues' paths as [*], sorted,
// each once: the same field of every element is one field.
func fieldPaths(paths []string) []string {
	for i, p := range paths {
		paths[i] = arrayIndex.ReplaceAllString(p, "[*]")
	}
	return dedupSorted(paths)
}

var arrayIndex = regexp.MustCompile(`\[[0-9]+\]`)

// convert is crConverter.ConvertToVersion for one object (safeConverterWrapper's deep
// copy is done by the caller).
func (c *Codec) convert(ctx context.Context, in *unstructured.Unstructured, to schema.GroupVersion) (*unstructured.Unstructured, error) {
	from := in.GroupVersionKind()
	if !c.versions[to.Version] {
		return nil, fmt.Errorf("request to convert CR to an invalid group/version: %s", to)
	}
	if !c.versions[from.Version] {
		return nil, fmt.Errorf("request to convert CR from an invalid group/version: %s", from.GroupVersion())
	}
	if c.webhook == nil || isEmptyUnstructuredObject(in) {
		// nopConverter.Convert (also the webhook converter's shortcut for empty objects).
		in.SetGroupVersionKind(to.WithKind(from.Kind))
		return in, nil
	}
	out, err := c.webhook.convert(ctx, in, to)
	if err != nil {
		if down := c.webhookDown(ctx, err); down != nil {
			return nil, down
		}
	}
	return out, err
}

// isEmptyUnstructuredObject is conversion.isEmptyUnstructuredObject.
func isEmptyUnstructuredObject(u *unstructured.Unstructured) bool {
	if len(u.Object) != 2 {
		return false
	}
	_, k := u.Object["kind"]
	_, v := u.Object["apiVersion"]
	return k && v
}

// StoredVersionsTrimmable returns the versions of crd's status.storedVersions other than
// the storage version, in their order. Once every object has been rewritten in the
// storage version they can be removed from status.storedVersions (the apiserver never
// does it itself), which is what allows removing a version from the CRD.
func StoredVersionsTrimmable(crd *apiextensionsv1.CustomResourceDefinition) []string {
	if crd == nil {
		return nil
	}
	storage, err := apiextensionshelpers.GetCRDStorageVersion(crd)
	if err != nil {
		storage = ""
	}
	var out []string
	for _, v := range crd.Status.StoredVersions {
		if v != storage {
			out = append(out, v)
		}
	}
	return out
}
