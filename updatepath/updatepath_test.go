package updatepath

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/util/compatibility"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"

	"kube-etcd-migrate/apiserverconfig"
)

// path returns the update path of kube-apiserver 1.36 run with these flags.
func path(t *testing.T, runtimeConfig ...string) *Path {
	t.Helper()
	cfg, err := apiserverconfig.Load(apiserverconfig.Input{RuntimeConfig: runtimeConfig})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfg.ResourceConfig(cfg.Release().Effective())
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{ResourceConfig: rc, Effective: compatibility.DefaultBuildEffectiveVersion()})
}

func entry(manager, apiVersion, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{
		Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: apiVersion,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields),
	}
}

func deviceClass(entries ...metav1.ManagedFieldsEntry) *resource.DeviceClass {
	return &resource.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", UID: "4d2b1c7e-0000-4000-8000-000000000001", ResourceVersion: "7", ManagedFields: entries},
		Spec:       resource.DeviceClassSpec{Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	}
}

const selectorsFields = `{"f:spec":{"f:selectors":{}}}`

func managers(fs []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, e := range fs {
		out = append(out, e.Manager+"@"+e.APIVersion)
	}
	return out
}

func TestUnservedVersionEntryDropped(t *testing.T) {
	p := path(t)
	dc := deviceClass(entry("kubectl-client-side-apply", "resource.k8s.io/v1beta1", selectorsFields), entry("operator", "resource.k8s.io/v1", selectorsFields))
	changed, err := p.Apply(dc)
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		t.Fatalf("managedFields unchanged: %v; kube-apiserver 1.36 does not serve resource.k8s.io/v1beta1 by default and drops that entry", managers(dc.ManagedFields))
	}
	if got := managers(dc.ManagedFields); len(got) != 1 || got[0] != "operator@resource.k8s.io/v1" {
		t.Errorf("managedFields %v, want only operator@resource.k8s.io/v1", got)
	}
	if dc.Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.example.com"` {
		t.Errorf("spec changed")
	}
}

func TestServedVersionsKept(t *testing.T) {
	// Enabled by --runtime-config, v1beta1 is served again: its entry stays.
	p := path(t, "resource.k8s.io/v1beta1=true")
	dc := deviceClass(entry("kubectl-client-side-apply", "resource.k8s.io/v1beta1", selectorsFields), entry("operator", "resource.k8s.io/v1", selectorsFields))
	changed, err := p.Apply(dc)
	if err != nil {
		t.Fatal(err)
	}
	if changed || len(dc.ManagedFields) != 2 {
		t.Errorf("changed=%v, managedFields %v: both versions are served", changed, managers(dc.ManagedFields))
	}

	// Core objects at v1, and objects without managedFields: nothing to do.
	p = path(t)
	cm := &api.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "u", ManagedFields: []metav1.ManagedFieldsEntry{entry("kubectl", "v1", `{"f:data":{"f:a":{}}}`)}}, Data: map[string]string{"a": "1"}}
	if changed, err := p.Apply(cm); err != nil || changed {
		t.Errorf("configmap at v1: changed=%v err=%v", changed, err)
	}
	bare := deviceClass()
	if changed, err := p.Apply(bare); err != nil || changed || bare.ManagedFields != nil {
		t.Errorf("no managedFields: changed=%v err=%v %v", changed, err, bare.ManagedFields)
	}
}

func TestCorruptManagedFieldsDropped(t *testing.T) {
	p := path(t)
	dc := deviceClass(metav1.ManagedFieldsEntry{Manager: "x", Operation: "Bogus", APIVersion: "resource.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{`)})
	changed, err := p.Apply(dc)
	if err != nil {
		t.Fatal(err)
	}
	if !changed || len(dc.ManagedFields) != 0 {
		t.Errorf("changed=%v managedFields=%v: kube-apiserver drops managedFields it cannot decode", changed, managers(dc.ManagedFields))
	}
}

// BenchmarkApply is the field manager's cost on a typical object: two
// managedFields entries of served versions (nothing to change), run in full
// (--full-field-manager) and skipped (the shortcut, after the first object).
func BenchmarkApply(b *testing.B) {
	cfg, err := apiserverconfig.Load(apiserverconfig.Input{})
	if err != nil {
		b.Fatal(err)
	}
	rc, err := cfg.ResourceConfig(cfg.Release().Effective())
	if err != nil {
		b.Fatal(err)
	}
	cm := &api.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "u", ManagedFields: []metav1.ManagedFieldsEntry{
		entry("kubectl-client-side-apply", "v1", `{"f:data":{".":{},"f:a":{}},"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}}}}`),
		entry("operator", "v1", `{"f:data":{"f:b":{}}}`),
	}}, Data: map[string]string{"a": "1", "b": "2"}}
	for _, full := range []bool{true, false} {
		b.Run(map[bool]string{true: "full", false: "shortcut"}[full], func(b *testing.B) {
			p := New(Config{ResourceConfig: rc, Effective: compatibility.DefaultBuildEffectiveVersion(), FullFieldManager: full})
			if _, err := p.Apply(cm.DeepCopy()); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := p.Apply(cm.DeepCopy()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
