package decode

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/apis/apps"
	"k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/enctest"
)

const capturedDir = "../testdata/captured"

// captured is one value kube-apiserver 1.36.3 wrote, with its sidecar.
type captured struct {
	Name           string
	Value          []byte
	Key            string `json:"key"`
	ModRevision    int64  `json:"modRevision"`
	CreateRevision int64  `json:"createRevision"`
	Version        int64  `json:"version"`
	Provider       string `json:"provider"`
	Encoding       string `json:"encoding"`
	APIVersion     string `json:"apiVersion"`
	Kind           string `json:"kind"`
}

func (c captured) kv() etcdscan.KV {
	return etcdscan.KV{Key: c.Key, Value: c.Value, ModRevision: c.ModRevision, CreateRevision: c.CreateRevision, Version: c.Version}
}

// readCaptured reads testdata/captured/*.bin and their .json sidecars.
func readCaptured(tb testing.TB) map[string]captured {
	tb.Helper()
	bins, err := filepath.Glob(filepath.Join(capturedDir, "*.bin"))
	if err != nil || len(bins) == 0 {
		tb.Fatalf("no captured values in %s: %v", capturedDir, err)
	}
	out := map[string]captured{}
	for _, bin := range bins {
		name := strings.TrimSuffix(filepath.Base(bin), ".bin")
		var c captured
		js, err := os.ReadFile(strings.TrimSuffix(bin, ".bin") + ".json")
		if err != nil {
			tb.Fatal(err)
		}
		if err := json.Unmarshal(js, &c); err != nil {
			tb.Fatalf("%s.json: %v", name, err)
		}
		if c.Value, err = os.ReadFile(bin); err != nil {
			tb.Fatal(err)
		}
		c.Name = name
		out[name] = c
	}
	return out
}

var (
	storageOnce sync.Once
	storage136  *StorageConfig
	storageErr  error
)

func testStorage(tb testing.TB) *StorageConfig {
	tb.Helper()
	storageOnce.Do(func() { storage136, storageErr = NewStorageConfig("") })
	if storageErr != nil {
		tb.Fatal(storageErr)
	}
	return storage136
}

