package customresource

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured/unstructuredscheme"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/ptr"
)

func mustCodec(t testing.TB, crd *apiextensionsv1.CustomResourceDefinition, opts Options) *Codec {
	t.Helper()
	c, err := NewCodec(crd, opts)
	if err != nil {
		t.Fatalf("NewCodec: %v", err)
	}
	return c
}

func TestNoneConversionChangesOnlyAPIVersion(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", false), Options{})
	if c.StorageVersion() != "v1" {
		t.Fatalf("StorageVersion = %q", c.StorageVersion())
	}
	stored := apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{
		"size": int64(2), "color": "<blue> & \"green\"", "ratio": 0.5,
	}))
	u, info, err := c.Decode(stored)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if info.MediaType != MediaTypeJSON || info.GVK.Version != "v1beta1" || info.GVK.Kind != testKind {
		t.Fatalf("StoredInfo = %+v", info)
	}
	// A caller that filled resourceVersion from the etcd revision must not see it stored.
	u.SetResourceVersion("12345")
	got, err := c.Encode(context.Background(), u)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	want := bytes.Replace(stored, []byte(`"apiVersion":"stable.example.com/v1beta1"`), []byte(`"apiVersion":"stable.example.com/v1"`), 1)
	if bytes.Equal(want, stored) {
		t.Fatal("test bug: apiVersion not found in the stored value")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode:\n got %s\nwant %s", got, want)
	}
	if !bytes.HasSuffix(got, []byte("}\n")) || !bytes.Contains(got, []byte(`\u003cblue\u003e \u0026`)) {
		t.Fatalf("not the apiserver's JSON (trailing newline, HTML escaping): %s", got)
	}
	if u.GetResourceVersion() != "12345" || u.GetAPIVersion() != testGroup+"/v1beta1" {
		t.Fatal("Encode modified its argument")
	}

	// Already in the storage version: written back unchanged (GuaranteedUpdate would skip).
	u2, _, err := c.Decode(got)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Encode(context.Background(), u2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, got) {
		t.Fatalf("storage-version value not stable:\n%s\n%s", got, again)
	}
}

func TestDecodeRejectsForeignObjects(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", false), Options{})
	cases := map[string]map[string]interface{}{
		"unknown version": storedWidget("v2", nil),
		"other group": func() map[string]interface{} {
			m := storedWidget("v1", nil)
			m["apiVersion"] = "other.example.com/v1"
			return m
		}(),
		"other kind":  func() map[string]interface{} { m := storedWidget("v1", nil); m["kind"] = "Gadget"; return m }(),
		"no metadata": func() map[string]interface{} { m := storedWidget("v1", nil); delete(m, "metadata"); return m }(),
		"no kind":     func() map[string]interface{} { m := storedWidget("v1", nil); delete(m, "kind"); return m }(),
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			b := apiserverJSON(t, m)
			if _, _, err := c.Decode(b); err == nil {
				t.Fatalf("Decode accepted %s", b)
			} else if strings.Contains(err.Error(), "keep <me>") {
				t.Fatalf("error quotes the stored value: %v", err)
			}
		})
	}
}

func TestPruneCoerceAndDefaultOnRead(t *testing.T) {
	stored := storedWidget("v1beta1", map[string]interface{}{
		"color":   "red",
		"unknown": "dropped by pruning",
		"free":    map[string]interface{}{"anything": []interface{}{int64(1), "two"}},
	})
	md := stored["metadata"].(map[string]interface{})
	delete(md, "generation")
	md["bogus"] = "unknown metadata field"
	md["labels"] = map[string]interface{}{"app": "w", "bad": int64(7)} // malformed: dropped on read
	stored["extraTopLevel"] = true
	plaintext := apiserverJSON(t, stored)

	c := mustCodec(t, widgetCRD("v1", true), Options{})
	u, _, err := c.Decode(plaintext)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	spec := u.Object["spec"].(map[string]interface{})
	if _, ok := spec["unknown"]; ok {
		t.Error("spec.unknown not pruned")
	}
	if _, ok := u.Object["extraTopLevel"]; ok {
		t.Error("extraTopLevel not pruned")
	}
	if !reflect.DeepEqual(spec["free"], map[string]interface{}{"anything": []interface{}{int64(1), "two"}}) {
		t.Errorf("x-kubernetes-preserve-unknown-fields subtree changed: %v", spec["free"])
	}
	if spec["size"] != int64(3) {
		t.Errorf("default spec.size = %#v, want 3", spec["size"])
	}
	if _, ok := u.Object["metadata"].(map[string]interface{})["bogus"]; ok {
		t.Error("unknown metadata field kept")
	}
	if u.GetGeneration() != 1 {
		t.Errorf("generation = %d, want 1 (repairGeneration)", u.GetGeneration())
	}
	if u.GetLabels() != nil {
		// the whole labels field is malformed (a non-string value): dropped as a unit.
		t.Errorf("labels = %v, want dropped", u.GetLabels())
	}

	// preserveUnknownFields: nothing pruned, defaults still applied.
	crd := widgetCRD("v1", true)
	crd.Spec.PreserveUnknownFields = true
	cp := mustCodec(t, crd, Options{})
	u, _, err = cp.Decode(plaintext)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	spec = u.Object["spec"].(map[string]interface{})
	if spec["unknown"] != "dropped by pruning" || u.Object["extraTopLevel"] != true {
		t.Errorf("preserveUnknownFields: fields pruned: %v", u.Object)
	}
	if spec["size"] != int64(3) {
		t.Errorf("preserveUnknownFields: default spec.size = %#v, want 3", spec["size"])
	}
}

