package e2e

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// TestFieldLossAsAPIServer (issue 27, item 4): gizmos written through
// v1alpha1, whose schema has spec.legacy; the storage version then moves to
// v1, whose schema lacks it, and v1alpha1 is no longer served (conversion
// None). What does kube-apiserver's no-op update (GET, PUT unchanged) do to
// such an object? It writes it, in v1, without spec.legacy (the storage
// codec prunes in v1's schema after converting: schemaCoercingConverter).
// The tool must write the same bytes: g-api is no-op updated through
// kube-apiserver, its original put back while it is stopped, and migrate's
// value for it must equal kube-apiserver's byte for byte. verify and
// migrate name spec.legacy for the 2 gizmos stored in v1alpha1 that carry it,
// migrate's journal holds their originals byte for byte, and after the
// migration kube-apiserver's no-op update of every object writes nothing.
func TestFieldLossAsAPIServer(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	rc := c.start(apiservertest.Options{PriorityAndFairness: true})
	ext := apiextensionsclient.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)

	crd := twoVersionCRD("fieldloss.example.com", "gizmos", "Gizmo",
		map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}, "legacy": {Type: "string"}},
		map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}},
		&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter})
	crd.Spec.Versions[0].Name = "v1alpha1"
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	waitCRD(t, ext, crd.Name, "established", established)
	alpha := schema.GroupVersionResource{Group: "fieldloss.example.com", Version: "v1alpha1", Resource: "gizmos"}
	v1 := alpha
	v1.Version = "v1"
	createCR(t, dyn, alpha, "Gizmo", "default", "g-api", map[string]any{"size": int64(1), "legacy": "old-value-1"})
	createCR(t, dyn, alpha, "Gizmo", "default", "g-tool", map[string]any{"size": int64(2), "legacy": "old-value-2"})
	createCR(t, dyn, alpha, "Gizmo", "default", "g-plain", map[string]any{"size": int64(3)})

	// v1 becomes the storage version; v1alpha1 is no longer served.
	got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Versions[0].Storage, got.Spec.Versions[0].Served, got.Spec.Versions[1].Storage = false, false, true
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("move the storage version to v1: %v", err)
	}
	waitCRD(t, ext, crd.Name, "storing v1, v1alpha1 not served", func(c *apiextensionsv1.CustomResourceDefinition) bool {
		return reflect.DeepEqual(c.Status.StoredVersions, []string{"v1alpha1", "v1"}) && !c.Spec.Versions[0].Served && established(c)
	})
	waitServed(t, dyn, alpha, false)

	const prefix = "/registry/fieldloss.example.com/gizmos/default/"
	origAPI, _, _ := etcdValue(t, c.cli, prefix+"g-api")
	origTool, _, _ := etcdValue(t, c.cli, prefix+"g-tool")
	if !bytes.Contains(origAPI, []byte(`"legacy":"old-value-1"`)) || !bytes.Contains(origAPI, []byte(`"apiVersion":"fieldloss.example.com/v1alpha1"`)) {
		t.Fatalf("g-api stored as %s: want v1alpha1 with spec.legacy (the test's premise)", origAPI)
	}

	// kube-apiserver's no-op update of g-api: it writes it, without spec.legacy.
	ri := dyn.Resource(v1).Namespace("default")
	// kube-apiserver's CRD handler takes the new storage version when its
	// informer sees the CRD's update, which may come after discovery stopped
	// serving v1alpha1: until then an update still writes v1alpha1 (and the
	// next one, unchanged, writes nothing). The update is made again until
	// one writes v1.
	var apiWrote []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		before, err := ri.Get(ctx, "g-api", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(before.Object, "spec", "legacy"); found {
			t.Fatalf("a read through v1 shows spec.legacy: %v", before.Object["spec"])
		}
		after, err := ri.Update(ctx, before, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
		if err != nil {
			t.Fatalf("no-op update of g-api: %v", err)
		}
		apiWrote, _, _ = etcdValue(t, c.cli, prefix+"g-api")
		if bytes.Contains(apiWrote, []byte(`"apiVersion":"fieldloss.example.com/v1"`)) {
			if after.GetResourceVersion() == before.GetResourceVersion() {
				t.Fatalf("kube-apiserver did not write g-api on a no-op update: the test's premise")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver's no-op updates for 30s: %s, want v1 without spec.legacy", apiWrote)
		}
	}
	// (Its managedFields entry of v1alpha1 still names f:legacy: the field
	// manager keeps the entries of a version the CRD lists.)
	if bytes.Contains(apiWrote, []byte("old-value-1")) {
		t.Fatalf("kube-apiserver's no-op update: %s, want v1 without spec.legacy", apiWrote)
	}
	c.stop()
	// g-api as it was before kube-apiserver's write.
	if _, err := c.cli.Put(ctx, prefix+"g-api", string(origAPI)); err != nil {
		t.Fatal(err)
	}

	cfg := pipeline.Config{Prefix: "/registry"}
	wantFields := []reencode.FieldCount{{Path: "spec.legacy", Objects: 2}}
	rep := c.verify(cfg)
	if len(rep.FieldLoss) != 1 || rep.FieldLoss[0].Resource != "gizmos" || rep.FieldLoss[0].StoredVersion != "v1alpha1" || rep.FieldLoss[0].Objects != 2 || !reflect.DeepEqual(rep.FieldLoss[0].Fields, wantFields) {
		t.Errorf("verify fieldLoss %+v, want spec.legacy of 2 gizmos stored in v1alpha1", rep.FieldLoss)
	}
	sum := c.migrate(cfg)
	if len(sum.FieldLoss) != 1 || !reflect.DeepEqual(sum.FieldLoss[0].Fields, wantFields) {
		t.Errorf("migrate fieldLoss %+v, want spec.legacy of 2 gizmos", sum.FieldLoss)
	}
	toolWrote, _, _ := etcdValue(t, c.cli, prefix+"g-api")
	if !bytes.Equal(toolWrote, apiWrote) {
		t.Errorf("g-api: the tool wrote\n%s\nkube-apiserver's no-op update wrote\n%s", toolWrote, apiWrote)
	}
	journaled := journalIntents(t, sum.Journal)
	for key, want := range map[string][]byte{prefix + "g-api": origAPI, prefix + "g-tool": origTool} {
		if !bytes.Equal(journaled[key], want) {
			t.Errorf("%s: the journal holds %q, want the original %q", key, journaled[key], want)
		}
	}
	c.expectCurrent(cfg)

	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	waitCRD(t, apiextensionsclient.NewForConfigOrDie(rc), crd.Name, "established after restart", established)
	t.Logf("no-op update of %d objects", noOpUpdates(t, rc))
}

// journalIntents reads a journal's intent records: key -> old value.
func journalIntents(t *testing.T, path string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := undo.ReadJournal(path, func(r undo.JournalRecord) error {
		if r.Op == "intent" {
			out[r.Key] = r.OldValue
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
