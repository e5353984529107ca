package apiservertest_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// servesGroupVersion reports whether discovery lists group/version.
func servesGroupVersion(t *testing.T, cs kubernetes.Interface, gv string) bool {
	t.Helper()
	_, err := cs.Discovery().ServerResourcesForGroupVersion(gv)
	if err == nil {
		return true
	}
	if apierrors.IsNotFound(err) {
		return false
	}
	t.Fatalf("discovery of %s: %v", gv, err)
	return false
}

// TestRestartWithDifferentEmulation starts an emulated 1.33 server, stops it,
// and starts a plain 1.36 server on the same etcd: the second server must not
// inherit the first one's emulated version, and must see the data written by
// the first one.
func TestRestartWithDifferentEmulation(t *testing.T) {
	etcd := testetcd.StartT(t, testetcd.Options{})
	ctx := context.Background()

	old := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL, EmulatedVersion: "1.33"})
	t.Logf("emulated 1.33 start-up: %s", old.StartupDuration)
	cs := kubernetes.NewForConfigOrDie(old.ClientConfig)
	// resource.k8s.io/v1 appeared in 1.34: not served when emulating 1.33.
	if servesGroupVersion(t, cs, "resource.k8s.io/v1") {
		t.Fatalf("emulated 1.33 server serves resource.k8s.io/v1")
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survives-restart"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	old.Stop()
	old.Stop() // idempotent

	cur := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL})
	t.Logf("1.36 start-up on existing data: %s", cur.StartupDuration)
	cs = kubernetes.NewForConfigOrDie(cur.ClientConfig)
	if !servesGroupVersion(t, cs, "resource.k8s.io/v1") {
		t.Fatalf("1.36 server started after an emulated one does not serve resource.k8s.io/v1: emulation leaked")
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "survives-restart", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("configmap written by the first server: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Fatalf("configmap data = %v, want k=v", got.Data)
	}
}
