package migrate

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"kube-etcd-migrate/target"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
)

const crdKey = "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com"

// widgetCRD: v1beta1 (spec.oldName) and v1 (spec.newName), storage v1, objects
// possibly still in v1beta1 (storedVersions lists both).
func widgetCRD(conv *apiextensionsv1.CustomResourceConversion) *apiextensionsv1.CustomResourceDefinition {
	schema := func(field string) *apiextensionsv1.CustomResourceValidation {
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{field: {Type: "string"}, "size": {Type: "integer"}}},
			},
		}}
	}
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: types.UID("crd-uid"), CreationTimestamp: metav1.Unix(1700000000, 0), Generation: 2},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group:      "example.com",
			Names:      apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope:      apiextensionsv1.NamespaceScoped,
			Conversion: conv,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Schema: schema("oldName")},
				{Name: "v1", Served: true, Storage: true, Schema: schema("newName")},
			},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1beta1", "v1"}},
	}
}

// putWidgets stores n widgets the way the apiextensions-apiserver stored them while
// v1beta1 was the storage version (JSON, one trailing newline).
func putWidgets(t *testing.T, c *testcluster.Cluster, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w-%02d", i)
		obj := map[string]any{
			"apiVersion": "example.com/v1beta1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": "ns1", "uid": "uid-" + name, "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
			"spec":     map[string]any{"oldName": "name-" + name, "size": int64(i)},
		}
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Cli.Put(context.Background(), "/registry/example.com/widgets/ns1/"+name, string(data)+"\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// widgets is the summary line of the custom resources (the CRD object itself is
// rewritten too: the test stores it without the defaults the apiserver applies).
func widgets(s *Summary) Counts {
	for _, r := range s.Resources {
		if r.Group == "example.com" && r.Resource == "widgets" {
			return r.Counts
		}
	}
	return Counts{}
}

// storedCRD decodes the CRD object as stored in etcd.
func storedCRD(t *testing.T, c *testcluster.Cluster, env *pipeline.Env) *apiextensions.CustomResourceDefinition {
	t.Helper()
	obj, _ := testcluster.Stored(t, env, c, crdKey)
	return obj.(*apiextensions.CustomResourceDefinition)
}

func storedWidget(t *testing.T, c *testcluster.Cluster, name string) map[string]any {
	t.Helper()
	value, _, _ := c.Get("/registry/example.com/widgets/ns1/" + name)
	var m map[string]any
	if err := json.Unmarshal(value, &m); err != nil {
		t.Fatalf("%s: stored value is not JSON: %v", name, err)
	}
	return m
}

// TestMigrateCRDNoneConversion: custom resources move from v1beta1 to v1 with only
// apiVersion changed, and the CRD's storedVersions is trimmed to [v1].
func TestMigrateCRDNoneConversion(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put(crdKey, decode.CRDGroupResource, widgetCRD(&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}), "", "", "")
	putWidgets(t, c, 12)

	sum := run(t, c.Env(pipeline.Config{}), Options{})
	if widgets(sum).Rewritten != 12 || sum.Summary.Failed != 0 {
		t.Fatalf("%+v", sum.Summary)
	}
	w := storedWidget(t, c, "w-03")
	spec := w["spec"].(map[string]any)
	// None conversion changes apiVersion only; then, as in kube-apiserver's
	// schemaCoercingConverter, the object is pruned with v1's schema, which has no
	// oldName: the field is gone, exactly as a no-op PUT through the apiserver would
	// have left it.
	if w["apiVersion"] != "example.com/v1" || spec["size"] != float64(3) || spec["oldName"] != nil {
		t.Fatalf("w-03 stored as %v", w)
	}
	env := c.Env(pipeline.Config{})
	if got := storedCRD(t, c, env).Status.StoredVersions; !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("storedVersions %v, want [v1]", got)
	}
	if !slices.ContainsFunc(sum.CRDs, func(r CRDResult) bool { return r.Name == "widgets.example.com" && r.Action == "trimmed" }) {
		t.Fatalf("trim not reported: %+v", sum.CRDs)
	}
	again := run(t, env, Options{})
	if again.Summary.Rewritten != 0 {
		t.Fatalf("second run rewrote %d", again.Summary.Rewritten)
	}
}

