package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// TestCustomResourceVersionRemoved: custom resources written through v1beta1
// carry managedFields entries of it. The storage version moves to v1, the
// tool migrates them, and the operator then removes v1beta1 from the CRDs
// (one with conversion None, one with a webhook). kube-apiserver's field
// manager then cannot convert to a version the CRD no longer lists: 1.36
// cleared every managedFields entry of such an object on its next write,
// 1.37 keeps the live object's entries (apimachinery's UpdateNoErrors since
// 1.37). So with 1.37 nothing is stale: verify says current, migrate writes
// nothing, and a no-op update of every object writes nothing and leaves the
// entries of v1beta1 in place.
func TestCustomResourceVersionRemoved(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	hook := startConversionWebhook(t)

	rc := c.start(apiservertest.Options{PriorityAndFairness: true})
	ext := apiextensionsclient.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)

	props := map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}, "color": {Type: "string"}}
	none, hooked := createCRDPair(ctx, t, ext, hook, props, [3]string{"removal.example.com", "sprockets", "Sprocket"}, [3]string{"hook.example.com", "gizmos", "Gizmo"})
	sprocketsBeta := schema.GroupVersionResource{Group: "removal.example.com", Version: "v1beta1", Resource: "sprockets"}
	gizmosBeta := schema.GroupVersionResource{Group: "hook.example.com", Version: "v1beta1", Resource: "gizmos"}
	sprockets, gizmos := sprocketsBeta, gizmosBeta
	sprockets.Version, gizmos.Version = "v1", "v1"

	// Written through v1beta1, so that managedFields name it: a server-side
	// apply, a create then a kubectl-edit-style update, and an object whose
	// managedFields were reset (none at all).
	apply := func(gvr schema.GroupVersionResource, kind, name, spec string) {
		t.Helper()
		body := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"metadata":{"name":%q,"labels":{"owner":"ssa"}},"spec":%s}`, gvr.GroupVersion().String(), kind, name, spec)
		if _, err := dyn.Resource(gvr).Namespace("default").Patch(ctx, name, types.ApplyPatchType, []byte(body), metav1.PatchOptions{FieldManager: "kubectl", Force: ptr.To(true)}); err != nil {
			t.Fatalf("server-side apply %s %s: %v", gvr, name, err)
		}
	}
	edit := func(gvr schema.GroupVersionResource, name string) {
		t.Helper()
		ri := dyn.Resource(gvr).Namespace("default")
		got, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.SetLabels(map[string]string{"tier": "e2e", "edited": "yes"})
		if _, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
			t.Fatalf("update %s %s: %v", gvr, name, err)
		}
	}
	reset := func(gvr schema.GroupVersionResource, name string) {
		t.Helper()
		ri := dyn.Resource(gvr).Namespace("default")
		got, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.SetManagedFields([]metav1.ManagedFieldsEntry{{}}) // kube-apiserver's way to reset them
		upd, err := ri.Update(ctx, got, metav1.UpdateOptions{})
		if err != nil || len(upd.GetManagedFields()) != 0 {
			t.Fatalf("reset managedFields of %s %s: %v (%d entries left)", gvr, name, err, len(upd.GetManagedFields()))
		}
	}
	createCR(t, dyn, sprocketsBeta, "Sprocket", "default", "created", map[string]any{"size": int64(1)})
	edit(sprocketsBeta, "created")
	apply(sprocketsBeta, "Sprocket", "applied", `{"size":2,"color":"red"}`)
	createCR(t, dyn, sprocketsBeta, "Sprocket", "default", "untracked", map[string]any{"size": int64(3)})
	reset(sprocketsBeta, "untracked")
	createCR(t, dyn, gizmosBeta, "Gizmo", "default", "created", map[string]any{"oldName": "g"})
	edit(gizmosBeta, "created")
	apply(gizmosBeta, "Gizmo", "applied", `{"oldName":"a"}`)

	// The storage version moves to v1; one object of each is then written
	// through v1 only.
	moveStorageToV1(ctx, t, ext, none.Name, hooked.Name)
	createCR(t, dyn, sprockets, "Sprocket", "default", "v1-only", map[string]any{"size": int64(9)})
	createCR(t, dyn, gizmos, "Gizmo", "default", "v1-only", map[string]any{"name": "v1"})

	before := snapshot(t, rc, []schema.GroupVersionResource{sprockets, gizmos})
	withBeta := map[objKey]bool{} // the objects with a managedFields entry of v1beta1
	for k, u := range before {
		for _, e := range u.GetManagedFields() {
			if e.APIVersion == k.GVR.Group+"/v1beta1" {
				withBeta[k] = true
			}
		}
	}
	if len(before) != 7 || len(withBeta) != 4 {
		t.Fatalf("%d custom resources, %d with managedFields of v1beta1; want 7 and 4 (the test's premise)", len(before), len(withBeta))
	}
	c.stop()

	// The tool moves every object to v1 and trims storedVersions.
	cfg := pipeline.Config{Prefix: "/registry"}
	c.migrate(cfg)
	c.expectCurrent(cfg)

	// The operator removes v1beta1 from the CRDs.
	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	ext = apiextensionsclient.NewForConfigOrDie(rc)
	for _, name := range []string{none.Name, hooked.Name} {
		crd := waitCRD(t, ext, name, "established after the migration", established)
		if !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
			t.Fatalf("CRD %s status.storedVersions = %v after the migration, want [v1]", name, crd.Status.StoredVersions)
		}
		crd.Spec.Versions = crd.Spec.Versions[1:]
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("remove v1beta1 from %s: %v", name, err)
		}
		waitCRD(t, ext, name, "without v1beta1", func(c *apiextensionsv1.CustomResourceDefinition) bool {
			return len(c.Spec.Versions) == 1 && c.Spec.Versions[0].Name == "v1" && established(c)
		})
	}
	// Reads do not run the field manager: the entries are still served.
	for k := range withBeta {
		got, err := dynamic.NewForConfigOrDie(rc).Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(before[k].GetManagedFields(), got.GetManagedFields()); d != "" {
			t.Fatalf("%s: managedFields changed by a read (-before +after):\n%s", k, d)
		}
	}
	c.stop()

	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != verify.ExitCurrent {
		t.Errorf("verify exit %d after v1beta1 was removed, want 0: kube-apiserver 1.37 keeps the entries (summary %+v)", code, rep.Summary)
	}
	sum := c.migrate(cfg)
	if sum.Summary.Rewritten != 0 {
		t.Errorf("migrate rewrote %d objects after v1beta1 was removed, want 0 (summary %+v)", sum.Summary.Rewritten, sum.Summary)
	}
	c.expectCurrent(cfg)

	// kube-apiserver's verdict: every object is as it would write it.
	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	for _, name := range []string{none.Name, hooked.Name} {
		waitCRD(t, apiextensionsclient.NewForConfigOrDie(rc), name, "established after restart", established)
	}
	dyn = dynamic.NewForConfigOrDie(rc)
	for k, want := range before {
		got, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: %v", k, err)
			continue
		}
		if d := cmp.Diff(content(want), content(got)); d != "" {
			t.Errorf("%s: content changed (-before +after):\n%s", k, d)
		}
		if d := cmp.Diff(want.GetManagedFields(), got.GetManagedFields()); d != "" {
			t.Errorf("%s: managedFields (-want +got):\n%s", k, d)
		}
	}
	t.Logf("no-op update of %d objects", noOpUpdates(t, rc))
	for k := range withBeta {
		got, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: %v", k, err)
			continue
		}
		if d := cmp.Diff(before[k].GetManagedFields(), got.GetManagedFields()); d != "" {
			t.Errorf("%s: managedFields after kube-apiserver's no-op update (-before +after):\n%s", k, d)
		}
	}
}
