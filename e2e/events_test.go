package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// eventTTL is kube-apiserver's --event-ttl in this test: short enough to watch
// the events expire, long enough for stop + migrate + restart.
const eventTTL = 40 * time.Second

// TestEventLeasesSurviveMigration: events carry an etcd lease (--event-ttl).
// Encrypting them offline keeps each event on its lease (same lease ID in
// etcd), kube-apiserver serves them encrypted, and they still disappear when
// the lease expires.
func TestEventLeasesSurviveMigration(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	ttlFlag := fmt.Sprintf("--event-ttl=%s", eventTTL)

	rc := c.start(apiservertest.Options{ExtraFlags: []string{ttlFlag}})
	cs := kubernetes.NewForConfigOrDie(rc)
	const n = 3
	for i := 0; i < n; i++ {
		if _, err := cs.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("ev-%d", i)},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0", APIVersion: "v1"},
			Reason:         "Scheduled", Message: fmt.Sprintf("message %d", i), Type: corev1.EventTypeNormal, Count: 1,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.stop()
	leases := map[string]int64{}
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("/registry/events/default/ev-%d", i)
		_, _, lease := etcdValue(t, c.cli, key)
		if lease == 0 {
			t.Fatalf("%s has no etcd lease", key)
		}
		leases[key] = lease
	}

	// Encrypt events offline.
	encAll := c.writeEncryptionConfig("events-aescbc.yaml", []string{"events"}, aescbcProvider("key1", 1), identityProvider)
	cfg := pipeline.Config{EncryptionConfig: encAll, Resources: []string{"events"}}
	if code := c.verify(cfg).ExitCode(); code != verify.ExitStale {
		t.Fatalf("verify exit %d, want 3", code)
	}
	sum := c.migrate(cfg)
	if sum.Summary.Rewritten < n {
		t.Fatalf("migrate rewrote %d events, want at least %d", sum.Summary.Rewritten, n)
	}
	c.expectCurrent(cfg)
	for key, lease := range leases {
		v, _, got := etcdValue(t, c.cli, key)
		if got != lease {
			t.Errorf("%s: etcd lease %x after migrate, want %x (the event would never expire)", key, got, lease)
		}
		if !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key1:")) {
			t.Errorf("%s not encrypted by the migration", key)
		}
		ttl, err := c.cli.TimeToLive(ctx, clientv3.LeaseID(lease), clientv3.WithAttachedKeys())
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("lease %x of %s: ttl %+v err %v", lease, key, ttl, err)
		}
	}

	// kube-apiserver with only aescbc serves them, until their lease expires.
	rc = c.start(apiservertest.Options{ExtraFlags: []string{ttlFlag},
		EncryptionConfigPath: c.writeEncryptionConfig("events-aescbc-only.yaml", []string{"events"}, aescbcProvider("key1", 1))})
	cs = kubernetes.NewForConfigOrDie(rc)
	for i := 0; i < n; i++ {
		ev, err := cs.CoreV1().Events("default").Get(ctx, fmt.Sprintf("ev-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("event ev-%d after migrate: %v", i, err)
		}
		if ev.Message != fmt.Sprintf("message %d", i) || ev.Reason != "Scheduled" {
			t.Errorf("event ev-%d served as %q/%q", i, ev.Reason, ev.Message)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*eventTTL, false, func(ctx context.Context) (bool, error) {
		for key := range leases {
			resp, err := c.cli.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the migrated events never expired from etcd: %v", err)
	}
	for i := 0; i < n; i++ {
		if _, err := cs.CoreV1().Events("default").Get(ctx, fmt.Sprintf("ev-%d", i), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("event ev-%d after its lease expired: err %v, want NotFound", i, err)
		}
	}
}
