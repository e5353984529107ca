// Package customresource owns the custom-resource codec: given a CRD
// (apiextensions.k8s.io/v1) and the stored plaintext of one of its objects
// (JSON, or CBOR with the self-described tag d9 d9 f7), it reproduces what
// kube-apiserver 1.36's apiextensions-apiserver reads (structural pruning,
// metadata coercion, structural defaulting of the stored version) and what it
// writes back (conversion None/Webhook to the storage version, pruning in the
// storage version's schema, JSON as unstructured.UnstructuredJSONScheme
// encodes it), what its update handler does to an object on a no-op update
// (NoOpUpdate: the CRD's field manager, as getOrCreateServingInfoFor builds
// it), plus a lose-fields guard (RoundTrip) and the storedVersions that a
// completed migration allows to trim.
//
// The storage codec reproduced here is the one built by
// crdConversionRESTOptionsGetter.GetRESTOptions in
// k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go on
// top of apiextensions options.NewCRDRESTOptionsGetter: a versioning codec
// whose decoder is schemaCoercingDecoder (dropInvalidMetadata, repairGeneration),
// whose convertor is schemaCoercingConverter around the CR converter, whose
// defaulter is unstructuredDefaulter, encoding to the storage version.
package customresource