// TestEncryptionOnlyKeepsStoredVersions: under --encryption-only, widgets
// still stored as v1beta1 (unencrypted, as the configuration wants them)
// are current and left alone, and so is the CRD's storedVersions: the run
// moved nothing to the storage version.
func TestEncryptionOnlyKeepsStoredVersions(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put(crdKey, decode.CRDGroupResource, widgetCRD(&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}), "", "", "")
	putWidgets(t, c, 3)
	before, rev, _ := c.Get("/registry/example.com/widgets/ns1/w-01")

	env := c.Env(pipeline.Config{Target: target.Input{EncryptionOnly: true}})
	sum := run(t, env, Options{})
	if sum.Summary.Rewritten != 0 || widgets(sum).Current != 3 || len(sum.CRDs) != 0 {
		t.Fatalf("summary %+v, CRDs %+v", sum.Summary, sum.CRDs)
	}
	if after, rev2, _ := c.Get("/registry/example.com/widgets/ns1/w-01"); rev2 != rev || string(after) != string(before) {
		t.Fatalf("w-01 rewritten")
	}
	if got := storedCRD(t, c, env).Status.StoredVersions; !slices.Equal(got, []string{"v1beta1", "v1"}) {
		t.Fatalf("storedVersions %v, want [v1beta1 v1]", got)
	}
}

// TestTrimReChecksWhatWasWrittenSince: while the run reads the widgets,
// another writer stores one more in v1beta1 (after the revision the run
// reads at, so the run never sees it). The re-check before the trim decodes
// what was written since the run's scan and finds it: storedVersions keeps
// v1beta1. The next run rewrites it and trims. (The run allows a live
// kube-apiserver: without that, its liveness watch would stop it at the
// other writer's write, TestWriterAppears.)
func TestTrimReChecksWhatWasWrittenSince(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put(crdKey, decode.CRDGroupResource, widgetCRD(&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}), "", "", "")
	putWidgets(t, c, 12)
	data := lateWidget(t, "late")
	var putErr error
	written := false
	sum := run(t, c.Env(pipeline.Config{PageSize: 4}), Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}, Progress: func(Counts) {
		if !written {
			written = true
			_, putErr = c.Cli.Put(context.Background(), "/registry/example.com/widgets/ns1/late", string(data)+"\n")
		}
	}})
	if putErr != nil || !written {
		t.Fatalf("the other writer: written %v, %v", written, putErr)
	}
	if widgets(sum).Rewritten != 12 {
		t.Fatalf("%+v", sum.Summary)
	}
	i := slices.IndexFunc(sum.CRDs, func(r CRDResult) bool { return r.Name == "widgets.example.com" })
	if i < 0 || sum.CRDs[i].Action != "kept" || sum.CRDs[i].Detail != "1 object(s) found in other versions or unreadable on re-check" {
		t.Fatalf("CRDs %+v: want widgets kept for the one written since", sum.CRDs)
	}
	env := c.Env(pipeline.Config{})
	if got := storedCRD(t, c, env).Status.StoredVersions; !slices.Equal(got, []string{"v1beta1", "v1"}) {
		t.Fatalf("storedVersions %v, want both kept", got)
	}
	again := run(t, env, Options{})
	if widgets(again).Rewritten != 1 || !slices.ContainsFunc(again.CRDs, func(r CRDResult) bool { return r.Name == "widgets.example.com" && r.Action == "trimmed" }) {
		t.Fatalf("second run: %+v %+v", again.Summary, again.CRDs)
	}
}

// conversionWebhook converts widgets between v1beta1 (spec.oldName) and v1
// (spec.newName), speaking ConversionReview v1 over HTTPS.
type conversionWebhook struct{ calls atomic.Int64 }

func (h *conversionWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	var review apiextensionsv1.ConversionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, raw := range review.Request.Objects {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw.Raw); err != nil {
			http.Error(w, "bad object", http.StatusBadRequest)
			return
		}
		from, to := "oldName", "newName"
		if review.Request.DesiredAPIVersion == "example.com/v1beta1" {
			from, to = to, from
		}
		if v, ok, _ := unstructured.NestedString(u.Object, "spec", from); ok {
			unstructured.RemoveNestedField(u.Object, "spec", from)
			_ = unstructured.SetNestedField(u.Object, v, "spec", to)
		}
		u.SetAPIVersion(review.Request.DesiredAPIVersion)
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Object: u})
	}
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// TestMigrateCRDWebhookConversion: the CRD's conversion webhook (a real HTTPS
// server trusted through the CRD's caBundle) converts every object to v1.
func TestMigrateCRDWebhookConversion(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	hook := &conversionWebhook{}
	srv := httptest.NewTLSServer(hook)
	t.Cleanup(srv.Close)
	url := srv.URL + "/convert"
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c.Put(crdKey, decode.CRDGroupResource, widgetCRD(&apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: ca},
			ConversionReviewVersions: []string{"v1"},
		},
	}), "", "", "")
	putWidgets(t, c, 7)

	sum := run(t, c.Env(pipeline.Config{}), Options{})
	if widgets(sum).Rewritten != 7 || sum.Summary.Failed != 0 || sum.Summary.Unreadable != 0 {
		t.Fatalf("%+v %+v", sum.Summary, sum.Failures)
	}
	if hook.calls.Load() == 0 {
		t.Fatal("the webhook was never called")
	}
	for i := 0; i < 7; i++ {
		name := fmt.Sprintf("w-%02d", i)
		w := storedWidget(t, c, name)
		spec := w["spec"].(map[string]any)
		meta := w["metadata"].(map[string]any)
		if w["apiVersion"] != "example.com/v1" || spec["newName"] != "name-"+name || spec["oldName"] != nil || meta["uid"] != "uid-"+name {
			t.Fatalf("%s stored as %v", name, w)
		}
	}
	if got := storedCRD(t, c, c.Env(pipeline.Config{})).Status.StoredVersions; !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("storedVersions %v, want [v1]", got)
	}
}

