package reencode

import (
	"bytes"
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"
	"k8s.io/kubernetes/pkg/apis/storage"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
)

var (
	secretsGR       = schema.GroupResource{Resource: "secrets"}
	deviceClassesGR = schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}
)

func storageConfig(t *testing.T, emulated, media string) *decode.StorageConfig {
	t.Helper()
	rel, err := release.Named(emulated)
	if err != nil {
		t.Fatal(err)
	}
	s, err := decode.NewStorageConfigFor(decode.StorageOptions{Release: rel, MediaType: media})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// write encodes an internal object exactly as kube-apiserver configured with sc
// would store it.
func write(t *testing.T, sc *decode.StorageConfig, gr schema.GroupResource, obj runtime.Object) []byte {
	t.Helper()
	rc, err := sc.Codec(gr)
	if err != nil {
		t.Fatal(err)
	}
	data, err := runtime.Encode(rc.Codec, obj)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func decodeKV(t *testing.T, key string, value []byte) (*decode.Object, error) {
	t.Helper()
	sc := storageConfig(t, "", "")
	dec := decode.NewDecoder(decode.NewResolver("/registry", sc), sc, nil)
	return dec.Decode(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: 7})
}

func secret() *api.Secret {
	return &api.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: "ns1", UID: "u1", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Type:       api.SecretTypeOpaque,
		Data:       map[string][]byte{"password": []byte("hunter2")},
	}
}

func deviceClass() *resource.DeviceClass {
	return &resource.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", UID: "u2", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: resource.DeviceClassSpec{
			Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}},
		},
	}
}

func TestCurrentObjectIsNotRewritten(t *testing.T) {
	sc := storageConfig(t, "", "")
	value := write(t, sc, secretsGR, secret())
	obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
	if err != nil {
		t.Fatal(err)
	}
	d := NewPlanner(sc, nil).Decide(context.Background(), obj, nil)
	if d.Status != Current || d.NewValue != nil {
		t.Fatalf("status %s reasons %v, want current", d.Status, d.Reasons)
	}
	if d.From.Version != "v1" || d.From.MediaType != "protobuf" || d.To.Encryption != "identity" {
		t.Fatalf("from %+v to %+v", d.From, d.To)
	}
}

func TestOlderStorageVersionIsRewrittenToTarget(t *testing.T) {
	old := storageConfig(t, "1.34", "")
	value := write(t, old, deviceClassesGR, deviceClass())
	if !bytes.Contains(value, []byte("resource.k8s.io/v1beta2")) {
		t.Fatalf("seed value not stored as v1beta2")
	}
	obj, err := decodeKV(t, "/registry/deviceclasses/gpu", value)
	if err != nil {
		t.Fatal(err)
	}
	// Target 1.36: stale by version; the new bytes are what 1.36 writes for the object.
	target := storageConfig(t, "", "")
	d := NewPlanner(target, nil).Decide(context.Background(), obj, nil)
	if d.Status != Stale || d.ReasonStrings() != "storage-version" {
		t.Fatalf("status %s reasons %v", d.Status, d.Reasons)
	}
	if d.From.Version != "resource.k8s.io/v1beta2" || d.To.Version != "resource.k8s.io/v1" {
		t.Fatalf("from %s to %s", d.From.Version, d.To.Version)
	}
	if want := write(t, target, deviceClassesGR, deviceClass()); !bytes.Equal(d.NewValue, want) {
		t.Fatalf("new value differs from what kube-apiserver 1.36 writes for the same object")
	}
	// The rewritten value is current for 1.36 ...
	obj2, err := decodeKV(t, "/registry/deviceclasses/gpu", d.NewValue)
	if err != nil {
		t.Fatal(err)
	}
	if d2 := NewPlanner(target, nil).Decide(context.Background(), obj2, nil); d2.Status != Current {
		t.Fatalf("after rewrite: %s %v", d2.Status, d2.Reasons)
	}
	// ... and the original is current when the target is 1.34.
	if d3 := NewPlanner(old, nil).Decide(context.Background(), obj, nil); d3.Status != Current {
		t.Fatalf("target 1.34: %s %v", d3.Status, d3.Reasons)
	}
}

