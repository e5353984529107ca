// Package reencode decides, object by object, what kube-apiserver's GuaranteedUpdate
// would do on a no-op update: encode the decoded object to the target storage
// version and media type through the apiserver's own codec, and rewrite only when the
// encryption transformer reported the stored value stale or the new plaintext differs
// from the stored plaintext. It also refuses objects it cannot round-trip without
// losing fields, and names the fields a custom resource's rewrite drops as
// kube-apiserver's would (its stored version's schema has them, the storage
// version's prunes them: Decision.Dropped, FieldLosses). It produces the new
// (encrypted) value but never writes.
//
// reencode.go is the planner (Planner: Decide, Classify, Encode),
// decision.go what it decides (Decision, Status, Reason, Describe),
// roundtrip.go the check that a built-in's stored value round-trips without
// losing fields (protobuf through wire.go, JSON through internal/jsondoc),
// jsonrelease.go the JSON an older release's types write, fieldloss.go the
// fields a custom resource's rewrite drops.
package reencode

import (
	"bytes"
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
)

// Encrypter encrypts new values with the first provider configured for a resource;
// *encryption.Transformers implements it.
type Encrypter interface {
	Encrypt(ctx context.Context, gr schema.GroupResource, key string, plaintext []byte) ([]byte, error)
	WriteProvider(gr schema.GroupResource) encryption.Info
}

// CustomResourceEncoder writes one CRD's custom resources as the
// apiextensions-apiserver would. NoOpUpdate does to a decoded custom resource
// what its update handler does before encoding on a no-op update (its field
// manager), in place, and reports whether managedFields changed.
type CustomResourceEncoder interface {
	StorageVersion() string
	// MediaType is the short name of the media type Encode writes: "json",
	// or "cbor" with the CBORServingAndStorage gate on.
	MediaType() string
	NoOpUpdate(obj *unstructured.Unstructured) (bool, error)
	// EncodeDropping encodes obj and names the fields (paths, never
	// values) the storage version's schema prunes from it after conversion.
	EncodeDropping(ctx context.Context, obj *unstructured.Unstructured) ([]byte, []string, error)
	RoundTrip(plaintext []byte) error
}

// UpdatePath does to a decoded built-in object what kube-apiserver's update
// handler does before encoding on a no-op update (its field manager), in place,
// and reports whether the object changed; *updatepath.Path implements it.
type UpdatePath interface {
	Apply(obj runtime.Object) (bool, error)
}

// Planner holds the target: storage versions and media type (a StorageConfig built
// for the target release), the write encryption, the update path of the target
// apiserver, and the CRDs' encoders.
type Planner struct {
	Target     *decode.StorageConfig
	Encryption Encrypter
	// Update, when set, runs before encoding built-ins.
	Update UpdatePath
	// EncryptionOnly (--encryption-only) narrows every decision to the
	// encryption: an object is stale only when its value was not written by
	// the first provider and key (ReasonEncryption), and its new value is
	// the stored plaintext, byte for byte, encrypted with that provider: its
	// storage version, media type and content are left as they are, and no
	// update path or encoder runs.
	EncryptionOnly bool
	custom         map[schema.GroupResource]CustomResourceEncoder
}

// NewPlanner returns a planner for the target configuration.
func NewPlanner(target *decode.StorageConfig, enc Encrypter) *Planner {
	return &Planner{Target: target, Encryption: enc, custom: map[schema.GroupResource]CustomResourceEncoder{}}
}

// AddCustomResource registers the encoder of a CRD's custom resources.
func (p *Planner) AddCustomResource(gr schema.GroupResource, enc CustomResourceEncoder) {
	p.custom[gr] = enc
}

// Converts reports whether a built-in object of gr stored as stored in
// mediaType is written in another version or media type: the lose-fields
// guard reads its versioned object (RoundTrip), which decode.Decoder keeps
// when its KeepVersioned says so. False for what the target cannot encode.
func (p *Planner) Converts(gr schema.GroupResource, stored schema.GroupVersionKind, mediaType string) bool {
	if p.EncryptionOnly {
		return false
	}
	target, err := p.Target.Codec(gr)
	if err != nil {
		return false
	}
	return stored.GroupVersion() != target.StorageVersion || mediaType != target.MediaType
}

