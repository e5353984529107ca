// Package reencode decides, object by object, what kube-apiserver's GuaranteedUpdate
// would do on a no-op update: encode the decoded object to the target storage
// version and media type through the apiserver's own codec, and rewrite only when the
// encryption transformer reported the stored value stale or the new plaintext differs
// from the stored plaintext. It also refuses objects it cannot round-trip without
// losing fields, and names the fields a custom resource's rewrite drops as
// kube-apiserver's would (its stored version's schema has them, the storage
// version's prunes them: Decision.Dropped, FieldLosses). It produces the new
// (encrypted) value but never writes.
package reencode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	sigsyaml "sigs.k8s.io/yaml"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
)

// Status is the verdict on one key.
type Status string

const (
	Current    Status = "current"
	Stale      Status = "stale"
	Unreadable Status = "unreadable"
	NotObject  Status = "not-an-object"
	// Orphaned: no resource of this cluster owns the key (decode.ReasonOrphaned);
	// kube-apiserver never reads it, so it is neither rewritten nor unreadable.
	Orphaned Status = "orphaned"
	// Readable is Describe's verdict on a decoded object: no decision was asked for.
	Readable Status = "readable"
)

// Reason says why a stale object needs a rewrite.
type Reason string

const (
	ReasonVersion    Reason = "storage-version"
	ReasonEncryption Reason = "encryption"
	ReasonMediaType  Reason = "media-type"
	// ReasonEncoding: same version, media type and key, but the apiserver would
	// write different bytes (defaulting added fields, an older field order, ...).
	ReasonEncoding Reason = "encoding"
	// ReasonManagedFields: kube-apiserver's field manager would change
	// managedFields on a no-op update (entries for versions it no longer
	// serves, more than ten update managers, undecodable entries; for a
	// custom resource, all of them once one names a version its CRD no
	// longer lists).
	ReasonManagedFields Reason = "managed-fields"
)

// Form describes how an object is (or would be) stored.
type Form struct {
	Version    string `json:"version"`
	MediaType  string `json:"mediaType"`
	Encryption string `json:"encryption"`
}

// Decision is the outcome for one key. NewValue holds the encrypted bytes to write
// when Status is Stale; it is never printed.
type Decision struct {
	Key      string
	Resource schema.GroupResource
	Status   Status
	Reasons  []Reason
	From, To Form
	// Err is set for Unreadable, NotObject and Orphaned.
	Err *decode.Error
	// Dropped, for a stale custom resource, names the fields (paths, never
	// values) the rewrite drops: fields of the version it is stored in that
	// the storage version's schema prunes after conversion (a field an old
	// version had, under conversion None). kube-apiserver's next write of
	// the object drops the same ones; the journal keeps the original.
	Dropped []string

	ModRevision int64
	Lease       int64
	// Read is the rest of what the key was read with (create revision,
	// version, lease, sub-revision): what an output snapshot's writer keeps.
	Read    etcdscan.KVMeta
	OldSize int
	// OldValue is the stored value as read (still encrypted if it was), kept for
	// the journal. Never printed.
	OldValue []byte
	NewValue []byte
}

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

