package e2e

import (
	"bytes"
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/apis/resource"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/verify"
)

// TestEncryptionOnlyRotation: a key rotation with migrate --encryption-only
// (pipeline.Config.EncryptionOnly). A real kube-apiserver wrote Secrets and
// ConfigMaps under key1; a DeviceClass under key1 is stored as kube-apiserver
// 1.34 stored it (resource.k8s.io/v1beta2, stale by version for 1.37). The
// migration moves every value to key2 with its decrypted bytes unchanged (the
// DeviceClass stays v1beta2); verify --encryption-only is then 0 and plain
// verify 3 (the DeviceClass only). kube-apiserver with key2 alone serves every
// object with the same content, and a no-op update of the Secrets and
// ConfigMaps keeps their resourceVersion.
func TestEncryptionOnlyRotation(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	resources := []string{"secrets", "configmaps", "deviceclasses.resource.k8s.io"}
	key1 := c.writeEncryptionConfig("key1.yaml", resources, aescbcProvider("key1", 1), identityProvider)
	rc := c.start(apiservertest.Options{EncryptionConfigPath: key1})
	cs := kubernetes.NewForConfigOrDie(rc)
	const n = 3
	for i := 0; i < n; i++ {
		if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i)}, StringData: map[string]string{"password": fmt.Sprintf("pw-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm%d", i)}, Data: map[string]string{"k": fmt.Sprintf("v%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gvrs := []schema.GroupVersionResource{{Version: "v1", Resource: "secrets"}, {Version: "v1", Resource: "configmaps"}}
	before := snapshot(t, rc, gvrs)
	for k := range before {
		if k.Namespace != "default" {
			delete(before, k) // kube-apiserver's own, which it may write again at its next start
		}
	}
	c.stop()

	// The DeviceClass, as kube-apiserver 1.34 stored it under key1.
	dcGR := schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}
	rel134, err := release.Named("1.34")
	if err != nil {
		t.Fatal(err)
	}
	old, err := decode.NewStorageConfigFor(decode.StorageOptions{Release: rel134})
	if err != nil {
		t.Fatal(err)
	}
	codec, err := old.Codec(dcGR)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := runtime.Encode(codec.Codec, &resource.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", UID: "4d2b1c7e-0000-4000-8000-000000000003", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       resource.DeviceClassSpec{Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const dcKey = "/registry/deviceclasses/gpu"
	enc1, err := encryption.Load(ctx, key1)
	if err != nil {
		t.Fatal(err)
	}
	defer enc1.Close()
	value, err := enc1.Encrypt(ctx, dcGR, dcKey, plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.cli.Put(ctx, dcKey, string(value)); err != nil {
		t.Fatal(err)
	}

	key2 := c.writeEncryptionConfig("key2.yaml", resources, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	enc2, err := encryption.Load(ctx, key2)
	if err != nil {
		t.Fatal(err)
	}
	defer enc2.Close()
	keys := map[string]schema.GroupResource{dcKey: dcGR}
	for k := range before {
		keys[fmt.Sprintf("/registry/%s/%s/%s", k.GVR.Resource, k.Namespace, k.Name)] = k.GVR.GroupResource()
	}
	decrypted := func() map[string][]byte {
		out := map[string][]byte{}
		for key, gr := range keys {
			v, _, _ := etcdValue(t, c.cli, key)
			p, info, err := enc2.Decrypt(ctx, gr, key, v)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if info.KeyName == "key2" {
				t.Logf("%s already under key2", key)
			}
			out[key] = p
		}
		return out
	}
	plainBefore := decrypted()

	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: key2, EncryptionOnly: true}}
	sum := c.migrate(cfg)
	if sum.Summary.Rewritten < int64(len(keys)) || sum.Summary.Rewritten != sum.Summary.Stale {
		t.Errorf("migrate --encryption-only rewrote %d, want at least the %d objects under key1", sum.Summary.Rewritten, len(keys))
	}
	for key, p := range decrypted() {
		if !bytes.Equal(p, plainBefore[key]) {
			t.Errorf("%s: decrypted value changed by migrate --encryption-only (%d bytes before, %d after)", key, len(plainBefore[key]), len(p))
		}
		if v, _, _ := etcdValue(t, c.cli, key); !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key2:")) {
			t.Errorf("%s: not under key2", key)
		}
	}
	if code := c.verify(cfg).ExitCode(); code != verify.ExitCurrent {
		t.Errorf("verify --encryption-only after: exit %d, want 0", code)
	}
	rep := c.verify(pipeline.Config{Target: target.Input{EncryptionConfig: key2}})
	if stale := staleResources(t, rep); rep.ExitCode() != verify.ExitStale || !cmp.Equal(stale, []string{"deviceclasses.resource.k8s.io"}) {
		t.Errorf("verify after: exit %d, stale %v; want 3, the DeviceClass stored as v1beta2", rep.ExitCode(), stale)
	}

	rc = c.start(apiservertest.Options{EncryptionConfigPath: c.writeEncryptionConfig("key2-only.yaml", resources, aescbcProvider("key2", 2))})
	sameContent(t, rc, before)
	dyn := dynamic.NewForConfigOrDie(rc)
	if _, err := dyn.Resource(dcGR.WithVersion("v1")).Get(ctx, "gpu", metav1.GetOptions{}); err != nil {
		t.Errorf("DeviceClass gpu under key2, still v1beta2: %v", err)
	}
	for k := range before {
		ri := dyn.Resource(k.GVR).Namespace(k.Namespace)
		got, err := ri.Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		upd, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
		if err != nil {
			t.Fatalf("%s: no-op update: %v", k, err)
		}
		if upd.GetResourceVersion() != got.GetResourceVersion() {
			t.Errorf("%s: a no-op update was written (resourceVersion %s -> %s)", k, got.GetResourceVersion(), upd.GetResourceVersion())
		}
	}
}
