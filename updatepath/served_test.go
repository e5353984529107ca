package updatepath

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/pkg/apis/storagemigration"
	svmregistry "k8s.io/kubernetes/pkg/registry/storagemigration/storagemigration"
)

// TestServedVersion: StorageVersionMigration is GA in 1.37, served as
// storagemigration.k8s.io/v1 by default; with v1 disabled by --runtime-config
// only the beta (off by default) serves it, and with both off nothing does.
func TestServedVersion(t *testing.T) {
	gk := storagemigration.Kind("StorageVersionMigration")
	for _, c := range []struct {
		runtimeConfig []string
		want          string // "" = not served
	}{
		{nil, "v1"},
		{[]string{"storagemigration.k8s.io/v1=false"}, ""},
		{[]string{"storagemigration.k8s.io/v1=false", "storagemigration.k8s.io/v1beta1=true"}, "v1beta1"},
	} {
		gvk, ok, err := path(t, c.runtimeConfig...).ServedVersion(gk)
		if err != nil || ok != (c.want != "") || (ok && gvk.Version != c.want) {
			t.Errorf("--runtime-config %v: %v served=%v err=%v, want %q", c.runtimeConfig, gvk, ok, err, c.want)
		}
	}
}

// TestFieldManagerResetFields: the field manager of the main endpoint
// records a create without the status its strategy resets; the /status
// endpoint's records the status only, under its subresource.
func TestFieldManagerResetFields(t *testing.T) {
	p := path(t)
	gk := storagemigration.Kind("StorageVersionMigration")
	main, err := p.FieldManager(gk, "", svmregistry.Strategy)
	if err != nil || main == nil {
		t.Fatalf("main endpoint: %v %v", main, err)
	}
	obj := &storagemigration.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "m"},
		Spec:       storagemigration.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Resource: "secrets"}},
		Status:     storagemigration.StorageVersionMigrationStatus{ResourceVersion: "3"},
	}
	created := main.UpdateNoErrors(&storagemigration.StorageVersionMigration{}, obj, "me").(*storagemigration.StorageVersionMigration)
	if len(created.ManagedFields) != 1 || created.ManagedFields[0].Subresource != "" || !strings.Contains(created.ManagedFields[0].FieldsV1.GetRawString(), "f:spec") || strings.Contains(created.ManagedFields[0].FieldsV1.GetRawString(), "f:status") {
		t.Fatalf("create: %+v", created.ManagedFields)
	}
	status, err := p.FieldManager(gk, "status", svmregistry.StatusStrategy)
	if err != nil || status == nil {
		t.Fatalf("status endpoint: %v %v", status, err)
	}
	upd := created.DeepCopy()
	upd.Status.ResourceVersion = "4"
	out := status.UpdateNoErrors(created, upd, "me").(*storagemigration.StorageVersionMigration)
	if len(out.ManagedFields) != 2 || out.ManagedFields[1].Subresource != "status" || !strings.Contains(out.ManagedFields[1].FieldsV1.GetRawString(), "f:resourceVersion") {
		t.Fatalf("status update: %+v", out.ManagedFields)
	}
	// Not served: no field manager.
	if fm, err := path(t, "storagemigration.k8s.io/v1=false").FieldManager(gk, "", svmregistry.Strategy); err != nil || fm != nil {
		t.Errorf("not served: %v %v", fm, err)
	}
}
