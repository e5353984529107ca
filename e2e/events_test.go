package e2e

import (
	"bytes"
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/testrig/apiservertest"
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
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: encAll}, Resources: []string{"events"}}
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

// TestEventsJudgedByTheirGroup: Events live once for two groups (core v1
// and events.k8s.io/v1, one key), and kube-apiserver's field manager is per
// group: a no-op update through either drops the managedFields entries
// written through the other. Events a real kube-apiserver made through
// events.k8s.io/v1 (as kube-scheduler and the controllers on the new events
// API make them) and through the core group are current for verify, and
// migrate rewrites none of them. After a key rotation migrate rewrites them
// all, each as a no-op update through the group that wrote it would (its
// managedFields kept): the new kube-apiserver then serves the same Events,
// and a no-op update through that group (GET, then PUT unchanged) keeps
// every resourceVersion.
func TestEventsJudgedByTheirGroup(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	key1 := c.writeEncryptionConfig("events-key1.yaml", []string{"events"}, aescbcProvider("key1", 1), identityProvider)
	rc := c.start(apiservertest.Options{EncryptionConfigPath: key1})
	cs := kubernetes.NewForConfigOrDie(rc)
	const n = 3
	for i := 0; i < n; i++ {
		if _, err := cs.EventsV1().Events("default").Create(ctx, &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("new-api-%d", i)},
			EventTime:           metav1.NewMicroTime(time.Now()),
			ReportingController: "default-scheduler", ReportingInstance: "default-scheduler-node1",
			Action: "Binding", Reason: "Scheduled", Type: corev1.EventTypeNormal, Note: fmt.Sprintf("assigned default/web-%d to node1", i),
			Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("web-%d", i), APIVersion: "v1"},
		}, metav1.CreateOptions{FieldManager: "kube-scheduler"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("core-api-%d", i)},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("web-%d", i), APIVersion: "v1"},
			Reason:         "Pulled", Message: fmt.Sprintf("image pulled %d", i), Type: corev1.EventTypeNormal, Count: 1,
			Source: corev1.EventSource{Component: "kubelet", Host: "node1"},
		}, metav1.CreateOptions{FieldManager: "kubelet"}); err != nil {
			t.Fatal(err)
		}
	}
	// Each Event read through the group that wrote it; the premise: its
	// managedFields entry names that group.
	dyn := dynamic.NewForConfigOrDie(rc)
	groupOf := func(name string) schema.GroupVersionResource {
		if strings.HasPrefix(name, "new-api-") {
			return schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}
		}
		return schema.GroupVersionResource{Version: "v1", Resource: "events"}
	}
	names := []string{}
	for i := 0; i < n; i++ {
		names = append(names, fmt.Sprintf("new-api-%d", i), fmt.Sprintf("core-api-%d", i))
	}
	before := map[string]*unstructured.Unstructured{}
	for _, name := range names {
		gvr := groupOf(name)
		u, err := dyn.Resource(gvr).Namespace("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mf := u.GetManagedFields()
		if len(mf) != 1 || mf[0].APIVersion != gvr.GroupVersion().String() {
			t.Fatalf("%s: managedFields %+v, want one entry of %s", name, mf, gvr.GroupVersion())
		}
		before[name] = u
	}
	c.stop()

	// No rotation: every Event is current, none is rewritten.
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: key1}, Resources: []string{"events"}}
	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != verify.ExitCurrent || rep.Summary.Objects < 2*n {
		t.Fatalf("verify: exit %d, summary %+v; want exit 0 with at least %d Events", code, rep.Summary, 2*n)
	}
	revs := map[string]int64{}
	for _, name := range names {
		_, rev, _ := etcdValue(t, c.cli, "/registry/events/default/"+name)
		revs[name] = rev
	}
	if sum := c.migrate(cfg); sum.Summary.Rewritten != 0 {
		t.Fatalf("migrate rewrote %d Events, want 0 (summary %+v)", sum.Summary.Rewritten, sum.Summary)
	}
	for _, name := range names {
		if _, rev, _ := etcdValue(t, c.cli, "/registry/events/default/"+name); rev != revs[name] {
			t.Errorf("%s rewritten by a migrate that found it current", name)
		}
	}

	// Key rotation: every Event is rewritten under key2, as a no-op update
	// through its group writes it.
	key2 := c.writeEncryptionConfig("events-key2.yaml", []string{"events"}, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	cfg = pipeline.Config{Target: target.Input{EncryptionConfig: key2}, Resources: []string{"events"}}
	sum := c.migrate(cfg)
	if sum.Summary.Rewritten < 2*n || sum.Summary.Rewritten != sum.Summary.Scanned {
		t.Fatalf("migrate with key2 first rewrote %d of %d Events, want every one", sum.Summary.Rewritten, sum.Summary.Scanned)
	}
	for _, r := range sum.Resources {
		if r.Reasons["managed-fields"] > 0 {
			t.Errorf("%s: %d rewritten by managed-fields: %v", r.Resource, r.Reasons["managed-fields"], r.Reasons)
		}
	}
	c.expectCurrent(cfg)
	for _, name := range names {
		if v, _, _ := etcdValue(t, c.cli, "/registry/events/default/"+name); !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key2:")) {
			t.Errorf("%s not under key2 after the rotation", name)
		}
	}

	rc = c.start(apiservertest.Options{EncryptionConfigPath: c.writeEncryptionConfig("events-key2-only.yaml", []string{"events"}, aescbcProvider("key2", 2))})
	dyn = dynamic.NewForConfigOrDie(rc)
	for _, name := range names {
		ri := dyn.Resource(groupOf(name)).Namespace("default")
		got, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s after the rotation: %v", name, err)
		}
		if d := cmp.Diff(content(before[name]), content(got)); d != "" {
			t.Errorf("%s: content changed by the migration (-before +after):\n%s", name, d)
		}
		if d := cmp.Diff(before[name].GetManagedFields(), got.GetManagedFields()); d != "" {
			t.Errorf("%s: managedFields changed by the migration (-before +after):\n%s", name, d)
		}
		upd, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
		if err != nil {
			t.Fatalf("%s: no-op update through %s: %v", name, groupOf(name).GroupVersion(), err)
		}
		if upd.GetResourceVersion() != got.GetResourceVersion() {
			t.Errorf("%s: a no-op update through %s was written (resourceVersion %s -> %s)\n%s", name, groupOf(name).GroupVersion(),
				got.GetResourceVersion(), upd.GetResourceVersion(), cmp.Diff(got.Object, upd.Object))
		}
	}
}