func TestJSONStoredBuiltinIsRewrittenAsProtobuf(t *testing.T) {
	jsonSC := storageConfig(t, "", decode.MediaTypeJSON)
	value := write(t, jsonSC, secretsGR, secret())
	obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
	if err != nil {
		t.Fatal(err)
	}
	d := NewPlanner(storageConfig(t, "", ""), nil).Decide(context.Background(), obj, nil)
	if d.Status != Stale || d.ReasonStrings() != "media-type" || d.To.MediaType != "protobuf" {
		t.Fatalf("status %s reasons %v to %+v", d.Status, d.Reasons, d.To)
	}
	// --storage-media-type=application/json keeps it.
	if d := NewPlanner(jsonSC, nil).Decide(context.Background(), obj, nil); d.Status != Current {
		t.Fatalf("json target: %s %v", d.Status, d.Reasons)
	}
}

func TestUnknownProtobufFieldIsRefused(t *testing.T) {
	sc := storageConfig(t, "", "")
	value := withProtobufField(t, write(t, sc, secretsGR, secret()))
	obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
	if err != nil {
		t.Fatalf("the apiserver would read it (dropping the field): %v", err)
	}
	d := NewPlanner(sc, nil).Decide(context.Background(), obj, nil)
	if d.Status != Unreadable || d.Err == nil || d.Err.Reason != decode.ReasonWouldLoseFields || d.NewValue != nil {
		t.Fatalf("status %s err %v", d.Status, d.Err)
	}
	if strings.Contains(d.Err.Error(), "hunter2") {
		t.Fatalf("error leaks secret data: %v", d.Err)
	}
}

