package e2e

import (
	"context"
	"encoding/json"
	"testing"

	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// createManagedFieldsVariety creates DRA objects through resource.k8s.io/v1beta1
// the ways real clusters do, so that their managedFields name that version: a
// `kubectl apply` (client-side: manager kubectl-client-side-apply with the
// last-applied annotation) followed by a `kubectl edit`-style update, a
// server-side apply (manager kubectl, operation Apply), and an object whose
// managedFields were reset (none at all).
func createManagedFieldsVariety(t *testing.T, rc *rest.Config, ns string) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(rc)
	dra := cs.ResourceV1beta1()
	sel := []resourcev1beta1.DeviceSelector{{CEL: &resourcev1beta1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}

	csa := &resourcev1beta1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1beta1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-csa"},
		Spec:       resourcev1beta1.DeviceClassSpec{Selectors: sel},
	}
	last, err := json.Marshal(csa)
	if err != nil {
		t.Fatal(err)
	}
	csa.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(last) + "\n"}
	got, err := dra.DeviceClasses().Create(ctx, csa, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
	if err != nil {
		t.Fatalf("client-side apply: %v", err)
	}
	got.Labels = map[string]string{"edited": "yes"}
	if _, err := dra.DeviceClasses().Update(ctx, got, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatalf("kubectl edit: %v", err)
	}

	ssa := []byte(`{"apiVersion":"resource.k8s.io/v1beta1","kind":"DeviceClass","metadata":{"name":"` + ns + `-ssa","labels":{"owner":"ssa"}},"spec":{"selectors":[{"cel":{"expression":"device.driver == \"ssa.example.com\""}}]}}`)
	if _, err := dra.DeviceClasses().Patch(ctx, ns+"-ssa", types.ApplyPatchType, ssa, metav1.PatchOptions{FieldManager: "kubectl", Force: ptrTrue()}); err != nil {
		t.Fatalf("server-side apply: %v", err)
	}

	req := resourcev1beta1.DeviceRequest{Name: "gpu", DeviceClassName: ns + "-ssa", AllocationMode: resourcev1beta1.DeviceAllocationModeExactCount, Count: 1}
	tmpl, err := dra.ResourceClaimTemplates(ns).Create(ctx, &resourcev1beta1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "no-managed-fields"},
		Spec:       resourcev1beta1.ResourceClaimTemplateSpec{Spec: resourcev1beta1.ResourceClaimSpec{Devices: resourcev1beta1.DeviceClaim{Requests: []resourcev1beta1.DeviceRequest{req}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("resourceclaimtemplate: %v", err)
	}
	tmpl.ManagedFields = []metav1.ManagedFieldsEntry{{}} // kube-apiserver's way to reset them
	tmpl, err = dra.ResourceClaimTemplates(ns).Update(ctx, tmpl, metav1.UpdateOptions{})
	if err != nil || len(tmpl.ManagedFields) != 0 {
		t.Fatalf("reset managedFields: %v (%d entries left)", err, len(tmpl.ManagedFields))
	}
}

func ptrTrue() *bool { b := true; return &b }

// keptGroupVersions lists the group/versions whose managedFields entries the
// field manager of the server behind rc keeps: every version it serves, and
// for custom resources every version in their CRD's spec.versions, served or
// not (apiextensions-apiserver builds its type converter from all of them).
func keptGroupVersions(t *testing.T, rc *rest.Config) map[string]bool {
	t.Helper()
	groups, err := discovery.NewDiscoveryClientForConfigOrDie(rc).ServerGroups()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	out := map[string]bool{}
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			out[v.GroupVersion] = true
		}
	}
	crds, err := apiextensionsclient.NewForConfigOrDie(rc).ApiextensionsV1().CustomResourceDefinitions().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list CRDs: %v", err)
	}
	for _, crd := range crds.Items {
		for _, v := range crd.Spec.Versions {
			out[crd.Spec.Group+"/"+v.Name] = true
		}
	}
	return out
}

// managedFieldsLeft is what kube-apiserver's field manager leaves of an
// object's managedFields on its next write: the entries of the versions it
// keeps (keptGroupVersions), unchanged.
func managedFieldsLeft(u *unstructured.Unstructured, served map[string]bool) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range u.GetManagedFields() {
		if served[e.APIVersion] {
			out = append(out, e)
		}
	}
	return out
}

// droppedEntries counts, over objects, the managedFields entries of versions
// the server does not serve.
func droppedEntries(objs map[objKey]*unstructured.Unstructured, served map[string]bool) map[schema.GroupResource]int {
	out := map[schema.GroupResource]int{}
	for k, u := range objs {
		if n := len(u.GetManagedFields()) - len(managedFieldsLeft(u, served)); n > 0 {
			out[k.GVR.GroupResource()] += n
		}
	}
	return out
}
