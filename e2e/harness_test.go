package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testetcd"
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
	cli := etcd.ClientT(t)

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

// capturedDir holds the reference values captured from kube-apiserver 1.36.3.
const capturedDir = "../testdata/captured"

// capturedEncryptionConfig is the EncryptionConfiguration the capture runs
// with: aescbc key1 then identity for secrets. Its key is a fixed test key.
const capturedEncryptionConfig = "encryption-config.yaml"

// Sidecar describes one captured value (the .json next to the .bin).
type Sidecar struct {
	Key              string `json:"key"`
	ModRevision      int64  `json:"modRevision"`
	CreateRevision   int64  `json:"createRevision"`
	Version          int64  `json:"version"`
	Lease            bool   `json:"lease"`
	EncryptionConfig string `json:"encryptionConfig"`
	// Provider is the encryption prefix of the stored bytes, e.g.
	// "k8s:enc:aescbc:v1:key1:", or "identity".
	Provider string `json:"provider"`
	// Encoding of the plaintext: protobuf, json or cbor.
	Encoding   string `json:"encoding"`
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Source     string `json:"source"`
}

// valueShape is what a captured value must keep from one capture to the next.
type valueShape struct {
	Key, Provider, Encoding, APIVersion, Kind string
	Lease                                     bool
}

func (s Sidecar) shape() valueShape {
	return valueShape{Key: s.Key, Provider: s.Provider, Encoding: s.Encoding, APIVersion: s.APIVersion, Kind: s.Kind, Lease: s.Lease}
}

// describeValue decrypts value (if it carries an encryption prefix) with the
// capture's EncryptionConfiguration and reads the stored apiVersion/kind.
func describeValue(ctx context.Context, enc *encryptionconfig.EncryptionConfiguration, gr schema.GroupResource, key string, stored []byte, lease bool) (valueShape, error) {
	sh := valueShape{Key: key, Provider: "identity", Lease: lease}
	plain := stored
	if bytes.HasPrefix(stored, []byte("k8s:enc:")) {
		parts := strings.SplitN(string(stored), ":", 6)
		if len(parts) < 6 {
			return sh, fmt.Errorf("%s: truncated encryption prefix", key)
		}
		sh.Provider = strings.Join(parts[:5], ":") + ":"
		tr, ok := enc.Transformers[gr]
		if !ok {
			return sh, fmt.Errorf("%s: encrypted but the capture config has no transformer for %s", key, gr)
		}
		var err error
		plain, _, err = tr.TransformFromStorage(ctx, stored, value.DefaultContext(key))
		if err != nil {
			return sh, fmt.Errorf("%s: decrypt: %w", key, err)
		}
	}
	switch {
	case bytes.HasPrefix(plain, protobufMagic):
		sh.Encoding = "protobuf"
		tm, err := storedTypeMeta(key, plain)
		if err != nil {
			return sh, err
		}
		sh.APIVersion, sh.Kind = tm.APIVersion, tm.Kind
	case bytes.HasPrefix(plain, []byte{0xd9, 0xd9, 0xf7}):
		sh.Encoding = "cbor"
	case bytes.HasPrefix(plain, []byte("{")):
		sh.Encoding = "json"
		var tm metav1.TypeMeta
		if err := json.Unmarshal(plain, &tm); err != nil {
			return sh, fmt.Errorf("%s: decode JSON type meta: %w", key, err)
		}
		sh.APIVersion, sh.Kind = tm.APIVersion, tm.Kind
	default:
		return sh, fmt.Errorf("%s: unknown encoding (first bytes %x)", key, plain[:min(len(plain), 4)])
	}
	return sh, nil
}

// capture is one value to capture: its file name, etcd key and resource.
type capture struct {
	name string
	key  string
	gr   schema.GroupResource
}