// capturedDecoder decodes with the EncryptionConfiguration the captures were made with.
func capturedDecoder(tb testing.TB) (*Decoder, *encryption.Transformers) {
	tb.Helper()
	enc, err := encryption.Load(context.Background(), filepath.Join(capturedDir, "encryption-config.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(enc.Close)
	s := testStorage(tb)
	return NewDecoder(NewResolver("/registry", s), s, enc), enc
}

func wantReason(t *testing.T, err error, key string, reason Reason) *Error {
	t.Helper()
	var de *Error
	if !errors.As(err, &de) {
		t.Fatalf("%s: got %v (%T), want *decode.Error %s", key, err, err, reason)
	}
	if de.Reason != reason {
		t.Errorf("%s: reason %s, want %s (%v)", key, de.Reason, reason, err)
	}
	if de.Key != key {
		t.Errorf("error names key %q, want %q", de.Key, key)
	}
	enctest.AssertNoSecrets(t, err.Error())
	if strings.Contains(err.Error(), "not-a-real-password") {
		t.Errorf("error leaks the captured secret's data: %v", err)
	}
	return de
}

// TestDecodeCapturedValues: values written by a real kube-apiserver 1.36.3 decode
// into the apiserver's internal types, with the encryption and stored GVK the
// sidecars record.
func TestDecodeCapturedValues(t *testing.T) {
	ctx := context.Background()
	d, _ := capturedDecoder(t)
	caps := readCaptured(t)
	for _, name := range []string{"secret-aescbc", "deployment-protobuf", "configmap-identity", "event-leased"} {
		c, ok := caps[name]
		if !ok {
			t.Fatalf("capture %s missing", name)
		}
		obj, err := d.Decode(ctx, c.kv())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := obj.StoredGVK, schema.FromAPIVersionAndKind(c.APIVersion, c.Kind); got != want {
			t.Errorf("%s: stored %v, sidecar says %v", name, got, want)
		}
		if ShortMediaType(obj.MediaType) != c.Encoding {
			t.Errorf("%s: media type %s, sidecar says %s", name, obj.MediaType, c.Encoding)
		}
		wantEnc := encryption.Info{Provider: encryption.ProviderIdentity}
		if c.Provider != "identity" {
			wantEnc = encryption.EnvelopeInfo([]byte(c.Provider))
		}
		if obj.Encryption != wantEnc {
			t.Errorf("%s: encryption %+v, want %+v (fresh: written by the first provider)", name, obj.Encryption, wantEnc)
		}
		if obj.Internal == nil {
			t.Fatalf("%s: no internal object", name)
		}
	}

	obj, err := d.Decode(ctx, caps["secret-aescbc"].kv())
	if err != nil {
		t.Fatal(err)
	}
	secret, ok := obj.Internal.(*core.Secret)
	if !ok {
		t.Fatalf("secret decoded to %T, want internal core.Secret", obj.Internal)
	}
	if secret.Name != "db-credentials" || string(secret.Data["password"]) != "not-a-real-password" {
		t.Errorf("secret %s/%s has data keys %v", secret.Namespace, secret.Name, len(secret.Data))
	}
	obj, err = d.Decode(ctx, caps["deployment-protobuf"].kv())
	if err != nil {
		t.Fatal(err)
	}
	dep, ok := obj.Internal.(*apps.Deployment)
	if !ok || dep.Name != "web" {
		t.Fatalf("deployment decoded to %T %v", obj.Internal, obj.Internal)
	}
	// Scheme defaulting ran, as on kube-apiserver's read path.
	if dep.Spec.Strategy.Type == "" || dep.Spec.RevisionHistoryLimit == nil {
		t.Errorf("deployment was not defaulted: strategy %q, revisionHistoryLimit %v", dep.Spec.Strategy.Type, dep.Spec.RevisionHistoryLimit)
	}
}

// protobufValue wraps raw in kube-apiserver's protobuf envelope.
func protobufValue(t *testing.T, apiVersion, kind string, raw []byte) []byte {
	t.Helper()
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: raw}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("k8s\x00"), b...)
}

