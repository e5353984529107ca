// Package customresource owns the custom-resource codec: given a CRD
// (apiextensions.k8s.io/v1) and the stored plaintext of one of its objects
// (JSON, or CBOR with the self-described tag d9 d9 f7), it reproduces what
// kube-apiserver's apiextensions-apiserver reads (structural pruning,
// metadata coercion, structural defaulting of the stored version) and what it
// writes back (conversion None/Webhook to the storage version, pruning in the
// storage version's schema, the serializer of its storage config: JSON as
// unstructured.UnstructuredJSONScheme encodes it, or CBOR when the
// CBORServingAndStorage feature gate is on), what its update handler does to an object on a no-op update
// (NoOpUpdate: the CRD's field manager, as getOrCreateServingInfoFor builds
// it), plus a lose-fields guard (RoundTrip) and the storedVersions that a
// completed migration allows to trim.
//
// The storage codec reproduced here is the one built by
// crdConversionRESTOptionsGetter.GetRESTOptions in
// k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go on
// top of apiextensions options.NewCRDRESTOptionsGetter (called here for the
// serializer, so the gate is read by the apiserver's own code): a versioning codec
// whose decoder is schemaCoercingDecoder (dropInvalidMetadata, repairGeneration),
// whose convertor is schemaCoercingConverter around the CR converter, whose
// defaulter is unstructuredDefaulter, encoding to the storage version.
package customresource