// Decide classifies a decoded object (decodeErr is Decode's error, if any) and, when
// it is stale, computes the value to write.
func (p *Planner) Decide(ctx context.Context, obj *decode.Object, decodeErr error) Decision {
	d := Describe(obj, decodeErr)
	if d.Status != Readable {
		return d
	}
	return p.decide(ctx, obj, d, true)
}

// Classify is Decide without the value to write: the same status, reasons and
// errors, but NewValue stays nil, so nothing is encrypted. It is for reports
// (verify), which never write.
func (p *Planner) Classify(ctx context.Context, obj *decode.Object, decodeErr error) Decision {
	d := Describe(obj, decodeErr)
	if d.Status != Readable {
		return d
	}
	return p.decide(ctx, obj, d, false)
}

func (p *Planner) decide(ctx context.Context, obj *decode.Object, d Decision, withValue bool) Decision {
	if p.EncryptionOnly {
		return p.decideEncryption(ctx, obj, d, withValue)
	}
	var newPlain []byte
	var err error
	managedChanged := false
	var dropped []string
	if obj.Info.Custom {
		enc := p.custom[obj.Info.Resource]
		if enc == nil {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonUnknownResource, nil, "no CRD encoder for %s", obj.Info.Resource))
		}
		d.To.Version = schema.GroupVersion{Group: obj.Info.Resource.Group, Version: enc.StorageVersion()}.String()
		d.To.MediaType = enc.MediaType()
		u, ok := obj.Internal.(*unstructured.Unstructured)
		if !ok {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonCorruptPayload, nil, "custom resource did not decode to an unstructured object"))
		}
		// The field manager's entries are written into the decoded object, as
		// for built-ins below: it belongs to this decision.
		managedChanged, err = enc.NoOpUpdate(u)
		if err != nil {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonConversionFailed, err, "no-op update path"))
		}
		newPlain, dropped, err = enc.EncodeDropping(ctx, u)
		if err != nil {
			return p.unreadable(d, keyError(d.Key, decode.ReasonConversionFailed, err))
		}
	} else {
		target, err := p.Target.Codec(obj.Info.Resource)
		if err != nil {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonUnknownResource, err, ""))
		}
		d.To.Version = target.StorageVersion.String()
		d.To.MediaType = decode.ShortMediaType(target.MediaType)
		if p.Update != nil {
			managedChanged, err = p.Update.Apply(obj.Internal)
			if err != nil {
				return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonConversionFailed, err, "no-op update path"))
			}
		}
		// The object is encoded in place, as GuaranteedUpdate does: the decoded
		// object belongs to this decision and is dropped after it (the
		// versioning encoder restores the kind it sets while encoding).
		// Sized like the stored value: the buffer is not regrown while encoding.
		buf := bytes.NewBuffer(make([]byte, 0, len(obj.Plaintext)+len(obj.Plaintext)/4+64))
		err = target.Codec.Encode(obj.Internal, buf)
		newPlain = buf.Bytes()
		if err != nil {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonConversionFailed, nil, "encode to %s: %v", target.StorageVersion, err))
		}
		// As the target release's own types encode it (an older
		// release's lack some fields this one's always write).
		if newPlain, err = forRelease(p.Target, target.StorageVersion.WithKind(target.Kind), newPlain); err != nil {
			return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonWouldLoseFields, nil, "%v", err))
		}
	}

	write := encryption.Info{Provider: "identity"}
	if p.Encryption != nil {
		write = p.Encryption.WriteProvider(obj.Info.Resource)
	}
	d.To.Encryption = write.String()

	if obj.Encryption.Stale {
		d.Reasons = append(d.Reasons, ReasonEncryption)
	}
	samePlain := bytes.Equal(newPlain, obj.Plaintext)
	if !samePlain {
		switch {
		case d.From.Version != d.To.Version:
			d.Reasons = append(d.Reasons, ReasonVersion)
		case d.From.MediaType != d.To.MediaType:
			d.Reasons = append(d.Reasons, ReasonMediaType)
		case managedChanged:
		default:
			d.Reasons = append(d.Reasons, ReasonEncoding)
		}
		if d.From.Version != d.To.Version && d.From.MediaType != d.To.MediaType {
			d.Reasons = append(d.Reasons, ReasonMediaType)
		}
		if managedChanged {
			d.Reasons = append(d.Reasons, ReasonManagedFields)
		}
	}
	if len(d.Reasons) == 0 {
		d.Status = Current
		return d
	}
	// Only what would be written needs the lose-fields guard: a current object is
	// left as it is. It decodes the stored value once more, so it runs last. A
	// value whose plaintext is unchanged (only its encryption is stale) is written
	// back byte for byte and cannot lose anything.
	switch {
	case samePlain:
		err = nil
	case obj.Info.Custom:
		err = p.custom[obj.Info.Resource].RoundTrip(obj.Plaintext)
	default:
		err = RoundTrip(obj)
	}
	if err != nil {
		return p.unreadable(d, keyError(d.Key, decode.ReasonWouldLoseFields, err))
	}
	d.Status = Stale
	d.Dropped = dropped
	if !withValue {
		return d
	}
	value, err := p.encrypt(ctx, obj.Info.Resource, d.Key, newPlain)
	if err != nil {
		// The write provider failing is an operational error, not the object's.
		return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonUndecryptable, err, "encrypt with %s", write))
	}
	d.NewValue = value
	return d
}