func TestDecodeErrors(t *testing.T) {
	ctx := context.Background()
	d, _ := capturedDecoder(t)
	caps := readCaptured(t)
	cm := caps["configmap-identity"]
	secretBody := caps["secret-aescbc"]
	secretPlain, _, err := d.Encryption.Decrypt(ctx, secretsGR, secretBody.Key, secretBody.Value)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, key string
		value     []byte
		reason    Reason
		detail    string
	}{
		{"garbage", "/registry/configmaps/default/c", []byte("\x01\x02\x03 not an object " + enctest.PlainMarker), ReasonCorruptPayload, "not protobuf, JSON, YAML or CBOR"},
		{"empty value", "/registry/configmaps/default/c", nil, ReasonCorruptPayload, ""},
		{"truncated protobuf", cm.Key, cm.Value[:len(cm.Value)/2], ReasonCorruptEnvelope, "protobuf"},
		{"protobuf magic only", cm.Key, []byte("k8s\x00"), ReasonCorruptEnvelope, "no kind"},
		{"garbage object in a valid envelope", cm.Key, protobufValue(t, "v1", "ConfigMap", []byte("\xff\xff\xff\xff"+enctest.PlainMarker)), ReasonCorruptPayload, "ConfigMap"},
		{"truncated secret object", secretBody.Key, protobufValue(t, "v1", "Secret", secretPlain[20:len(secretPlain)-30]), ReasonCorruptPayload, "Secret"},
		{"mis-prefixed protobuf magic", cm.Key, append([]byte("k8s\x01"), cm.Value[4:]...), ReasonCorruptPayload, ""},
		{"JSON array", "/registry/configmaps/default/c", []byte(`[{"apiVersion":"v1","kind":"ConfigMap"}]`), ReasonCorruptPayload, ""},
		{"JSON string", "/registry/configmaps/default/c", []byte(`"` + enctest.PlainMarker + `"`), ReasonCorruptPayload, ""},
		{"JSON null", "/registry/configmaps/default/c", []byte(`null`), ReasonCorruptPayload, ""},
		{"JSON without kind", "/registry/configmaps/default/c", []byte(`{"apiVersion":"v1","data":{"k":"` + enctest.PlainMarker + `"}}`), ReasonCorruptPayload, "apiVersion/kind"},
		{"JSON kind not a string", "/registry/configmaps/default/c", []byte(`{"apiVersion":"v1","kind":7}`), ReasonCorruptPayload, ""},
		{"invalid JSON", "/registry/secrets/default/s", []byte(`{"apiVersion":"v1","kind":"Secret","stringData":{"k":"` + enctest.PlainMarker + `"`), ReasonCorruptPayload, "offset"},
		{"JSON secret with a wrong field type", "/registry/secrets/default/s", []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"password":123},"stringData":{"k":"` + enctest.PlainMarker + `"}}`), ReasonCorruptPayload, "Secret"},
		{"unknown kind", "/registry/configmaps/default/c", protobufValue(t, "v1", "NoSuchKind", nil), ReasonUnknownKind, "NoSuchKind"},
		{"unknown group", "/registry/configmaps/default/c", []byte(`{"apiVersion":"nosuch.example.com/v1","kind":"ConfigMap"}`), ReasonUnknownKind, "nosuch.example.com"},
		{"wrong kind under the key", "/registry/secrets/default/c", cm.Value, ReasonCorruptPayload, "ConfigMap"},
		{"deployment under configmaps", "/registry/configmaps/default/web", caps["deployment-protobuf"].Value, ReasonCorruptPayload, "Deployment"},
		{"compact_rev_key", "compact_rev_key", []byte("12345"), ReasonNotObject, ""},
		{"health", "/registry/health", []byte(`{"health":"true"}`), ReasonNotObject, ""},
		{"unknown resource", "/registry/nosuchthings/default/x", cm.Value, ReasonUnknownResource, ""},
		{"custom resource without CRD", caps["customresource-json"].Key, caps["customresource-json"].Value, ReasonOrphaned, "widgets"},
		{"encrypted with an unknown key", "/registry/secrets/default/s", enctest.CBCValue(t, "key9", enctest.Material1, secretPlain), ReasonUndecryptable, "aescbc:key9"},
		{"encrypted with other key material", "/registry/secrets/default/s", enctest.CBCValue(t, "key1", enctest.Material1, secretPlain), ReasonUndecryptable, "aescbc:key1"},
		{"corrupt encryption envelope", secretBody.Key, secretBody.Value[:len("k8s:enc:aescbc:v1:key1:")+16], ReasonCorruptEnvelope, "aescbc:key1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			obj, err := d.Decode(ctx, etcdscan.KV{Key: c.key, Value: c.value, ModRevision: 7})
			if err == nil {
				t.Fatalf("decoded to %T", obj.Internal)
			}
			t.Log(err)
			de := wantReason(t, err, c.key, c.reason)
			if c.detail != "" && !strings.Contains(err.Error(), c.detail) {
				t.Errorf("error %q does not mention %q", err, c.detail)
			}
			if strings.Contains(de.Error(), string(secretPlain[len(secretPlain)/2:len(secretPlain)/2+12])) {
				t.Errorf("error quotes the secret's plaintext: %v", err)
			}
			if obj == nil || obj.KV.Key != c.key {
				t.Errorf("Decode lost the KV on failure: %+v", obj)
			}
		})
	}
}

// TestDecodeJSONBuiltin: a built-in stored as JSON (--storage-media-type) still reads.
func TestDecodeJSONBuiltin(t *testing.T) {
	d, _ := capturedDecoder(t)
	obj, err := d.Decode(context.Background(), etcdscan.KV{Key: "/registry/configmaps/kube-system/cfg",
		Value: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg","namespace":"kube-system"},"data":{"a":"b"}}` + "\n")})
	if err != nil {
		t.Fatal(err)
	}
	cm, ok := obj.Internal.(*core.ConfigMap)
	if !ok || cm.Name != "cfg" || cm.Data["a"] != "b" || ShortMediaType(obj.MediaType) != "json" {
		t.Errorf("got %T %+v media %s", obj.Internal, obj.Internal, obj.MediaType)
	}
}