// TestTrimReChecksWhatWasWrittenSinceARestart: as
// TestTrimReChecksWhatWasWrittenSince, but etcd's history is compacted right
// after the other writer's write, so the run's scan goes on at a newer
// revision (as --compact-history's own compactions make it): the re-check,
// which decodes only what was written since the scan's first revision,
// still finds the widget written meanwhile and keeps v1beta1.
func TestTrimReChecksWhatWasWrittenSinceARestart(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	const n = 400 // with the ballast, enough that the scan is still reading when the compaction comes
	c.Put(crdKey, decode.CRDGroupResource, widgetCRD(&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}), "", "", "")
	putWidgets(t, c, n)
	c.Ballast("zz-ballast", 1000) // after the widgets: what etcd 3.7's stream cannot have read ahead by the 20th
	data := lateWidget(t, "a-late")
	var otherErr error
	written := false
	sum := run(t, c.Env(pipeline.Config{PageSize: 4}), Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}, Progress: func(counts Counts) {
		if written || counts.Scanned < 20 { // the scan is past a-late
			return
		}
		written = true
		ctx := context.Background()
		// Before every key the scan has read (a-late < the widgets'
		// names): the scan never sees it.
		resp, err := c.Cli.Put(ctx, "/registry/example.com/widgets/ns1/a-late", string(data)+"\n")
		if err == nil {
			_, err = c.Cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
		}
		otherErr = err
	}})
	if otherErr != nil || !written {
		t.Fatalf("the other writer: written %v, %v", written, otherErr)
	}
	if sum.Consistent || len(sum.Restarts) == 0 || widgets(sum).Rewritten != n {
		t.Fatalf("want a scan that went on at a newer revision and rewrote every widget: consistent %v, restarts %+v, %+v", sum.Consistent, sum.Restarts, sum.Summary)
	}
	i := slices.IndexFunc(sum.CRDs, func(r CRDResult) bool { return r.Name == "widgets.example.com" })
	if i < 0 || sum.CRDs[i].Action != "kept" || sum.CRDs[i].Detail != "1 object(s) found in other versions or unreadable on re-check" {
		t.Fatalf("CRDs %+v: want widgets kept for the one written since", sum.CRDs)
	}
	if got := storedCRD(t, c, c.Env(pipeline.Config{})).Status.StoredVersions; !slices.Equal(got, []string{"v1beta1", "v1"}) {
		t.Fatalf("storedVersions %v, want both kept", got)
	}
}

// lateWidget is a v1beta1 widget in ns1 that another writer stores while a
// run reads, as etcd holds it.
func lateWidget(t *testing.T, name string) []byte {
	t.Helper()
	data, err := json.Marshal(map[string]any{
		"apiVersion": "example.com/v1beta1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": "ns1", "uid": "uid-late", "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
		"spec":     map[string]any{"oldName": "late", "size": int64(1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRevisionsForgetsPastItsBound: the set of the run's own revisions stays
// bounded; past its bound it holds none, so the re-check decodes every key
// written since the scan again rather than trusting a partial set.
func TestRevisionsForgetsPastItsBound(t *testing.T) {
	var nilSet *Revisions
	if nilSet.Has(1) {
		t.Fatal("a nil set holds revision 1")
	}
	var r Revisions
	for rev := int64(1); rev <= maxRevisions; rev++ {
		r.Add(rev)
	}
	if !r.Has(1) || !r.Has(maxRevisions) || r.Has(maxRevisions+1) {
		t.Fatal("a set at its bound does not hold exactly what was added")
	}
	r.Add(maxRevisions + 1)
	if r.Has(1) || r.Has(maxRevisions+1) || r.set != nil {
		t.Fatal("a set past its bound still holds revisions")
	}
	r.Add(7)
	if r.Has(7) {
		t.Fatal("a full set took a revision again")
	}
}
