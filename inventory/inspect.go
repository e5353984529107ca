package inventory

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// lastApplied is kubectl apply's annotation: on a Secret it repeats the data.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

var secretsGR = schema.GroupResource{Resource: "secrets"}

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

type inspected struct {
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

// Inspect reads one key, decodes it as kube-apiserver would and prints its storage
// header and the object in its stored version, as "yaml" (the header as comments)
// or "json" ({"storage": ..., "object": ...}). Secret data, stringData and kubectl's
// last-applied annotation are replaced by "<redacted N bytes>" unless showSecrets.
// A key that does not decode prints the header and the reason, and returns an
// error naming the key.
func Inspect(ctx context.Context, env *pipeline.Env, key string, showSecrets bool, format string, w io.Writer) error {
	switch format {
	case "", "yaml", "json":
	default:
		return fmt.Errorf("unknown output format %q (want yaml or json)", format)
	}
	if env == nil || env.Source == nil {
		return errors.New("inspect: no environment")
	}
	kv, found, err := env.Source.Get(ctx, key, env.Config.Revision)
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	if !found {
		if env.Config.Revision > 0 {
			return fmt.Errorf("key not found at revision %d: %s", env.Config.Revision, key)
		}
		return fmt.Errorf("key not found: %s", key)
	}
	out := inspected{Storage: Header{
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
		if err := out.write(w, format); err != nil {
			return err
		}
		var de *decode.Error
		if errors.As(decodeErr, &de) {
			return fmt.Errorf("cannot decode %w", de) // de names the key
		}
		return fmt.Errorf("cannot decode %s: %w", key, decodeErr)
	}
	if obj.Info.Resource == secretsGR && !showSecrets {
		redactSecret(out.Object)
	}
	return out.write(w, format)
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
// printed: the decision re-encodes it in place).
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

func joinReasons(rs []reencode.Reason) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
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

// redactSecret replaces every value of a Secret's data and stringData, and kubectl's
// last-applied annotation (which repeats them), by "<redacted N bytes>".
func redactSecret(m map[string]any) {
	if data, ok := m["data"].(map[string]any); ok {
		for k, v := range data {
			s, _ := v.(string)
			n := len(s)
			if b, err := base64.StdEncoding.DecodeString(s); err == nil {
				n = len(b)
			}
			data[k] = redacted(n)
		}
	}
	if data, ok := m["stringData"].(map[string]any); ok {
		for k, v := range data {
			s, _ := v.(string)
			data[k] = redacted(len(s))
		}
	}
	if md, ok := m["metadata"].(map[string]any); ok {
		if ann, ok := md["annotations"].(map[string]any); ok {
			if v, ok := ann[lastApplied].(string); ok {
				ann[lastApplied] = redacted(len(v))
			}
		}
	}
}

func redacted(n int) string { return fmt.Sprintf("<redacted %d bytes>", n) }

func (o *inspected) write(w io.Writer, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(o)
	}
	var b strings.Builder
	h := o.Storage
	line := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "# %-15s %s\n", name+":", fmt.Sprintf(format, args...))
	}
	line("key", "%s", h.Key)
	if h.Resource != "" {
		line("resource", "%s", h.Resource)
	}
	line("revisions", "mod %d, create %d, version %d", h.ModRevision, h.CreateRevision, h.Version)
	switch {
	case h.Lease == "":
		line("lease", "none")
	case h.LeaseError != "":
		line("lease", "%s (TTL unknown: %s)", h.Lease, h.LeaseError)
	case h.LeaseTTL == nil:
		line("lease", "%s (granted %ds; a snapshot does not record the time left: restored, it starts again)", h.Lease, *h.LeaseGrantedTTL)
	case *h.LeaseTTL < 0:
		line("lease", "%s (expired)", h.Lease)
	default:
		line("lease", "%s (%ds left of %ds)", h.Lease, *h.LeaseTTL, *h.LeaseGrantedTTL)
	}
	if h.Provider != "" {
		enc := h.Provider
		if h.KeyName != "" {
			enc += ", key " + h.KeyName
		}
		if h.EncryptionStale {
			enc += " (stale: new writes use another provider or key)"
		}
		line("encryption", "%s", enc)
	}
	if h.MediaType != "" {
		line("media type", "%s", h.MediaType)
	}
	if h.APIVersion != "" {
		line("stored as", "%s %s", h.APIVersion, h.Kind)
	}
	line("size", "%d bytes", h.Size)
	if r := o.Rewrite; r != nil {
		switch r.Status {
		case reencode.Stale:
			line("migrate", "would rewrite it (%s) as %s %s, %s", joinReasons(r.Reasons), r.To.Version, r.To.MediaType, r.To.Encryption)
		case reencode.Current:
			line("migrate", "current: nothing to rewrite")
		default:
			line("migrate", "%s: %s", r.Status, r.Error)
		}
		for _, f := range r.FieldsDropped {
			line("drops field", "%s (in the schema of %s, pruned by %s's: kube-apiserver's next write drops it too; the journal keeps the original)", f, h.APIVersion, r.To.Version)
		}
		for _, e := range r.ManagedFieldsDropped {
			line("drops entry", "managedFields %s (version not served by the target kube-apiserver)", e)
		}
	}
	if o.Error != nil {
		line("error", "%s", o.Error.Reason)
		if o.Error.Orphan != "" {
			line("orphan", "%s", o.Error.Orphan)
		}
		if o.Error.Detail != "" {
			line("detail", "%s", o.Error.Detail)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	data, err := yaml.Marshal(o.Object)
	if err != nil {
		return fmt.Errorf("%s: render YAML: %w", h.Key, err)
	}
	b.WriteString("---\n")
	b.Write(data)
	_, err = io.WriteString(w, b.String())
	return err
}
