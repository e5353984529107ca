package inventory

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// lastApplied is kubectl apply's annotation: on a Secret it repeats the data.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

var (
	secretsGR    = schema.GroupResource{Resource: "secrets"}
	configMapsGR = schema.GroupResource{Resource: "configmaps"}
)

// Header is how one key is stored.
type Header struct {
	Key            string `json:"key"`
	Resource       string `json:"resource,omitempty"`
	ModRevision    int64  `json:"modRevision"`
	CreateRevision int64  `json:"createRevision"`
	Version        int64  `json:"version"`
	// Lease is the lease ID in hex as etcdctl prints it; empty without a lease.
	Lease string `json:"lease,omitempty"`
	// LeaseTTL is the lease's remaining seconds (-1: expired; absent for a
	// snapshot file, which does not record it), LeaseGrantedTTL its granted TTL;
	// LeaseError says why they are unknown.
	LeaseTTL        *int64 `json:"leaseTTL,omitempty"`
	LeaseGrantedTTL *int64 `json:"leaseGrantedTTL,omitempty"`
	LeaseError      string `json:"leaseError,omitempty"`
	// Provider and KeyName say how the value is encrypted at rest; Stale that the
	// configuration would write it with another provider or key.
	Provider        string `json:"provider,omitempty"`
	KeyName         string `json:"keyName,omitempty"`
	EncryptionStale bool   `json:"encryptionStale,omitempty"`
	MediaType       string `json:"mediaType,omitempty"`
	APIVersion      string `json:"apiVersion,omitempty"`
	Kind            string `json:"kind,omitempty"`
	Size            int    `json:"size"`
}

// KeyError is why a key could not be decoded.
type KeyError struct {
	Reason decode.Reason `json:"reason"`
	// Orphan says why no resource owns an orphaned key.
	Orphan decode.Orphan `json:"orphan,omitempty"`
	Detail string        `json:"detail,omitempty"`
}

// Inspected is one key as inspect shows it: how it is stored, what a
// rewrite would do, and the object in its stored version (Secret data
// redacted unless asked), or why it could not be decoded.
type Inspected struct {
	Storage Header         `json:"storage"`
	Rewrite *Rewrite       `json:"rewrite,omitempty"`
	Object  map[string]any `json:"object,omitempty"`
	Error   *KeyError      `json:"error,omitempty"`
}

// Rewrite is what a no-op update through the target kube-apiserver would do to
// the object (what migrate would write), without the values.
type Rewrite struct {
	Status  reencode.Status   `json:"status"`
	Reasons []reencode.Reason `json:"reasons,omitempty"`
	To      reencode.Form     `json:"to"`
	// ManagedFieldsDropped lists the managedFields entries kube-apiserver's
	// field manager would delete, as "manager operation apiVersion".
	ManagedFieldsDropped []string `json:"managedFieldsDropped,omitempty"`
	// FieldsDropped names the fields of a custom resource the rewrite drops:
	// its stored version's schema has them, its storage version's prunes
	// them (reencode.Decision.Dropped). Paths, never values.
	FieldsDropped []string `json:"fieldsDropped,omitempty"`
	Error         string   `json:"error,omitempty"`
}

// Inspect reads one key and decodes it as kube-apiserver would: its storage
// header, what a rewrite would do, and the object in its stored version.
// Secret data, stringData and kubectl's last-applied annotation are replaced
// by "<redacted N bytes>" unless showSecrets. A key that does not decode
// returns the header and the reason, and an error naming the key; a key not
// found returns no report.
func Inspect(ctx context.Context, env *pipeline.Env, key string, showSecrets bool) (*Inspected, error) {
	if env == nil || env.Source == nil {
		return nil, errors.New("inspect: no environment")
	}
	kv, found, err := env.Source.Get(ctx, key, env.Config.Revision)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if !found {
		if env.Config.Revision > 0 {
			return nil, fmt.Errorf("key not found at revision %d: %s", env.Config.Revision, key)
		}
		return nil, fmt.Errorf("key not found: %s", key)
	}
	out := &Inspected{Storage: Header{
		Key: kv.Key, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Size: len(kv.Value),
	}}
	if kv.Lease != 0 {
		leaseInfo(ctx, env.Source, kv.Lease, env.Config.SnapshotFile != "", &out.Storage)
	}

	obj, decodeErr := env.Decoder.Decode(ctx, kv)
	h := &out.Storage
	if obj.Info.Resource.Resource != "" {
		h.Resource = obj.Info.Resource.String()
	}
	h.Provider, h.KeyName, h.EncryptionStale = obj.Encryption.Provider, obj.Encryption.KeyName, obj.Encryption.Stale
	h.MediaType = obj.MediaType
	if !obj.StoredGVK.Empty() {
		h.APIVersion, h.Kind = obj.StoredGVK.GroupVersion().String(), obj.StoredGVK.Kind
	}
	if decodeErr == nil {
		out.Object, decodeErr = external(obj)
	}
	if decodeErr == nil {
		out.Rewrite = rewrite(ctx, env, obj)
	}
	if decodeErr != nil {
		out.Object = nil
		out.Error = keyError(decodeErr)
		var de *decode.Error
		if errors.As(decodeErr, &de) {
			return out, fmt.Errorf("cannot decode %w", de) // de names the key
		}
		return out, fmt.Errorf("cannot decode %s: %w", key, decodeErr)
	}
	if (obj.Info.Resource == secretsGR || obj.Info.Resource == configMapsGR) && !showSecrets {
		redactSecret(out.Object, obj.Info.Resource == configMapsGR)
	}
	return out, nil
}

