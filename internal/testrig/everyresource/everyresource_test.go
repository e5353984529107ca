package everyresource_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestCreate writes one object of every resource the linked kube-apiserver
// (beta APIs on) persists: nothing served lacks a stub, every object is
// served with the three field managers' entries, and sits in etcd where
// Kubernetes' storage test expects it, including objects of versions that
// are not the storage version.
func TestCreate(t *testing.T) {
	ctx := context.Background()
	etcd := testetcd.StartT(t, testetcd.Options{})
	srv := apiservertest.Start(t, apiservertest.Options{EtcdURL: etcd.URL, RuntimeConfig: "api/beta=true"})
	res, err := everyresource.Create(ctx, srv.ClientConfig, everyresource.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missing) > 0 {
		t.Errorf("served and persisted without a stub in Kubernetes' storage data at %s: %v", res.Version, res.Missing)
	}
	t.Logf("%d objects at %s", len(res.Objects), res.Version)
	dyn := dynamic.NewForConfigOrDie(srv.ClientConfig)
	cli := etcd.ClientT(t)
	versions := map[schema.GroupResource]int{}
	applied, status := 0, 0
	for _, o := range res.Objects {
		versions[o.GVR.GroupResource()]++
		got, err := dyn.Resource(o.GVR).Namespace(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: %v", o, err)
			continue
		}
		managers := map[string]bool{}
		for _, e := range got.GetManagedFields() {
			managers[e.Manager] = true
		}
		if !managers[everyresource.CreateManager] || got.GetAnnotations()[everyresource.LastAppliedAnnotation] == "" {
			t.Errorf("%s: not created as client-side apply: managers %v", o, managers)
		}
		if o.Applied {
			applied++
			if !managers[everyresource.ApplyManager] || got.GetLabels()[everyresource.AppliedLabel] != "true" {
				t.Errorf("%s: server-side apply left managers %v labels %v", o, managers, got.GetLabels())
			}
		}
		if o.Status {
			status++
			if !managers[everyresource.StatusManager] {
				t.Errorf("%s: status apply left managers %v", o, managers)
			}
		}
		resp, err := cli.Get(ctx, o.EtcdPath, clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Errorf("%s: not at %s in etcd (%v)", o, o.EtcdPath, err)
		}
	}
	t.Logf("%d through server-side apply, %d with an applied status", applied, status)
	// The premise of the upgrade tests: objects written through versions
	// other than the one a resource is stored in.
	multi := 0
	for _, n := range versions {
		if n > 1 {
			multi++
		}
	}
	if multi == 0 || applied == 0 || status == 0 {
		t.Errorf("%d resources written through several versions, %d applied, %d with status: want some of each", multi, applied, status)
	}
}