// TestFieldAddedByANewerReleaseIsNotLoss: Kubernetes 1.37 added CSINode's
// status, a non-pointer message its types always marshal; a CSINode stored by
// 1.36 has no such field and re-encodes to two more bytes (an empty field 3).
// Nothing of the stored value is lost: it is rewritten, not refused. A field
// dropped inside a nested message still is loss.
func TestFieldAddedByANewerReleaseIsNotLoss(t *testing.T) {
	sc := storageConfig(t, "", "")
	gr := schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}
	node := &storage.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u3", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       storage.CSINodeSpec{Drivers: []storage.CSINodeDriver{{Name: "csi.example.com", NodeID: "node-1", TopologyKeys: []string{"zone"}}}},
	}
	current := write(t, sc, gr, node)
	var u runtime.Unknown
	if err := u.Unmarshal(current[4:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(u.Raw, []byte{0x1a, 0x00}) {
		t.Fatalf("the premise: 1.37 marshals an empty status (field 3) last; raw ends with % x", u.Raw[len(u.Raw)-4:])
	}
	wrap := func(raw []byte) []byte {
		v := u
		v.Raw = raw
		data, err := v.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return append([]byte("k8s\x00"), data...)
	}
	older := wrap(u.Raw[:len(u.Raw)-2])
	obj, err := decodeKV(t, "/registry/csinodes/node-1", older)
	if err != nil {
		t.Fatal(err)
	}
	d := NewPlanner(sc, nil).Decide(context.Background(), obj, nil)
	if d.Status != Stale || !bytes.Equal(d.NewValue, current) {
		t.Fatalf("a CSINode as 1.36 stores it: status %s err %v, want stale and rewritten as 1.37 writes it", d.Status, d.Err)
	}

	// The driver's nodeID (field 2 of CSINodeDriver) replaced by an unknown
	// field 9 of the same length: the types drop it.
	lossy := bytes.Replace(u.Raw[:len(u.Raw)-2], []byte{0x12, 0x06, 'n', 'o', 'd', 'e', '-', '1', 0x1a}, []byte{0x4a, 0x06, 'n', 'o', 'd', 'e', '-', '1', 0x1a}, 1)
	if bytes.Equal(lossy, u.Raw[:len(u.Raw)-2]) {
		t.Fatal("test bug: the driver's nodeID was not found")
	}
	obj, err = decodeKV(t, "/registry/csinodes/node-1", wrap(lossy))
	if err != nil {
		t.Fatal(err)
	}
	if d := NewPlanner(sc, nil).Decide(context.Background(), obj, nil); d.Status != Unreadable || d.Err.Reason != decode.ReasonWouldLoseFields {
		t.Fatalf("an unknown field inside a driver: status %s err %v, want would-lose-fields", d.Status, d.Err)
	}
}

// TestPreviousReleaseTypes: for --target-version 1.36 a CSINode is written
// as 1.36's types write it, without the empty status 1.37's always write,
// so that what 1.36 itself stored is current; a CSINode whose status holds
// something (1.36 has no such field) is refused, not silently cut.
func TestPreviousReleaseTypes(t *testing.T) {
	gr := schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}
	node := &storage.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u3", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       storage.CSINodeSpec{Drivers: []storage.CSINodeDriver{{Name: "csi.example.com", NodeID: "node-1"}}},
	}
	current := write(t, storageConfig(t, "", ""), gr, node)
	var u runtime.Unknown
	if err := u.Unmarshal(current[4:]); err != nil {
		t.Fatal(err)
	}
	u.Raw = bytes.TrimSuffix(u.Raw, []byte{0x1a, 0x00})
	data, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	as136 := append([]byte("k8s\x00"), data...)

	target := storageConfig(t, "1.36", "")
	if _, ok := target.ReleaseTypes(); !ok {
		t.Fatal("no generated types of 1.36 (go run ./internal/build/releasegen)")
	}
	obj, err := decodeKV(t, "/registry/csinodes/node-1", as136)
	if err != nil {
		t.Fatal(err)
	}
	if d := NewPlanner(target, nil).Decide(context.Background(), obj, nil); d.Status != Current {
		t.Errorf("a CSINode as 1.36 stores it, for 1.36: status %s %v %v, want current", d.Status, d.Reasons, d.Err)
	}
	obj, err = decodeKV(t, "/registry/csinodes/node-1", current)
	if err != nil {
		t.Fatal(err)
	}
	if d := NewPlanner(target, nil).Decide(context.Background(), obj, nil); d.Status != Stale || !bytes.Equal(d.NewValue, as136) {
		t.Errorf("a CSINode as 1.37 stores it, for 1.36: status %s %v %v, want stale and written as 1.36 does", d.Status, d.Reasons, d.Err)
	}

	node.Status.StorageHealth = []storage.StorageHealth{{Name: "csi.example.com"}}
	obj, err = decodeKV(t, "/registry/csinodes/node-1", write(t, storageConfig(t, "", ""), gr, node))
	if err != nil {
		t.Fatal(err)
	}
	d := NewPlanner(target, nil).Decide(context.Background(), obj, nil)
	if d.Status != Unreadable || d.Err.Reason != decode.ReasonWouldLoseFields || !strings.Contains(d.Err.Error(), "1.36") {
		t.Errorf("a CSINode with a status, for 1.36: status %s %v, want would-lose-fields naming 1.36", d.Status, d.Err)
	}
}

