package decode

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
)

// Decrypter decrypts a stored value for a resource; *encryption.Transformers implements it.
type Decrypter interface {
	Decrypt(ctx context.Context, gr schema.GroupResource, key string, value []byte) ([]byte, encryption.Info, error)
}

// CustomResourceDecoder reads one CRD's stored custom resources the way the
// apiextensions-apiserver does (pruning, defaulting); customresource.Codec
// implements it through an adapter.
type CustomResourceDecoder interface {
	DecodeStored(plaintext []byte) (*unstructured.Unstructured, schema.GroupVersionKind, string, error)
}

// Object is one etcd key as kube-apiserver would read it. On a decode failure the
// fields learned before the failure are still set.
type Object struct {
	KV         etcdscan.KV
	Info       KeyInfo
	Encryption encryption.Info
	// Plaintext is the decrypted value. It may hold secret data: never print it.
	Plaintext []byte
	MediaType string
	StoredGVK schema.GroupVersionKind
	// Internal is the object converted to the internal version with the scheme's
	// defaulting applied (built-ins), or the pruned and defaulted unstructured
	// object in its stored version (custom resources).
	Internal runtime.Object
	// Codec is the storage codec of the object's resource (built-ins only).
	Codec *ResourceCodec
	// Versioned is, when the Decoder's KeepVersioned asked for it (built-ins
	// only), the object as the storage codec's serializer decoded it before
	// defaulting and conversion; nil otherwise.
	Versioned *Versioned
}

// Decoder decodes etcd values exactly as kube-apiserver's storage layer reads them.
type Decoder struct {
	Resolver   *Resolver
	Storage    *StorageConfig
	Encryption Decrypter
	// KeepVersioned, when set, says for which built-in objects Decode also
	// keeps the versioned object (Object.Versioned): those whose stored
	// version or media type is rewritten, which the lose-fields guard reads.
	// Each one costs a deep copy.
	KeepVersioned func(gr schema.GroupResource, stored schema.GroupVersionKind, mediaType string) bool

	custom map[schema.GroupResource]CustomResourceDecoder
}

// NewDecoder wires a decoder. enc may be nil for identity everywhere.
func NewDecoder(res *Resolver, storage *StorageConfig, enc Decrypter) *Decoder {
	return &Decoder{Resolver: res, Storage: storage, Encryption: enc, custom: map[schema.GroupResource]CustomResourceDecoder{}}
}

// AddCustomResource registers a CRD's decoder and key layout. Not safe to call
// while Decode runs concurrently.
func (d *Decoder) AddCustomResource(gr schema.GroupResource, dec CustomResourceDecoder) {
	d.Resolver.AddCustomResource(gr.Group, gr.Resource)
	d.custom[gr] = dec
}

// Decode reads one key. The error, when not nil, is an *Error naming the key.
func (d *Decoder) Decode(ctx context.Context, kv etcdscan.KV) (*Object, error) {
	obj := &Object{KV: kv}
	info, err := d.Resolver.Resolve(kv.Key)
	obj.Info = info
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Reason == ReasonOrphaned {
			return obj, classifyOrphan(obj, e)
		}
		return obj, err
	}
	obj.Encryption = encryption.EnvelopeInfo(kv.Value)
	plaintext := kv.Value
	if d.Encryption != nil {
		pt, enc, err := d.Encryption.Decrypt(ctx, info.Resource, kv.Key, kv.Value)
		obj.Encryption = enc
		if err != nil {
			return obj, decryptError(kv.Key, err)
		}
		plaintext, obj.Encryption = pt, enc
	}
	obj.Plaintext = plaintext

	if info.Custom {
		dec := d.custom[info.Resource]
		if dec == nil {
			return obj, Errorf(kv.Key, ReasonUnknownResource, nil, "the CRD %s is in etcd but could not be used (see its own error)", info.Resource)
		}
		u, gvk, mt, err := dec.DecodeStored(plaintext)
		obj.StoredGVK, obj.MediaType = gvk, mt
		if err != nil {
			return obj, asKeyError(kv.Key, ReasonCorruptPayload, err)
		}
		obj.Internal = u
		return obj, nil
	}

	gvk, mt, err := StoredGVK(kv.Key, plaintext)
	obj.StoredGVK, obj.MediaType = gvk, mt
	if err != nil {
		return obj, err
	}
	rc, err := d.Storage.Codec(info.Resource)
	if err != nil {
		return obj, Errorf(kv.Key, ReasonUnknownResource, err, "")
	}
	obj.Codec = rc
	if !rc.Scheme.Recognizes(gvk) {
		return obj, Errorf(kv.Key, ReasonUnknownKind, nil, "no kind %q is registered for version %q in kube-apiserver %s", gvk.Kind, gvk.GroupVersion(), release.Linked())
	}
	if want := expectedKind(rc, info.Resource); gvk.Kind != want {
		return obj, Errorf(kv.Key, ReasonCorruptPayload, nil, "stored kind %s under a %s key (expected %s)", gvk.Kind, info.Resource, want)
	}
	keep := d.KeepVersioned != nil && d.KeepVersioned(info.Resource, gvk, mt)
	out, versioned, err := rc.keep.decode(rc.Codec, plaintext, keep)
	if err != nil {
		return obj, Errorf(kv.Key, ReasonCorruptPayload, nil, "decode %s: %s", gvk, scrub(err))
	}
	obj.Internal, obj.Versioned = out, versioned
	return obj, nil
}

func expectedKind(rc *ResourceCodec, gr schema.GroupResource) string {
	if k := KindFor(gr); k != "" {
		return k
	}
	return rc.Kind
}

// decryptError is asKeyError for a Decrypter's error: an
// *encryption.DecryptError becomes an *Error with its reason (undecryptable or
// corrupt-envelope) and detail, the same message (a KMS plugin that did not
// answer as its Err).
func decryptError(key string, err error) error {
	var de *encryption.DecryptError
	if errors.As(err, &de) {
		reason := ReasonUndecryptable
		if de.Corrupt {
			reason = ReasonCorruptEnvelope
		}
		if de.Key != "" {
			key = de.Key
		}
		if de.Plugin != nil {
			// A KMS plugin that did not answer: Err names it (and a run
			// stops at it: pipeline.DependencyError).
			return &Error{Key: key, Reason: reason, Detail: de.Detail, Err: de.Plugin}
		}
		return &Error{Key: key, Reason: reason, Detail: de.Detail}
	}
	return asKeyError(key, ReasonUndecryptable, err)
}

// asKeyError keeps an *Error as it is (adding the key) or wraps err in one.
func asKeyError(key string, reason Reason, err error) error {
	var e *Error
	if errors.As(err, &e) {
		if e.Key == "" {
			e.Key = key
		}
		return e
	}
	return &Error{Key: key, Reason: reason, Err: err}
}

// scrub summarises a decode error. Protobuf and JSON decoders can quote the input
// they failed on, which may be secret data, so only the error's type and length are
// kept when the message is long.
func scrub(err error) string {
	msg := err.Error()
	if len(msg) > 200 {
		return fmt.Sprintf("%T (%d-byte message withheld)", err, len(msg))
	}
	return msg
}