// Defaults of the stored version are applied on read, not those of the storage version
// (unstructuredDefaulter runs before conversion); pruning after conversion uses the
// storage version's schema.
func TestDefaultsAreThoseOfTheStoredVersion(t *testing.T) {
	crd := widgetCRD("v1", false)
	crd.Spec.Versions[1].Schema = widgetSchema("v1", true) // only v1 has the default
	c := mustCodec(t, crd, Options{})
	plaintext := apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{"oldName": "x"}))
	u, _, err := c.Decode(plaintext)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["spec"].(map[string]interface{})["size"]; ok {
		t.Fatal("v1 default applied to a v1beta1 object")
	}
	out, err := c.Encode(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	// None conversion keeps oldName; the v1 schema does not know it: pruned on write.
	if bytes.Contains(out, []byte("oldName")) || bytes.Contains(out, []byte(`"size"`)) {
		t.Fatalf("Encode = %s", out)
	}
}

func TestCBORStoredValue(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", true), Options{})
	m := storedWidget("v1beta1", map[string]interface{}{"color": "red", "size": int64(5), "ratio": 1.5, "unknown": "x"})
	ser := cbor.NewSerializer(unstructuredscheme.NewUnstructuredCreator(), unstructuredscheme.NewUnstructuredObjectTyper())
	var cb bytes.Buffer
	if err := ser.Encode(&unstructured.Unstructured{Object: m}, &cb); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(cb.Bytes(), []byte{0xd9, 0xd9, 0xf7}) {
		t.Fatalf("not self-described CBOR: % x", cb.Bytes()[:8])
	}
	u, info, err := c.Decode(cb.Bytes())
	if err != nil {
		t.Fatalf("Decode CBOR: %v", err)
	}
	if info.MediaType != MediaTypeCBOR || info.GVK.Version != "v1beta1" {
		t.Fatalf("StoredInfo = %+v", info)
	}
	fromCBOR, err := c.Encode(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	uj, _, err := c.Decode(apiserverJSON(t, m))
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := c.Encode(context.Background(), uj)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fromCBOR, fromJSON) {
		t.Fatalf("CBOR and JSON of the same object encode differently:\n%s\n%s", fromCBOR, fromJSON)
	}
	if !bytes.HasPrefix(fromCBOR, []byte(`{"apiVersion":"stable.example.com/v1",`)) {
		t.Fatalf("not JSON in v1: %s", fromCBOR)
	}
	// A CBOR value with only formatting to lose passes the guard; the unknown field is flagged.
	err = c.RoundTrip(cb.Bytes())
	var le *LossError
	if !errors.As(err, &le) || !reflect.DeepEqual(le.Pruned, []string{"spec.unknown"}) || le.Changed != nil {
		t.Fatalf("RoundTrip(CBOR) = %v", err)
	}
}

func webhookCRD(storage string, cc apiextensionsv1.WebhookClientConfig, reviewVersions []string) *apiextensionsv1.CustomResourceDefinition {
	crd := widgetCRD(storage, false)
	crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook:  &apiextensionsv1.WebhookConversion{ClientConfig: &cc, ConversionReviewVersions: reviewVersions},
	}
	return crd
}