// TestPreviousReleaseTypesJSON is TestPreviousReleaseTypes for
// --storage-media-type=application/json and yaml: 1.37's types write a
// CSINode's empty status ("status":{}), 1.36's have no such field, so the
// value for 1.36 is 1.37's without it, and a status that holds something is
// refused; for 1.37, a CSINode 1.36 stored is rewritten with it (the
// lose-fields guard lets only zero values be added).
func TestPreviousReleaseTypesJSON(t *testing.T) {
	gr := schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}
	node := &storage.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "u3", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       storage.CSINodeSpec{Drivers: []storage.CSINodeDriver{{Name: "csi.example.com", NodeID: "node-1"}}},
	}
	for _, tc := range []struct{ media, status string }{
		{decode.MediaTypeJSON, `,"status":{}`},
		{decode.MediaTypeYAML, "status: {}\n"},
	} {
		current := write(t, storageConfig(t, "", tc.media), gr, node)
		if !bytes.Contains(current, []byte(tc.status)) {
			t.Fatalf("%s: the test's premise: 1.37 writes %q in %s", tc.media, tc.status, current)
		}
		as136 := bytes.Replace(current, []byte(tc.status), nil, 1)
		target := storageConfig(t, "1.36", tc.media)
		obj, err := decodeKV(t, "/registry/csinodes/node-1", as136)
		if err != nil {
			t.Fatal(err)
		}
		if d := NewPlanner(target, nil).Decide(context.Background(), obj, nil); d.Status != Current {
			t.Errorf("%s: a CSINode as 1.36 stores it, for 1.36: status %s %v %v, want current", tc.media, d.Status, d.Reasons, d.Err)
		}
		// For 1.37, what 1.36 stored loses nothing: 1.37's types only add
		// the empty status.
		if d := NewPlanner(storageConfig(t, "", tc.media), nil).Decide(context.Background(), obj, nil); d.Status != Stale || !bytes.Equal(d.NewValue, current) {
			t.Errorf("%s: a CSINode as 1.36 stores it, for 1.37: status %s %v %v, want stale and written as 1.37 does", tc.media, d.Status, d.Reasons, d.Err)
		}
		obj, err = decodeKV(t, "/registry/csinodes/node-1", current)
		if err != nil {
			t.Fatal(err)
		}
		if d := NewPlanner(target, nil).Decide(context.Background(), obj, nil); d.Status != Stale || !bytes.Equal(d.NewValue, as136) {
			t.Errorf("%s: a CSINode as 1.37 stores it, for 1.36: status %s %v %v, want stale and written as 1.36 does:\n%s\nwant\n%s", tc.media, d.Status, d.Reasons, d.Err, d.NewValue, as136)
		}
		withStatus := node.DeepCopy()
		withStatus.Status.StorageHealth = []storage.StorageHealth{{Name: "csi.example.com"}}
		obj, err = decodeKV(t, "/registry/csinodes/node-1", write(t, storageConfig(t, "", tc.media), gr, withStatus))
		if err != nil {
			t.Fatal(err)
		}
		d := NewPlanner(target, nil).Decide(context.Background(), obj, nil)
		if d.Status != Unreadable || d.Err.Reason != decode.ReasonWouldLoseFields || !strings.Contains(d.Err.Error(), "1.36") || !strings.Contains(d.Err.Error(), ".status") {
			t.Errorf("%s: a CSINode with a status, for 1.36: status %s %v, want would-lose-fields naming 1.36 and .status", tc.media, d.Status, d.Err)
		}
	}
}

func TestUnknownJSONFieldIsRefused(t *testing.T) {
	jsonSC := storageConfig(t, "", decode.MediaTypeJSON)
	value := write(t, jsonSC, secretsGR, secret())
	value = bytes.Replace(value, []byte(`"type":"Opaque"`), []byte(`"type":"Opaque","futureField":{"a":1}`), 1)
	obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
	if err != nil {
		t.Fatal(err)
	}
	d := NewPlanner(storageConfig(t, "", ""), nil).Decide(context.Background(), obj, nil)
	if d.Status != Unreadable || d.Err.Reason != decode.ReasonWouldLoseFields || !strings.Contains(d.Err.Error(), ".futureField") {
		t.Fatalf("status %s err %v", d.Status, d.Err)
	}
}

func TestUndecodableIsUnreadableAndNeverWritten(t *testing.T) {
	for name, value := range map[string][]byte{
		"garbage":        []byte("\x00\x01garbage"),
		"truncated":      []byte("k8s\x00\x0a\x0c\x0a\x02v1"),
		"unknown kind":   append([]byte("k8s\x00"), mustUnknown(t, "v1", "Gizmo")...),
		"kind mismatch":  append([]byte("k8s\x00"), mustUnknown(t, "v1", "ConfigMap")...),
		"bad json":       []byte(`{"apiVersion":"v1","kind":"Secret",`),
		"unknown vesion": []byte(`{"apiVersion":"v9","kind":"Secret"}`),
	} {
		obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
		if err == nil {
			t.Errorf("%s: decoded", name)
			continue
		}
		d := NewPlanner(storageConfig(t, "", ""), nil).Decide(context.Background(), obj, err)
		if d.Status != Unreadable || d.NewValue != nil || d.Err.Key != "/registry/secrets/ns1/s1" {
			t.Errorf("%s: %s %v", name, d.Status, d.Err)
		}
	}
}

