package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/apiservertest"
	"kube-etcd-migrate/internal/testetcd"
)

// protobufMagic prefixes every protobuf-encoded object kube-apiserver stores.
var protobufMagic = []byte("k8s\x00")

// storedTypeMeta decodes the runtime.Unknown envelope of a protobuf value.
func storedTypeMeta(key string, value []byte) (runtime.TypeMeta, error) {
	if !bytes.HasPrefix(value, protobufMagic) {
		return runtime.TypeMeta{}, fmt.Errorf("%s: value is not protobuf (starts with %q)", key, value[:min(len(value), 8)])
	}
	var u runtime.Unknown
	if err := u.Unmarshal(value[len(protobufMagic):]); err != nil {
		return runtime.TypeMeta{}, fmt.Errorf("%s: decode runtime.Unknown: %w", key, err)
	}
	return u.TypeMeta, nil
}

// etcdGet reads one key directly from etcd and fails the test when it is absent.
func etcdGet(t *testing.T, cli *clientv3.Client, key string) *clientv3.GetResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("etcd get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("etcd get %s: %d keys, want 1", key, len(resp.Kvs))
	}
	return resp
}

func etcdClient(t *testing.T, etcd *testetcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := etcd.Client()
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// assertStoredAs reads key from etcd and checks the protobuf envelope's apiVersion and kind.
func assertStoredAs(t *testing.T, cli *clientv3.Client, key, apiVersion, kind, why string) {
	t.Helper()
	tm, err := storedTypeMeta(key, etcdGet(t, cli, key).Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if tm.APIVersion != apiVersion || tm.Kind != kind {
		t.Fatalf("%s stored as %s %s %s, want %s %s", key, tm.APIVersion, tm.Kind, why, apiVersion, kind)
	}
}

// TestAPIServerEmulatedStorageVersion proves the harness and the fact the
// upgrade scenario relies on: what an older kube-apiserver stored stays in
// etcd in the older version after an upgrade. kube-apiserver 1.36.3 emulating
// 1.33 stores DRA DeviceClasses as resource.k8s.io/v1beta1, emulating 1.34 as
// v1beta2, and plain 1.36 as v1; the 1.36 server reads the old objects without
// rewriting them. Events carry an etcd lease across restarts.
//
// Storage version under emulation = the highest-priority version introduced no
// later than the min compatibility version (emulated - 1): v1beta2 came in 1.33,
// so it is only picked from emulated 1.34 on (or with
// --emulated-version=1.33 --min-compatibility-version=1.33).
func TestAPIServerEmulatedStorageVersion(t *testing.T) {
	ctx := context.Background()
	etcd := testetcd.StartT(t, testetcd.Options{})
	cli := etcdClient(t, etcd)

	// Phase 1: kube-apiserver 1.36.3 emulating 1.33, DRA (beta, off by default in 1.33) turned on.
	s133 := apiservertest.Start(t, apiservertest.Options{
		EtcdURL:         etcd.URL,
		EmulatedVersion: "1.33",
		FeatureGates:    "DynamicResourceAllocation=true",
		RuntimeConfig:   "resource.k8s.io/v1beta1=true",
	})
	cs := kubernetes.NewForConfigOrDie(s133.ClientConfig)
	if _, err := cs.ResourceV1beta1().DeviceClasses().Create(ctx,
		&resourcev1beta1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-133"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass through resource.k8s.io/v1beta1 on the emulated 1.33 server: %v", err)
	}
	assertStoredAs(t, cli, "/registry/deviceclasses/gpu-133", "resource.k8s.io/v1beta1", "DeviceClass", "under emulated 1.33")

	// Events are written with a lease (--event-ttl).
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "leased-event", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "DeviceClass", Name: "gpu-133", APIVersion: "resource.k8s.io/v1beta1"},
		Reason:         "Test",
		Message:        "event written by the emulated server",
		Type:           corev1.EventTypeNormal,
	}
	if _, err := cs.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Event: %v", err)
	}
	evKey := "/registry/events/default/leased-event"
	lease := etcdGet(t, cli, evKey).Kvs[0].Lease
	if lease == 0 {
		t.Fatalf("%s has no etcd lease", evKey)
	}
	s133.Stop()

	// Phase 2: emulating 1.34 (DRA GA, resource.k8s.io/v1 served).
	s134 := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL, EmulatedVersion: "1.34"})
	cs = kubernetes.NewForConfigOrDie(s134.ClientConfig)
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx,
		&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-134"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass through resource.k8s.io/v1 on the emulated 1.34 server: %v", err)
	}
	assertStoredAs(t, cli, "/registry/deviceclasses/gpu-134", "resource.k8s.io/v1beta2", "DeviceClass", "under emulated 1.34")
	s134.Stop()

	// Phase 3: the same etcd under a plain kube-apiserver 1.36.3.
	s136 := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL})
	cs = kubernetes.NewForConfigOrDie(s136.ClientConfig)
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx,
		&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-136"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass through resource.k8s.io/v1 on 1.36: %v", err)
	}
	assertStoredAs(t, cli, "/registry/deviceclasses/gpu-136", "resource.k8s.io/v1", "DeviceClass", "on 1.36")

	// The objects stored by the older servers still read back, and a read
	// does not rewrite them: they stay stale in etcd until migrated.
	for name, stored := range map[string]string{"gpu-133": "resource.k8s.io/v1beta1", "gpu-134": "resource.k8s.io/v1beta2"} {
		got, err := cs.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("read %s (stored as %s) through resource.k8s.io/v1 on 1.36: %v", name, stored, err)
		}
		if got.Name != name {
			t.Fatalf("got DeviceClass %q, want %q", got.Name, name)
		}
		assertStoredAs(t, cli, "/registry/deviceclasses/"+name, stored, "DeviceClass", "after a read on 1.36")
	}
	// The event kept its lease across the restarts.
	if got := etcdGet(t, cli, evKey).Kvs[0].Lease; got != lease {
		t.Fatalf("%s lease = %x after restarts, want %x", evKey, got, lease)
	}
}