func TestWebhookConversion(t *testing.T) {
	hook := &convWebhook{}
	srv := httptest.NewTLSServer(hook)
	t.Cleanup(srv.Close)
	ctx := context.Background()

	for _, reviewVersions := range [][]string{{"v1", "v1beta1"}, {"v1beta1"}, {"v2", "v1beta1", "v1"}} {
		t.Run(strings.Join(reviewVersions, ","), func(t *testing.T) {
			hook.setMode("")
			c := mustCodec(t, webhookCRD("v1", apiextensionsv1.WebhookClientConfig{
				URL: ptr.To(srv.URL + "/convert"), CABundle: tlsServerCABundle(srv),
			}, reviewVersions), Options{})
			stored := storedWidget("v1beta1", map[string]interface{}{"oldName": "n", "color": "red"})
			u, _, err := c.Decode(apiserverJSON(t, stored))
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Encode(ctx, u)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			want := storedWidget("v1", map[string]interface{}{"newName": "n", "color": "red"})
			want["metadata"].(map[string]interface{})["labels"] = map[string]interface{}{"app": "w", "converted": "true"}
			if !bytes.Equal(got, apiserverJSON(t, want)) {
				t.Fatalf("Encode:\n got %s\nwant %s", got, apiserverJSON(t, want))
			}
			hook.mu.Lock()
			gv := hook.reviewGV[len(hook.reviewGV)-1]
			path := hook.requestPaths[len(hook.requestPaths)-1]
			hook.mu.Unlock()
			wantGV := "apiextensions.k8s.io/" + map[string]string{"v1": "v1", "v1beta1": "v1beta1", "v2": "v1beta1"}[reviewVersions[0]]
			if gv != wantGV || path != "/convert" {
				t.Fatalf("webhook got a %s ConversionReview at %s, want %s at /convert", gv, path, wantGV)
			}
		})
	}

	c := mustCodec(t, webhookCRD("v1", apiextensionsv1.WebhookClientConfig{
		URL: ptr.To(srv.URL + "/convert"), CABundle: tlsServerCABundle(srv),
	}, []string{"v1"}), Options{})
	u, _, err := c.Decode(apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{"oldName": "n"})))
	if err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[string]string{
		"changeName":       "must have the same name",
		"changeUID":        "must have the same UID",
		"twoObjects":       "returned 2 objects, expected 1",
		"wrongResponseUID": "expected response.uid=",
		"fail":             "webhook refuses",
	} {
		hook.setMode(mode)
		if _, err := c.Encode(ctx, u); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mode %s: Encode error = %v, want %q", mode, err, want)
		}
	}
	hook.setMode("")

	// A caBundle that does not sign the server's certificate: refused.
	// (httptest servers all share one certificate: take another CA.)
	_, otherCA := newServiceTLSServer(t, hook, "other.webhooks.svc")
	bad := mustCodec(t, webhookCRD("v1", apiextensionsv1.WebhookClientConfig{
		URL: ptr.To(srv.URL + "/convert"), CABundle: otherCA,
	}, []string{"v1"}), Options{})
	if _, err := bad.Encode(ctx, u); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted webhook certificate accepted: %v", err)
	}

	// Already in the storage version: the webhook is not called.
	hook.mu.Lock()
	before := hook.calls
	hook.mu.Unlock()
	v1, _, err := c.Decode(apiserverJSON(t, storedWidget("v1", map[string]interface{}{"newName": "n"})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Encode(ctx, v1); err != nil {
		t.Fatal(err)
	}
	hook.mu.Lock()
	after := hook.calls
	hook.mu.Unlock()
	if after != before {
		t.Fatalf("webhook called for an object already in the storage version")
	}

	// Downgrade direction works too (storage v1beta1).
	down := mustCodec(t, webhookCRD("v1beta1", apiextensionsv1.WebhookClientConfig{
		URL: ptr.To(srv.URL + "/convert"), CABundle: tlsServerCABundle(srv),
	}, []string{"v1"}), Options{})
	out, err := down.Encode(ctx, v1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"oldName":"n"`)) || !bytes.Contains(out, []byte(`"apiVersion":"stable.example.com/v1beta1"`)) {
		t.Fatalf("downgrade: %s", out)
	}
}

func TestWebhookHonoursContext(t *testing.T) {
	hook := &convWebhook{}
	srv := httptest.NewTLSServer(hook)
	t.Cleanup(srv.Close)
	c := mustCodec(t, webhookCRD("v1", apiextensionsv1.WebhookClientConfig{
		URL: ptr.To(srv.URL + "/convert"), CABundle: tlsServerCABundle(srv),
	}, []string{"v1"}), Options{})
	u, _, err := c.Decode(apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{"oldName": "n"})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Encode(ctx, u); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("Encode with a cancelled context: %v", err)
	}
}

func TestStoredVersionsTrimmable(t *testing.T) {
	crd := widgetCRD("v1", false)
	crd.Status.StoredVersions = []string{"v1alpha1", "v1", "v1beta1"}
	if got := StoredVersionsTrimmable(crd); !reflect.DeepEqual(got, []string{"v1alpha1", "v1beta1"}) {
		t.Fatalf("StoredVersionsTrimmable = %v", got)
	}
	crd.Status.StoredVersions = []string{"v1"}
	if got := StoredVersionsTrimmable(crd); got != nil {
		t.Fatalf("StoredVersionsTrimmable = %v", got)
	}
}

// With CBORServingAndStorage on, kube-apiserver's CRD storage codec writes CBOR: so does
// the codec, for objects stored as JSON or as CBOR, and it reads both back.
func TestCBORGateWritesCBOR(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, genericfeatures.CBORServingAndStorage, true)
	c := mustCodec(t, widgetCRD("v1", false), Options{})
	if c.MediaType() != MediaTypeCBOR {
		t.Fatalf("MediaType = %q with the gate on, want %q", c.MediaType(), MediaTypeCBOR)
	}
	m := storedWidget("v1beta1", map[string]interface{}{"color": "<red>", "size": int64(5), "ratio": 1.5})
	u, info, err := c.Decode(apiserverJSON(t, m))
	if err != nil || info.MediaType != MediaTypeJSON {
		t.Fatalf("Decode JSON: %+v, %v", info, err)
	}
	got, err := c.Encode(context.Background(), u)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if !bytes.HasPrefix(got, []byte{0xd9, 0xd9, 0xf7}) {
		t.Fatalf("not self-described CBOR: %q", got)
	}
	back, info, err := c.Decode(got)
	if err != nil || info.MediaType != MediaTypeCBOR || info.GVK.Version != "v1" {
		t.Fatalf("Decode CBOR written: %+v, %v", info, err)
	}
	if back.GetName() != "w1" || back.Object["spec"].(map[string]interface{})["color"] != "<red>" {
		t.Fatalf("CBOR read back: %v", back.Object)
	}
	// Stored in CBOR in the storage version: written back byte for byte.
	again, err := c.Encode(context.Background(), back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, got) {
		t.Fatalf("CBOR storage-version value not stable:\n% x\n% x", got, again)
	}
	// Rewriting JSON as CBOR loses nothing; the guard says so.
	if err := c.RoundTrip(apiserverJSON(t, m)); err != nil {
		t.Fatalf("RoundTrip(JSON) with the gate on: %v", err)
	}
	if err := c.RoundTrip(got); err != nil {
		t.Fatalf("RoundTrip(CBOR) with the gate on: %v", err)
	}
}

func TestCBORGateOffWritesJSON(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, genericfeatures.CBORServingAndStorage, false)
	if mt := mustCodec(t, widgetCRD("v1", false), Options{}).MediaType(); mt != MediaTypeJSON {
		t.Fatalf("MediaType = %q with the gate off, want %q", mt, MediaTypeJSON)
	}
}

// TestEncodeDroppingNamesPrunedFields: conversion None from v1beta1 (spec.oldName)
// to the storage version v1 (spec.newName, no oldName): the write prunes
// spec.oldName, and EncodeDropping names it, and only it (fields of both
// versions, and free-form ones, are kept); an object already in v1 drops nothing.
func TestEncodeDroppingNamesPrunedFields(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", false), Options{})
	stored := apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{
		"size": int64(2), "oldName": "secret-ish value", "free": map[string]interface{}{"oldName": "kept"},
	}))
	u, _, err := c.Decode(stored)
	if err != nil {
		t.Fatal(err)
	}
	got, dropped, err := c.EncodeDropping(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"spec.oldName"}; !reflect.DeepEqual(dropped, want) {
		t.Fatalf("dropped %v, want %v", dropped, want)
	}
	if bytes.Contains(got, []byte("secret-ish value")) || !bytes.Contains(got, []byte(`"free":{"oldName":"kept"}`)) {
		t.Fatalf("written value: %s", got)
	}
	plain, err := c.Encode(context.Background(), u)
	if err != nil || !bytes.Equal(plain, got) {
		t.Fatalf("Encode and EncodeDropping write different bytes (%v):\n%s\n%s", err, plain, got)
	}
	v1, _, err := c.Decode(got)
	if err != nil {
		t.Fatal(err)
	}
	if _, dropped, err := c.EncodeDropping(context.Background(), v1); err != nil || dropped != nil {
		t.Fatalf("an object in the storage version: dropped %v, %v", dropped, err)
	}
}