func mustUnknown(t *testing.T, apiVersion, kind string) []byte {
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: []byte{}}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verify classifies: the same verdict as migrate's Decide, without encrypting a
// value it never writes.
func TestClassifyIsDecideWithoutTheValue(t *testing.T) {
	value := write(t, storageConfig(t, "1.34", ""), deviceClassesGR, deviceClass())
	target := storageConfig(t, "", "")
	decide := func(classify bool) Decision {
		obj, err := decodeKV(t, "/registry/deviceclasses/gpu", value)
		if err != nil {
			t.Fatal(err)
		}
		if classify {
			return NewPlanner(target, nil).Classify(context.Background(), obj, nil)
		}
		return NewPlanner(target, nil).Decide(context.Background(), obj, nil)
	}
	d, c := decide(false), decide(true)
	if c.Status != Stale || c.Status != d.Status || c.ReasonStrings() != d.ReasonStrings() || c.From != d.From || c.To != d.To {
		t.Fatalf("Classify: %s %q %v→%v; Decide: %s %q %v→%v", c.Status, c.ReasonStrings(), c.From, c.To, d.Status, d.ReasonStrings(), d.From, d.To)
	}
	if c.NewValue != nil || d.NewValue == nil {
		t.Fatalf("Classify computed a value to write (%d bytes), or Decide did not (%d bytes)", len(c.NewValue), len(d.NewValue))
	}
}

// --storage-media-type=application/yaml: kube-apiserver stores YAML; the tool reads it,
// keeps it current under that setting, and rewrites it to what another setting stores.
func TestYAMLStoredBuiltin(t *testing.T) {
	yamlSC := storageConfig(t, "", decode.MediaTypeYAML)
	value := write(t, yamlSC, secretsGR, secret())
	if !bytes.HasPrefix(value, []byte("apiVersion: v1\n")) {
		t.Fatalf("not YAML: %q", value[:16])
	}
	obj, err := decodeKV(t, "/registry/secrets/ns1/s1", value)
	if err != nil {
		t.Fatalf("decode YAML: %v", err)
	}
	if obj.MediaType != decode.MediaTypeYAML || obj.StoredGVK.Kind != "Secret" {
		t.Fatalf("decoded %s %s", obj.MediaType, obj.StoredGVK)
	}
	if d := NewPlanner(yamlSC, nil).Decide(context.Background(), obj, nil); d.Status != Current || d.From.MediaType != "yaml" {
		t.Fatalf("yaml target: %s %v from %+v", d.Status, d.Reasons, d.From)
	}
	protoSC := storageConfig(t, "", "")
	d := NewPlanner(protoSC, nil).Decide(context.Background(), obj, nil)
	if d.Status != Stale || d.ReasonStrings() != "media-type" || d.To.MediaType != "protobuf" {
		t.Fatalf("protobuf target: status %s reasons %v to %+v", d.Status, d.Reasons, d.To)
	}
	if want := write(t, protoSC, secretsGR, secret()); !bytes.Equal(d.NewValue, want) {
		t.Fatal("new value differs from what kube-apiserver stores as protobuf")
	}
	// JSON -> YAML, and a YAML field these types do not know is refused.
	jsonObj, err := decodeKV(t, "/registry/secrets/ns1/s1", write(t, storageConfig(t, "", decode.MediaTypeJSON), secretsGR, secret()))
	if err != nil {
		t.Fatal(err)
	}
	if d := NewPlanner(yamlSC, nil).Decide(context.Background(), jsonObj, nil); d.Status != Stale || !bytes.Equal(d.NewValue, value) {
		t.Fatalf("json -> yaml: %s %v", d.Status, d.Reasons)
	}
	future, err := decodeKV(t, "/registry/secrets/ns1/s1", bytes.Replace(value, []byte("type: Opaque\n"), []byte("futureField: 1\ntype: Opaque\n"), 1))
	if err != nil {
		t.Fatal(err)
	}
	if d := NewPlanner(protoSC, nil).Decide(context.Background(), future, nil); d.Status != Unreadable || d.Err.Reason != decode.ReasonWouldLoseFields {
		t.Fatalf("unknown YAML field: %s %v", d.Status, d.Err)
	}
}