var captures = []capture{
	{"secret-aescbc", "/registry/secrets/default/db-credentials", schema.GroupResource{Resource: "secrets"}},
	{"deployment-protobuf", "/registry/deployments/default/web", schema.GroupResource{Group: "apps", Resource: "deployments"}},
	{"crd", "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}},
	{"customresource-json", "/registry/example.com/widgets/default/my-widget", schema.GroupResource{Group: "example.com", Resource: "widgets"}},
	{"event-leased", "/registry/events/default/captured-event", schema.GroupResource{Resource: "events"}},
	{"configmap-identity", "/registry/configmaps/default/app-config", schema.GroupResource{Resource: "configmaps"}},
}

// createCapturedObjects writes, through the API, the objects whose stored
// bytes are captured.
func createCapturedObjects(ctx context.Context, t *testing.T, srv *apiservertest.Server) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(srv.ClientConfig)
	ns := "default"
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db-credentials", Labels: map[string]string{"app": "web"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"username": []byte("web"), "password": []byte("not-a-real-password")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create secret default/db-credentials: %v", err)
	}
	replicas := int32(2)
	labels := map[string]string{"app": "web"}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "web", Image: "registry.k8s.io/pause:3.10",
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment default/web: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "app-config"},
		Data:       map[string]string{"log-level": "info", "feature.enabled": "true"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap default/app-config: %v", err)
	}
	if _, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "captured-event"},
		InvolvedObject: corev1.ObjectReference{Kind: "Deployment", Namespace: ns, Name: "web", APIVersion: "apps/v1"},
		Reason:         "ScalingReplicaSet",
		Message:        "Scaled up replica set web-abc to 2",
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "deployment-controller"},
		Count:          1,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create event default/captured-event: %v", err)
	}

	// A simple namespaced CRD and one custom resource.
	ext := apiextensionsclient.NewForConfigOrDie(srv.ClientConfig)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"size":  {Type: "integer"},
							"color": {Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"blue"`)}},
						}},
					},
				}},
			}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD widgets.example.com: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(srv.ClientConfig)
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}).Namespace(ns)
	cr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "my-widget"},
		"spec":     map[string]any{"size": int64(3)},
	}}
	// The CRD is served once the apiserver has established it.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := widgets.Create(ctx, cr, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("create widget default/my-widget (CRD never served?): %v", err)
	}
	// Let the CRD status settle (Established, NamesAccepted) before reading it.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD widgets.example.com never became Established: %v", err)
	}
}

// TestCapturedValues runs kube-apiserver 1.36.3 with the capture's
// EncryptionConfiguration, creates one object of each kind through the API and
// reads their raw etcd values. With KEM_RECAPTURE=1 it rewrites
// testdata/captured; otherwise it checks that today's values have the same
// shape (key, encryption provider prefix, encoding, stored apiVersion/kind,
// lease) as the committed ones, and that each committed sidecar describes its
// committed bytes. Bytes are not compared: ciphertext and timestamps differ.
func TestCapturedValues(t *testing.T) {
	ctx := context.Background()
	recapture := os.Getenv("KEM_RECAPTURE") == "1"
	encPath, err := filepath.Abs(filepath.Join(capturedDir, capturedEncryptionConfig))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := encryptionconfig.LoadEncryptionConfig(ctx, encPath, false, "kube-etcd-migrate-e2e")
	if err != nil {
		t.Fatalf("load %s: %v", encPath, err)
	}

	etcd := testetcd.StartT(t, testetcd.Options{})
	cli := etcd.ClientT(t)
	srv := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL, EncryptionConfigPath: encPath})
	createCapturedObjects(ctx, t, srv)

	for _, c := range captures {
		kv := etcdGet(t, cli, c.key).Kvs[0]
		fresh, err := describeValue(ctx, enc, c.gr, c.key, kv.Value, kv.Lease != 0)
		if err != nil {
			t.Fatalf("captured %s: %v", c.name, err)
		}
		binPath := filepath.Join(capturedDir, c.name+".bin")
		jsonPath := filepath.Join(capturedDir, c.name+".json")
		if recapture {
			side := Sidecar{
				Key: c.key, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version,
				Lease: kv.Lease != 0, EncryptionConfig: capturedEncryptionConfig,
				Provider: fresh.Provider, Encoding: fresh.Encoding, APIVersion: fresh.APIVersion, Kind: fresh.Kind,
				Source: "kube-apiserver v1.36.3 (k8s.io/kubernetes, in-process) on etcd v3.6.8",
			}
			js, err := json.MarshalIndent(side, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(binPath, kv.Value, 0o644); err != nil {
				t.Fatalf("write %s: %v", binPath, err)
			}
			if err := os.WriteFile(jsonPath, append(js, '\n'), 0o644); err != nil {
				t.Fatalf("write %s: %v", jsonPath, err)
			}
			t.Logf("recaptured %s: %+v", c.name, fresh)
			continue
		}

		committedBytes, err := os.ReadFile(binPath)
		if err != nil {
			t.Fatalf("committed value %s missing (run with KEM_RECAPTURE=1 to create it): %v", binPath, err)
		}
		js, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatalf("committed sidecar %s missing: %v", jsonPath, err)
		}
		var side Sidecar
		if err := json.Unmarshal(js, &side); err != nil {
			t.Fatalf("%s: %v", jsonPath, err)
		}
		committed, err := describeValue(ctx, enc, c.gr, side.Key, committedBytes, side.Lease)
		if err != nil {
			t.Fatalf("committed %s: %v", binPath, err)
		}
		if committed != side.shape() {
			t.Errorf("%s: sidecar says %+v, committed bytes are %+v", c.name, side.shape(), committed)
		}
		if fresh != committed {
			t.Errorf("%s: kube-apiserver 1.36.3 now stores %+v, committed capture is %+v", c.name, fresh, committed)
		}
	}
}