// TestDecodeOrphaned: a key no built-in resource or CRD owns is orphaned, with the
// reason read from what it holds; a key under a resource kube-apiserver reads, or
// one holding a kind it serves, is not.
func TestDecodeOrphaned(t *testing.T) {
	d, _ := capturedDecoder(t)
	cm := readCaptured(t)["configmap-identity"]
	ctx := context.Background()
	psp := protobufValue(t, "policy/v1beta1", "PodSecurityPolicy", []byte("\x0a\x0c\x0a\x0arestricted"))
	cases := []struct {
		name, key string
		value     []byte
		reason    Reason
		orphan    Orphan
		detail    string
	}{
		{"PodSecurityPolicy from 1.24", "/registry/podsecuritypolicy/restricted", psp, ReasonOrphaned, OrphanRemovedBuiltin, "podsecuritypolicies.policy"},
		{"extensions PodSecurityPolicy as JSON", "/registry/podsecuritypolicy/old", []byte(`{"apiVersion":"extensions/v1beta1","kind":"PodSecurityPolicy","metadata":{"name":"old"}}`), ReasonOrphaned, OrphanRemovedBuiltin, "extensions/v1beta1 PodSecurityPolicy"},
		{"custom resource whose CRD is gone", "/registry/example.com/gizmos/ns1/g", []byte(`{"apiVersion":"example.com/v1","kind":"Gizmo","metadata":{"name":"g"}}`), ReasonOrphaned, OrphanCRDMissing, "no CRD gizmos.example.com"},
		{"unknown prefix", "/registry/somethingelse/x", []byte("not an object"), ReasonOrphaned, OrphanUnknownPrefix, "/registry/somethingelse"},
		{"unknown group under an unknown prefix", "/registry/things/x", []byte(`{"apiVersion":"things.io/v1","kind":"Thing"}`), ReasonOrphaned, OrphanUnknownPrefix, ""},
		// Never decrypted: which provider wrote it is unknown.
		{"encrypted, unknown prefix", "/registry/podsecuritypolicy/enc", enctest.CBCValue(t, "key1", enctest.Material1, psp), ReasonOrphaned, OrphanUnknownPrefix, ""},
		// A kind kube-apiserver serves, under a prefix it does not read: not a leftover.
		{"served kind under an unknown prefix", "/registry/nosuchthings/default/x", cm.Value, ReasonUnknownResource, "", "v1 ConfigMap"},
		{"bad layout under a resource", "/registry/configmaps/a/b/c", cm.Value, ReasonUnknownResource, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.Decode(ctx, etcdscan.KV{Key: c.key, Value: c.value, ModRevision: 7})
			de := wantReason(t, err, c.key, c.reason)
			if de.Orphan != c.orphan {
				t.Errorf("orphan %q, want %q (%v)", de.Orphan, c.orphan, err)
			}
			if c.detail != "" && !strings.Contains(err.Error(), c.detail) {
				t.Errorf("error %q does not mention %q", err, c.detail)
			}
		})
	}
}

var secretsGR = schema.GroupResource{Resource: "secrets"}