// decideEncryption is decide under EncryptionOnly: stale only by the
// encryption, the new value the stored plaintext encrypted with the write
// provider. Nothing is decoded further: an object this rewrite keeps in its
// stored form cannot lose fields.
func (p *Planner) decideEncryption(ctx context.Context, obj *decode.Object, d Decision, withValue bool) Decision {
	write := encryption.Info{Provider: "identity"}
	if p.Encryption != nil {
		write = p.Encryption.WriteProvider(obj.Info.Resource)
	}
	d.To = Form{Version: d.From.Version, MediaType: d.From.MediaType, Encryption: write.String()}
	if !obj.Encryption.Stale {
		d.Status = Current
		return d
	}
	d.Reasons = []Reason{ReasonEncryption}
	d.Status = Stale
	if !withValue {
		return d
	}
	value, err := p.encrypt(ctx, obj.Info.Resource, d.Key, obj.Plaintext)
	if err != nil {
		return p.unreadable(d, decode.Errorf(d.Key, decode.ReasonUndecryptable, err, "encrypt with %s", write))
	}
	d.NewValue = value
	return d
}

// encrypt encrypts a new value for key with the first provider configured
// for gr (identity without an Encrypter).
func (p *Planner) encrypt(ctx context.Context, gr schema.GroupResource, key string, plaintext []byte) ([]byte, error) {
	if p.Encryption == nil {
		return plaintext, nil
	}
	return p.Encryption.Encrypt(ctx, gr, key, plaintext)
}

// Encode gives the value kube-apiserver would store at key for a built-in
// object (an internal object, as decoded): the target storage codec of gr
// (storage version, media type), then the first encryption provider
// configured for gr, as a write of the target apiserver. It is for writes
// that are not no-op updates (a status update, a creation): the caller runs
// kube-apiserver's create or update path on the object first.
func (p *Planner) Encode(ctx context.Context, gr schema.GroupResource, key string, obj runtime.Object) ([]byte, error) {
	target, err := p.Target.Codec(gr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	var buf bytes.Buffer
	if err := target.Codec.Encode(obj, &buf); err != nil {
		return nil, fmt.Errorf("%s: encode to %s: %w", key, target.StorageVersion, err)
	}
	plain, err := forRelease(p.Target, target.StorageVersion.WithKind(target.Kind), buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	value, err := p.encrypt(ctx, gr, key, plain)
	if err != nil {
		return nil, fmt.Errorf("%s: encrypt: %w", key, err)
	}
	return value, nil
}

func (p *Planner) unreadable(d Decision, err *decode.Error) Decision {
	d.Status = Unreadable
	d.Err = err
	d.Reasons = nil
	d.Dropped = nil
	d.NewValue = nil
	return d
}
