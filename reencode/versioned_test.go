package reencode

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
)

// TestKeptVersionedDecidesAlike: for an object whose version or media type
// is rewritten, the decode keeps the object kube-apiserver's serializer
// decoded (decode.Decoder.KeepVersioned, which the pipeline sets to
// Planner.Converts) and the lose-fields guard reads it instead of decoding the
// value once more. Every decision is the same either way, refusals included,
// and what is kept is the stored object before the codec defaults it.
func TestKeptVersionedDecidesAlike(t *testing.T) {
	proto := storageConfig(t, "", "")
	jsonSC := storageConfig(t, "", decode.MediaTypeJSON)
	yamlSC := storageConfig(t, "", decode.MediaTypeYAML)
	podsGR := schema.GroupResource{Resource: "pods"}
	pod := &api.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "ns1", UID: "u4", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       api.PodSpec{Containers: []api.Container{{Name: "c", Image: "busybox"}}},
	}
	jsonPod := write(t, jsonSC, podsGR, pod)
	if bytes.Contains(jsonPod, []byte("restartPolicy")) {
		t.Fatalf("the test's premise: the stored pod has no restartPolicy (defaulting adds it): %s", jsonPod)
	}
	cases := []struct {
		name, key string
		value     []byte
		target    *decode.StorageConfig
		want      Status
	}{
		{"a JSON pod, to protobuf", "/registry/pods/ns1/p1", jsonPod, proto, Stale},
		{"a JSON pod, to YAML", "/registry/pods/ns1/p1", jsonPod, yamlSC, Stale},
		{"a JSON secret with a field these types lack", "/registry/secrets/ns1/s1",
			bytes.Replace(write(t, jsonSC, secretsGR, secret()), []byte(`"type":"Opaque"`), []byte(`"type":"Opaque","futureField":{"a":1}`), 1), proto, Unreadable},
		{"a YAML secret with a field these types lack", "/registry/secrets/ns1/s1",
			bytes.Replace(write(t, yamlSC, secretsGR, secret()), []byte("type: Opaque\n"), []byte("futureField: 1\ntype: Opaque\n"), 1), proto, Unreadable},
		{"a DeviceClass as 1.34 stores it", "/registry/deviceclasses/gpu", write(t, storageConfig(t, "1.34", ""), deviceClassesGR, deviceClass()), proto, Stale},
		{"a DeviceClass as 1.34 stores it, with a field these types lack", "/registry/deviceclasses/gpu",
			withProtobufField(t, write(t, storageConfig(t, "1.34", ""), deviceClassesGR, deviceClass())), proto, Unreadable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlanner(tc.target, nil)
			again, err := decodeWith(t, tc.key, tc.value, nil)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := decodeWith(t, tc.key, tc.value, p.Converts)
			if err != nil {
				t.Fatal(err)
			}
			if again.Versioned != nil || kept.Versioned == nil {
				t.Fatalf("kept without KeepVersioned: %v; with it: %v (want only with it)", again.Versioned != nil, kept.Versioned != nil)
			}
			if kept.Versioned.GVK != kept.StoredGVK {
				t.Errorf("kept as %s, stored as %s", kept.Versioned.GVK, kept.StoredGVK)
			}
			a, b := p.Decide(context.Background(), again, nil), p.Decide(context.Background(), kept, nil)
			if a.Status != tc.want {
				t.Fatalf("decoded again: status %s %v %v, want %s", a.Status, a.Reasons, a.Err, tc.want)
			}
			if b.Status != a.Status || b.ReasonStrings() != a.ReasonStrings() || !bytes.Equal(b.NewValue, a.NewValue) || fmt.Sprint(b.Err) != fmt.Sprint(a.Err) {
				t.Errorf("kept: %s %s %v (%d bytes); decoded again: %s %s %v (%d bytes)", b.Status, b.ReasonStrings(), b.Err, len(b.NewValue), a.Status, a.ReasonStrings(), a.Err, len(a.NewValue))
			}
		})
	}

	// What is kept is what the serializer decoded, not the defaulted object.
	kept, err := decodeWith(t, "/registry/pods/ns1/p1", jsonPod, NewPlanner(proto, nil).Converts)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := kept.Versioned.Object.(*corev1.Pod)
	if !ok {
		t.Fatalf("kept a %T, want a v1 Pod", kept.Versioned.Object)
	}
	if v.Spec.RestartPolicy != "" || kept.Internal.(*api.Pod).Spec.RestartPolicy != api.RestartPolicyAlways {
		t.Errorf("restartPolicy kept %q, decoded %q: want it only in the decoded (defaulted) pod", v.Spec.RestartPolicy, kept.Internal.(*api.Pod).Spec.RestartPolicy)
	}
}

// TestKeptOnlyWhenConverted: an object written in its stored version and
// media type is not copied.
func TestKeptOnlyWhenConverted(t *testing.T) {
	proto := storageConfig(t, "", "")
	obj, err := decodeWith(t, "/registry/secrets/ns1/s1", write(t, proto, secretsGR, secret()), NewPlanner(proto, nil).Converts)
	if err != nil {
		t.Fatal(err)
	}
	if obj.Versioned != nil {
		t.Error("a current secret's versioned object was kept")
	}
	p := NewPlanner(proto, nil)
	p.EncryptionOnly = true
	obj, err = decodeWith(t, "/registry/secrets/ns1/s1", write(t, storageConfig(t, "", decode.MediaTypeJSON), secretsGR, secret()), p.Converts)
	if err != nil {
		t.Fatal(err)
	}
	if obj.Versioned != nil {
		t.Error("kept under --encryption-only, which never re-encodes")
	}
}

// decodeWith decodes as kube-apiserver 1.37 with protobuf storage reads,
// keeping the versioned objects keep asks for.
func decodeWith(t *testing.T, key string, value []byte, keep func(schema.GroupResource, schema.GroupVersionKind, string) bool) (*decode.Object, error) {
	t.Helper()
	sc := storageConfig(t, "", "")
	dec := decode.NewDecoder(decode.NewResolver("/registry", sc), sc, nil)
	dec.KeepVersioned = keep
	return dec.Decode(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: 7})
}

// withProtobufField adds a field numbered 99 to the object inside a
// protobuf-stored value, as a newer release adding a field would.
func withProtobufField(t *testing.T, value []byte) []byte {
	t.Helper()
	var u runtime.Unknown
	if err := u.Unmarshal(value[4:]); err != nil {
		t.Fatal(err)
	}
	u.Raw = append(u.Raw, 0x9a, 0x06, 0x03, 'n', 'e', 'w') // field 99, wire type 2, "new"
	raw, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("k8s\x00"), raw...)
}
