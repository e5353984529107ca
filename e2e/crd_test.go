package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// conversionWebhook is a real HTTPS ConversionReview v1 endpoint converting
// gadgets between v1beta1 (spec.oldName) and v1 (spec.name).
type conversionWebhook struct {
	srv   *httptest.Server
	calls atomic.Int64
}

func startConversionWebhook(t *testing.T) *conversionWebhook {
	t.Helper()
	h := &conversionWebhook{}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *conversionWebhook) caBundle() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.srv.Certificate().Raw})
}

func (h *conversionWebhook) serve(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	var review apiextensionsv1.ConversionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad ConversionReview", http.StatusBadRequest)
		return
	}
	resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, raw := range review.Request.Objects {
		var obj map[string]any
		if err := json.Unmarshal(raw.Raw, &obj); err != nil {
			resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
			break
		}
		obj["apiVersion"] = review.Request.DesiredAPIVersion
		if spec, ok := obj["spec"].(map[string]any); ok {
			switch review.Request.DesiredAPIVersion {
			case "hook.example.com/v1":
				if v, ok := spec["oldName"]; ok {
					spec["name"] = v
					delete(spec, "oldName")
				}
			case "hook.example.com/v1beta1":
				if v, ok := spec["name"]; ok {
					spec["oldName"] = v
					delete(spec, "name")
				}
			}
		}
		out, _ := json.Marshal(obj)
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: out})
	}
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

func objectSchema(props map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceValidation {
	return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type:       "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: props}},
	}}
}

// twoVersionCRD has v1beta1 (storage) and v1.
func twoVersionCRD(group, plural, kind string, beta, v1 map[string]apiextensionsv1.JSONSchemaProps, conv *apiextensionsv1.CustomResourceConversion) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Storage: true, Schema: objectSchema(beta)},
				{Name: "v1", Served: true, Storage: false, Schema: objectSchema(v1)},
			},
			Conversion: conv,
		},
	}
}

// waitCRD polls the CRD until cond holds.
func waitCRD(t *testing.T, ext apiextensionsclient.Interface, name, what string, cond func(*apiextensionsv1.CustomResourceDefinition) bool) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var last *apiextensionsv1.CustomResourceDefinition
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = got
		return cond(got), nil
	})
	if err != nil {
		t.Fatalf("CRD %s never %s (last status %+v): %v", name, what, last.Status, err)
	}
	return last
}

func established(c *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// createCR creates a custom resource, retrying while the CRD is not served yet.
func createCR(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, kind, ns, name string, spec map[string]any) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": name, "labels": map[string]any{"tier": "e2e"}},
		"spec":     spec,
	}}
	var lastErr error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil && ctx.Err() == nil {
			lastErr = err
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("create %s %s/%s: %v", gvr, ns, name, lastErr)
	}
}

// createCRDPair creates two CRDs that serve v1beta1 (their storage version)
// and v1, and waits until both are established: none (group, plural, kind)
// with conversion None and props in both versions, and hooked converted by
// hook (oldName in v1beta1, name in v1).
func createCRDPair(ctx context.Context, t *testing.T, ext apiextensionsclient.Interface, hook *conversionWebhook, props map[string]apiextensionsv1.JSONSchemaProps, none, hooked [3]string) (noneCRD, hookedCRD *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	noneCRD = twoVersionCRD(none[0], none[1], none[2], props, props, &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter})
	hookedCRD = twoVersionCRD(hooked[0], hooked[1], hooked[2],
		map[string]apiextensionsv1.JSONSchemaProps{"oldName": {Type: "string"}},
		map[string]apiextensionsv1.JSONSchemaProps{"name": {Type: "string"}},
		&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: ptr.To(hook.srv.URL + "/convert"), CABundle: hook.caBundle()},
			ConversionReviewVersions: []string{"v1"},
		}})
	for _, crd := range []*apiextensionsv1.CustomResourceDefinition{noneCRD, hookedCRD} {
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
		waitCRD(t, ext, crd.Name, "established", established)
	}
	return noneCRD, hookedCRD
}