// Describe records how an object is stored, without deciding anything: Status is
// Readable, or Unreadable/NotObject when decodeErr is set.
func Describe(obj *decode.Object, decodeErr error) Decision {
	d := Decision{
		Key:         obj.KV.Key,
		Resource:    obj.Info.Resource,
		ModRevision: obj.KV.ModRevision,
		Lease:       obj.KV.Lease,
		Read:        obj.KV.Meta(),
		OldSize:     len(obj.KV.Value),
		OldValue:    obj.KV.Value,
		From: Form{
			Version:    obj.StoredGVK.GroupVersion().String(),
			MediaType:  decode.ShortMediaType(obj.MediaType),
			Encryption: obj.Encryption.String(),
		},
	}
	if decodeErr != nil {
		d.Err = keyError(d.Key, decode.ReasonCorruptPayload, decodeErr)
		switch d.Err.Reason {
		case decode.ReasonNotObject:
			d.Status = NotObject
		case decode.ReasonOrphaned:
			d.Status = Orphaned
		default:
			d.Status = Unreadable
		}
		return d
	}
	d.Status = Readable
	return d
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

// ReasonStrings joins reasons for a report.
func (d Decision) ReasonStrings() string {
	s := make([]string, len(d.Reasons))
	for i, r := range d.Reasons {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}

func keyError(key string, reason decode.Reason, err error) *decode.Error {
	var e *decode.Error
	if errors.As(err, &e) {
		if e.Key == "" {
			e.Key = key
		}
		return e
	}
	return &decode.Error{Key: key, Reason: reason, Err: err}
}

// RoundTrip is the lose-fields guard for built-ins: decode the stored value in its
// stored version with no conversion and no defaulting, serialize it again with the
// same serializer, and compare. Protobuf is compared byte for byte (the generated
// marshallers are deterministic, and silently drop fields they do not know); JSON is
// compared as a document, since other writers may order keys differently.
func RoundTrip(obj *decode.Object) error {
	rc := obj.Codec
	if rc == nil {
		return fmt.Errorf("no codec for %s", obj.Info.Resource)
	}
	versioned, gvk, err := rc.Codecs.UniversalDeserializer().Decode(obj.Plaintext, nil, nil)
	if err != nil {
		return fmt.Errorf("decode %s without conversion: %w", obj.StoredGVK, err)
	}
	versioned.GetObjectKind().SetGroupVersionKind(*gvk)
	switch obj.MediaType {
	case decode.MediaTypeProtobuf:
		var buf bytes.Buffer
		if err := protobuf.NewSerializer(rc.Scheme, rc.Scheme).Encode(versioned, &buf); err != nil {
			return fmt.Errorf("re-encode %s: %w", gvk, err)
		}
		// Byte for byte, or every stored field kept and only zero values
		// added (what a newer release's types write for fields an older
		// one did not have): see wireKeeps.
		re, stored := buf.Bytes(), obj.Plaintext
		if bytes.Equal(re, stored) {
			return nil
		}
		if len(re) < len(protobufMagic) || len(stored) < len(protobufMagic) || !bytes.Equal(re[:len(protobufMagic)], stored[:len(protobufMagic)]) ||
			!wireKeeps(stored[len(protobufMagic):], re[len(protobufMagic):], 0) {
			return fmt.Errorf("the %s types of Kubernetes %s do not give back every field of the stored protobuf (%d bytes stored, %d re-encoded): it was probably written by a newer release with fields these types would drop", gvk, release.Linked(), len(stored), len(re))
		}
		return nil
	case decode.MediaTypeJSON, decode.MediaTypeYAML:
		re, err := json.Marshal(versioned)
		if err != nil {
			return fmt.Errorf("re-encode %s: %w", gvk, err)
		}
		stored := obj.Plaintext
		if obj.MediaType == decode.MediaTypeYAML {
			// The apiserver's YAML serializer is its JSON one through sigs.k8s.io/yaml.
			if stored, err = sigsyaml.YAMLToJSON(stored); err != nil {
				return fmt.Errorf("stored YAML: %w", err)
			}
		}
		// Fast path: kube-apiserver's JSON serializer writes what
		// json.Marshal does, plus a newline; identical bytes lose nothing.
		if bytes.Equal(re, bytes.TrimSuffix(stored, []byte("\n"))) {
			return nil
		}
		var a, b any
		if err := unmarshalNumber(stored, &a); err != nil {
			return fmt.Errorf("stored JSON: %w", err)
		}
		if err := unmarshalNumber(re, &b); err != nil {
			return err
		}
		// Every stored member kept, or only empty ones dropped (null, [],
		// {}: what an older release's types write where this release's
		// leave the member out, 1.34's ResourceSlice "devices":null), and
		// only zero values added (what this release's types write for a
		// member an older release's did not have, 1.37's CSINode
		// "status":{}), as wireKeeps for protobuf.
		if !reflect.DeepEqual(a, b) && !jsonKeeps(a, b, 0) {
			return fmt.Errorf("the %s types of Kubernetes %s do not give back the stored JSON document: fields %s would be lost or changed", gvk, release.Linked(), strings.Join(diffPaths("", a, b, 5), ", "))
		}
		return nil
	}
	return fmt.Errorf("unexpected media type %q for a built-in resource", obj.MediaType)
}

// protobufMagic prefixes kube-apiserver's protobuf encoding (k8s.io/apimachinery's
// protobuf serializer), before the runtime.Unknown envelope.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

func unmarshalNumber(data []byte, v *any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}

// jsonKeeps reports whether the decoded JSON value b (re-encoded) keeps
// everything of a (stored): the same scalars, arrays of the same length
// whose elements keep, objects whose members keep, where a member only a
// has is empty (null, [], {}) and a member only b has is a zero value.
func jsonKeeps(a, b any, depth int) bool {
	if depth > maxWireDepth {
		return reflect.DeepEqual(a, b)
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		for k, av := range x {
			bv, ok := y[k]
			if !ok {
				if !jsonEmptyValue(av) {
					return false
				}
				continue
			}
			if !jsonKeeps(av, bv, depth+1) {
				return false
			}
		}
		for k, bv := range y {
			if _, ok := x[k]; !ok && !jsonZeroValue(bv, depth+1) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonKeeps(x[i], y[i], depth+1) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// jsonEmptyValue: null, [] or {}.
func jsonEmptyValue(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// jsonZeroValue: what encoding/json writes for a zero value (null, false,
// 0, "", [], {}), or an object of such.
func jsonZeroValue(v any, depth int) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		if depth > maxWireDepth {
			return false
		}
		for _, e := range x {
			if !jsonZeroValue(e, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// diffPaths lists up to max JSON paths where a and b differ (paths only, no values).
func diffPaths(path string, a, b any, max int) []string {
	if reflect.DeepEqual(a, b) {
		return nil
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if path == "" {
			path = "."
		}
		return []string{path}
	}
	var out []string
	for k, av := range am {
		if len(out) >= max {
			break
		}
		out = append(out, diffPaths(path+"."+k, av, bm[k], max-len(out))...)
	}
	for k := range bm {
		if _, ok := am[k]; !ok && len(out) < max {
			out = append(out, path+"."+k)
		}
	}
	return out
}

// ErrorReason gives the reason and a value-free detail of an unreadable (or
// not-an-object) decision; decode errors never carry plaintext.
func (d *Decision) ErrorReason() (decode.Reason, string) {
	if d.Err == nil {
		return decode.Reason("unknown"), fmt.Sprintf("status %s without an error", d.Status)
	}
	detail := d.Err.Detail
	if d.Err.Err != nil {
		if detail != "" {
			detail += ": "
		}
		detail += d.Err.Err.Error()
	}
	return d.Err.Reason, detail
}