// leaseInfo fills the lease's TTLs. A snapshot file does not record the time a
// lease had left (etcd gives it its full TTL when restored): only the granted
// TTL is reported.
func leaseInfo(ctx context.Context, src etcdscan.Source, lease int64, snapshot bool, h *Header) {
	h.Lease = fmt.Sprintf("%016x", lease)
	ttl, err := src.Lease(ctx, lease)
	if err != nil {
		h.LeaseError = err.Error()
		return
	}
	granted := ttl.GrantedTTL
	h.LeaseGrantedTTL = &granted
	if ttl.TTL < 0 || !snapshot {
		left := ttl.TTL
		h.LeaseTTL = &left
	}
}

// external converts the decoded object to its stored version as a JSON map:
// built-ins from the internal version through their scheme, custom resources as
// they are (already in the stored version). metadata.resourceVersion is filled from
// the key's mod revision, as kube-apiserver does on read.
func external(obj *decode.Object) (map[string]any, error) {
	var m map[string]any
	switch in := obj.Internal.(type) {
	case *unstructured.Unstructured:
		m = in.DeepCopy().Object
	default:
		if obj.Codec == nil || obj.Internal == nil {
			return nil, decode.Errorf(obj.KV.Key, decode.ReasonCorruptPayload, nil, "decoded without a codec")
		}
		ext, err := obj.Codec.Scheme.ConvertToVersion(obj.Internal, obj.StoredGVK.GroupVersion())
		if err != nil {
			return nil, decode.Errorf(obj.KV.Key, decode.ReasonConversionFailed, nil, "convert to %s: %v", obj.StoredGVK.GroupVersion(), err)
		}
		data, err := json.Marshal(ext)
		if err != nil {
			return nil, decode.Errorf(obj.KV.Key, decode.ReasonConversionFailed, nil, "marshal %s as JSON: %v", obj.StoredGVK, err)
		}
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, decode.Errorf(obj.KV.Key, decode.ReasonConversionFailed, nil, "unmarshal %s JSON", obj.StoredGVK)
		}
	}
	if md, ok := m["metadata"].(map[string]any); ok {
		md["resourceVersion"] = strconv.FormatInt(obj.KV.ModRevision, 10)
	}
	return m, nil
}

// rewrite runs the decision migrate would take on obj (after the object was
// converted for the report: the decision re-encodes it in place).
func rewrite(ctx context.Context, env *pipeline.Env, obj *decode.Object) *Rewrite {
	before := managedFields(obj.Internal)
	d := env.Planner.Decide(ctx, obj, nil)
	r := &Rewrite{Status: d.Status, Reasons: d.Reasons, To: d.To, FieldsDropped: d.Dropped}
	if d.Err != nil {
		_, r.Error = d.ErrorReason()
	}
	after := map[string]bool{}
	for _, e := range managedFields(obj.Internal) {
		after[entryName(e)] = true
	}
	for _, e := range before {
		if !after[entryName(e)] {
			r.ManagedFieldsDropped = append(r.ManagedFieldsDropped, entryName(e))
		}
	}
	return r
}

func managedFields(obj runtime.Object) []metav1.ManagedFieldsEntry {
	acc, err := apimeta.Accessor(obj)
	if err != nil {
		return nil
	}
	return append([]metav1.ManagedFieldsEntry(nil), acc.GetManagedFields()...)
}

func entryName(e metav1.ManagedFieldsEntry) string {
	s := e.Manager + " " + string(e.Operation) + " " + e.APIVersion
	if e.Subresource != "" {
		s += " /" + e.Subresource
	}
	return s
}

func keyError(err error) *KeyError {
	var de *decode.Error
	if !errors.As(err, &de) {
		return &KeyError{Reason: decode.ReasonCorruptPayload, Detail: err.Error()}
	}
	detail := de.Detail
	if de.Err != nil {
		if detail != "" {
			detail += ": "
		}
		detail += de.Err.Error()
	}
	return &KeyError{Reason: de.Reason, Orphan: de.Orphan, Detail: detail}
}

// redactSecret replaces every value of a Secret's data and stringData, or of
// a ConfigMap's data and binaryData (as often a credential, and as often
// encrypted at rest), and kubectl's last-applied annotation (which repeats
// them), by "<redacted N bytes>".
func redactSecret(m map[string]any, configMap bool) {
	redactValues(m, "data", !configMap) // a Secret's data is base64, a ConfigMap's text
	redactValues(m, "binaryData", true)
	redactValues(m, "stringData", false)
	if md, ok := m["metadata"].(map[string]any); ok {
		if ann, ok := md["annotations"].(map[string]any); ok {
			if v, ok := ann[lastApplied].(string); ok {
				ann[lastApplied] = redacted(len(v))
			}
		}
	}
}

// redactValues redacts every value of the map m[field], each counted in
// bytes (decoded from base64 when b64).
func redactValues(m map[string]any, field string, b64 bool) {
	data, ok := m[field].(map[string]any)
	if !ok {
		return
	}
	for k, v := range data {
		s, _ := v.(string)
		n := len(s)
		if b, err := base64.StdEncoding.DecodeString(s); b64 && err == nil {
			n = len(b)
		}
		data[k] = redacted(n)
	}
}

func redacted(n int) string { return fmt.Sprintf("<redacted %d bytes>", n) }