// moveStorageToV1 makes v1 the storage version of the named CRDs (made by
// createCRDPair) and waits until kube-apiserver records it in storedVersions.
func moveStorageToV1(ctx context.Context, t *testing.T, ext apiextensionsclient.Interface, names ...string) {
	t.Helper()
	for _, name := range names {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("move %s storage to v1: %v", name, err)
		}
		waitCRD(t, ext, name, "recorded v1 in storedVersions", func(c *apiextensionsv1.CustomResourceDefinition) bool {
			return slices.Equal(c.Status.StoredVersions, []string{"v1beta1", "v1"}) && established(c)
		})
	}
}

// TestCustomResourceStorageVersion: two CRDs move their storage version from
// v1beta1 to v1, one with conversion None, one with a conversion webhook (a
// real HTTPS server, URL config, caBundle); the widgets' v1beta1, through which
// objects were created, is then set served: false. After the migration the
// apiserver's CRDs list only v1 in status.storedVersions, every custom
// resource is served unchanged, and no-op updates write nothing.
func TestCustomResourceStorageVersion(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	hook := startConversionWebhook(t)

	rc := c.start(apiservertest.Options{PriorityAndFairness: true})
	ext := apiextensionsclient.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)

	props := map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}, "color": {Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"blue"`)}}}
	none, hooked := createCRDPair(ctx, t, ext, hook, props, [3]string{"none.example.com", "widgets", "Widget"}, [3]string{"hook.example.com", "gadgets", "Gadget"})
	widgetsBeta := schema.GroupVersionResource{Group: "none.example.com", Version: "v1beta1", Resource: "widgets"}
	gadgetsBeta := schema.GroupVersionResource{Group: "hook.example.com", Version: "v1beta1", Resource: "gadgets"}
	widgets, gadgets := widgetsBeta, gadgetsBeta
	widgets.Version, gadgets.Version = "v1", "v1"
	for i := 0; i < 3; i++ {
		createCR(t, dyn, widgetsBeta, "Widget", "default", fmt.Sprintf("w%d", i), map[string]any{"size": int64(i)})
		createCR(t, dyn, gadgetsBeta, "Gadget", "default", fmt.Sprintf("g%d", i), map[string]any{"oldName": fmt.Sprintf("gadget-%d", i)})
	}

	// Move the storage version to v1.
	moveStorageToV1(ctx, t, ext, none.Name, hooked.Name)
	waitStoresV1(t, c, dyn, widgets, "Widget", "/registry/none.example.com/widgets/default/", map[string]any{"size": int64(0)})
	waitStoresV1(t, c, dyn, gadgets, "Gadget", "/registry/hook.example.com/gadgets/default/", map[string]any{"name": "probe"})
	// One object of each written in v1 once the apiserver stores v1.
	createCR(t, dyn, widgets, "Widget", "default", "w-v1", map[string]any{"size": int64(9)})
	createCR(t, dyn, gadgets, "Gadget", "default", "g-v1", map[string]any{"name": "gadget-v1"})
	assertStoredJSON(t, c, "/registry/none.example.com/widgets/default/w0", "none.example.com/v1beta1")
	assertStoredJSON(t, c, "/registry/none.example.com/widgets/default/w-v1", "none.example.com/v1")
	assertStoredJSON(t, c, "/registry/hook.example.com/gadgets/default/g0", "hook.example.com/v1beta1")

	// The widgets' v1beta1 is then no longer served: the objects created
	// through it keep managedFields entries of a version served: false,
	// which kube-apiserver keeps (the CRD still lists it).
	crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, none.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions[0].Served = false
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("stop serving %s v1beta1: %v", none.Name, err)
	}
	waitCRD(t, ext, none.Name, "v1beta1 not served", func(c *apiextensionsv1.CustomResourceDefinition) bool {
		return !c.Spec.Versions[0].Served && established(c)
	})
	waitServed(t, dyn, widgetsBeta, false)

	before := snapshot(t, rc, []schema.GroupVersionResource{widgets, gadgets, gadgetsBeta})
	if len(before) != 12 {
		t.Fatalf("served %d custom resources through widgets v1 and gadgets v1 and v1beta1, want 12", len(before))
	}
	if n := len(before[objKey{GVR: widgets, Namespace: "default", Name: "w0"}].GetManagedFields()); n == 0 {
		t.Fatalf("widget w0 has no managedFields: the test's premise")
	}
	c.stop()

	cfg := pipeline.Config{Prefix: "/registry"}
	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != verify.ExitStale {
		t.Fatalf("verify exit %d, want 3 (summary %+v)", code, rep.Summary)
	}
	// kube-apiserver may have emitted an Event through events.k8s.io while
	// it ran (its ServiceCIDR controller's, now and then): current, judged
	// by the group its manager wrote through.
	stale := staleResources(t, rep)
	if want := []string{"gadgets.hook.example.com", "widgets.none.example.com"}; !slices.Equal(stale, want) {
		t.Errorf("verify names stale %v, want %v", stale, want)
	}
	for _, s := range rep.CRDs {
		if s.Trimmable {
			t.Errorf("CRD %s reported trimmable before the migration: %s", s.Name, s.Note)
		}
	}
	callsBefore := hook.calls.Load()
	sum := c.migrate(cfg)
	var crs int64
	for _, r := range sum.Resources {
		if r.Group == "none.example.com" || r.Group == "hook.example.com" {
			crs += r.Rewritten
		}
	}
	if crs != 6 {
		t.Errorf("migrate rewrote %d custom resources, want the 6 stored in v1beta1 (summary %+v)", crs, sum.Summary)
	}
	if hook.calls.Load() == callsBefore {
		t.Errorf("the migration never called the conversion webhook")
	}
	for _, r := range sum.CRDs {
		t.Logf("CRD %s: %s %v %s", r.Name, r.Action, r.StoredVersions, r.Detail)
	}
	c.expectCurrent(cfg)
	assertStoredJSON(t, c, "/registry/none.example.com/widgets/default/w0", "none.example.com/v1")
	assertStoredJSON(t, c, "/registry/hook.example.com/gadgets/default/g0", "hook.example.com/v1")

	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	ext = apiextensionsclient.NewForConfigOrDie(rc)
	for _, name := range []string{none.Name, hooked.Name} {
		crd := waitCRD(t, ext, name, "established after restart", established)
		if !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
			t.Errorf("CRD %s status.storedVersions = %v as served, want [v1]", name, crd.Status.StoredVersions)
		}
	}
	sameContent(t, rc, before)
	t.Logf("no-op update of %d objects", noOpUpdates(t, rc))
}

// assertStoredJSON checks the apiVersion of a custom resource stored as JSON.
// waitStoresV1 waits until kube-apiserver stores gvr's new objects in
// gvr's version: its CRD handler takes a new storage version from its
// informer a moment after storedVersions records it. A probe object (name
// storage-probe under prefix) is created until it is stored so, and
// deleted.
func waitStoresV1(t *testing.T, c *cluster, dyn dynamic.Interface, gvr schema.GroupVersionResource, kind, prefix string, spec map[string]any) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		createCR(t, dyn, gvr, kind, "default", "storage-probe", spec)
		v, _, _ := etcdValue(t, c.cli, prefix+"storage-probe")
		var tm metav1.TypeMeta
		stored := json.Unmarshal(v, &tm) == nil && tm.APIVersion == gvr.GroupVersion().String()
		if err := dyn.Resource(gvr).Namespace("default").Delete(ctx, "storage-probe", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete the storage probe %s: %v", gvr, err)
		}
		if stored {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver still stores %s as %s 30 s after its CRD moved its storage version", gvr.GroupResource(), tm.APIVersion)
		}
	}
}

func assertStoredJSON(t *testing.T, c *cluster, key, apiVersion string) {
	t.Helper()
	v, _, _ := etcdValue(t, c.cli, key)
	var tm metav1.TypeMeta
	if err := json.Unmarshal(v, &tm); err != nil {
		t.Fatalf("%s: not JSON: %v", key, err)
	}
	if tm.APIVersion != apiVersion {
		t.Fatalf("%s stored as %s, want %s", key, tm.APIVersion, apiVersion)
	}
}

// waitServed waits until listing gvr succeeds (served) or fails (not served).
func waitServed(t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, served bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{})
		if (err == nil) == served {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s served=%v never took effect (last error %v)", gvr, served, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
