package target

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
)

// FuzzKubeadmConfig reads arbitrary values of kubeadm's kubeadm-config
// ConfigMap as the release's evidence (when nothing else names the
// release): nothing panics or hangs, and a value that cannot be read is one
// line naming the key. The seeds are that ConfigMap as kube-apiserver stores
// it (protobuf, and JSON as with --storage-media-type=application/json) and
// the ConfigMap kube-apiserver 1.36.3 wrote (testdata/captured).
func FuzzKubeadmConfig(f *testing.F) {
	cm := &api.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: "kube-system", UID: "uid-kubeadm-config", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Data:       map[string]string{"ClusterConfiguration": "apiServer: {}\napiVersion: kubeadm.k8s.io/v1beta4\ncertificatesDir: /etc/kubernetes/pki\nclusterName: kubernetes\nkind: ClusterConfiguration\nkubernetesVersion: v1.36.3\nnetworking:\n  serviceSubnet: 10.96.0.0/12\n"},
	}
	for _, media := range []string{"", runtime.ContentTypeJSON} {
		sc, err := decode.NewStorageConfig(media)
		if err != nil {
			f.Fatal(err)
		}
		rc, err := sc.Codec(schema.GroupResource{Resource: "configmaps"})
		if err != nil {
			f.Fatal(err)
		}
		v, err := runtime.Encode(rc.Codec, cm)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v)
	}
	captured, err := os.ReadFile("../testdata/captured/configmap-identity.bin")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(captured)
	enc, err := encryption.Load(context.Background(), "")
	if err != nil {
		f.Fatal(err)
	}
	key := KubeadmConfigKey("/registry")
	f.Fuzz(func(t *testing.T, value []byte) {
		watchdog := time.AfterFunc(30*time.Second, func() { panic(fmt.Sprintf("reading %q hangs", value)) })
		defer watchdog.Stop()
		_, err := kubeadmRelease(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: 2}, "/registry", enc)
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, key) {
				t.Fatalf("%q: want one line naming %s", msg, key)
			}
		}
	})
}
