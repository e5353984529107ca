package customresource

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/updatepath"
)

var (
	staticSpecOnce sync.Once
	staticSpecPath *updatepath.Path
)

// staticSpec is the static OpenAPI spec of kube-apiserver 1.36 run with
// default flags, built once for the package's tests.
func staticSpec(t testing.TB) func() (map[string]*spec.Schema, error) {
	t.Helper()
	staticSpecOnce.Do(func() {
		cfg, err := apiserverconfig.Load(apiserverconfig.Input{})
		if err != nil {
			t.Fatal(err)
		}
		rc, err := cfg.ResourceConfig(cfg.Release().Effective())
		if err != nil {
			t.Fatal(err)
		}
		staticSpecPath = updatepath.New(updatepath.Config{ResourceConfig: rc, Effective: compatibility.DefaultBuildEffectiveVersion()})
	})
	if staticSpecPath == nil {
		t.Fatal("no kube-apiserver configuration")
	}
	return staticSpecPath.CustomResourceStaticSpec
}

func updateOptions(t testing.TB) Options {
	return Options{StaticOpenAPISpec: staticSpec(t), Manager: updatepath.Manager}
}

// widgetManagedFields are what kube-apiserver 1.36 records on a widget
// created by a server-side apply through v1beta1 and then updated through v1
// (Apply entries first, as its field manager sorts them).
func widgetManagedFields() []interface{} {
	return []interface{}{
		map[string]interface{}{
			"apiVersion": testGroup + "/v1beta1", "fieldsType": "FieldsV1", "manager": "kubectl", "operation": "Apply", "time": "2025-01-02T03:04:05Z",
			"fieldsV1": map[string]interface{}{
				"f:metadata": map[string]interface{}{"f:labels": map[string]interface{}{"f:app": map[string]interface{}{}}},
				"f:spec":     map[string]interface{}{"f:color": map[string]interface{}{}},
			},
		},
		map[string]interface{}{
			"apiVersion": testGroup + "/v1", "fieldsType": "FieldsV1", "manager": "operator", "operation": "Update", "time": "2025-01-03T03:04:05Z",
			"fieldsV1": map[string]interface{}{
				"f:spec": map[string]interface{}{"f:size": map[string]interface{}{}},
			},
		},
	}
}

// storedWithManagedFields is a widget stored in version by kube-apiserver,
// with managedFields (nil: none).
func storedWithManagedFields(t testing.TB, version string, managed []interface{}) []byte {
	t.Helper()
	obj := storedWidget(version, map[string]interface{}{"color": "red", "size": int64(2)})
	if managed != nil {
		obj["metadata"].(map[string]interface{})["managedFields"] = managed
	}
	return apiserverJSON(t, obj)
}

// runNoOpUpdate decodes stored, runs the no-op update and encodes the result.
func runNoOpUpdate(t *testing.T, c *Codec, stored []byte) (bool, []byte) {
	t.Helper()
	u, _, err := c.Decode(stored)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	changed, err := c.NoOpUpdate(u)
	if err != nil {
		t.Fatalf("NoOpUpdate: %v", err)
	}
	out, err := c.Encode(context.Background(), u)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return changed, out
}

// Entries of every version the CRD lists, served or not, are kept as
// apiextensions-apiserver keeps them: the stored bytes come back unchanged.
func TestNoOpUpdateKeepsEntriesOfListedVersions(t *testing.T) {
	for _, betaServed := range []bool{true, false} {
		crd := widgetCRD("v1", false)
		crd.Spec.Versions[0].Served = betaServed
		c := mustCodec(t, crd, updateOptions(t))
		for _, version := range []string{"v1", "v1beta1"} {
			stored := storedWithManagedFields(t, version, widgetManagedFields())
			changed, out := runNoOpUpdate(t, c, stored)
			if changed {
				t.Errorf("v1beta1 served=%v, stored in %s: NoOpUpdate reports managedFields changed", betaServed, version)
			}
			want := stored
			if version != "v1" {
				want = storedWithManagedFields(t, "v1", widgetManagedFields())
			}
			if !bytes.Equal(out, want) {
				t.Errorf("v1beta1 served=%v, stored in %s: encoded\n%s\nwant\n%s", betaServed, version, out, want)
			}
		}
	}
}

// Once v1beta1 is removed from spec.versions, the CR converter refuses it and
// the field manager fails. kube-apiserver 1.37's UpdateNoErrors then keeps the
// live object's managedFields (1.36 cleared them all; measured on 1.36.3, a
// no-op PUT emptied them): the stored bytes come back unchanged, as a no-op
// PUT to kube-apiserver 1.37 leaves them (e2e TestCustomResourceVersionRemoved).
func TestNoOpUpdateKeepsManagedFieldsOfRemovedVersion(t *testing.T) {
	crd := widgetCRD("v1", false)
	crd.Spec.Versions = crd.Spec.Versions[1:]
	crd.Status.StoredVersions = []string{"v1"}
	c := mustCodec(t, crd, updateOptions(t))

	withRemoved := storedWithManagedFields(t, "v1", widgetManagedFields())
	changed, out := runNoOpUpdate(t, c, withRemoved)
	if changed {
		t.Errorf("NoOpUpdate reports managedFields changed with an entry of the removed v1beta1; 1.37 keeps them")
	}
	if !bytes.Equal(out, withRemoved) {
		t.Errorf("encoded\n%s\nwant (managedFields kept)\n%s", out, withRemoved)
	}

	// Entries of v1 only: nothing to do.
	onlyV1 := widgetManagedFields()[1:]
	stored := storedWithManagedFields(t, "v1", onlyV1)
	changed, out = runNoOpUpdate(t, c, stored)
	if changed || !bytes.Equal(out, stored) {
		t.Errorf("entries of v1 only: changed=%v, encoded\n%s\nwant\n%s", changed, out, stored)
	}
	// No managedFields at all: the field manager does not start tracking.
	stored = storedWithManagedFields(t, "v1", nil)
	changed, out = runNoOpUpdate(t, c, stored)
	if changed || !bytes.Equal(out, stored) {
		t.Errorf("no managedFields: changed=%v, encoded\n%s\nwant\n%s", changed, out, stored)
	}
}

// More than ten update managers are merged into one, as for built-ins.
func TestNoOpUpdateCapsUpdateManagers(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", false), updateOptions(t))
	var managed []interface{}
	for i := 0; i < 11; i++ {
		managed = append(managed, map[string]interface{}{
			"apiVersion": testGroup + "/v1", "fieldsType": "FieldsV1", "manager": "m" + string(rune('a'+i)), "operation": "Update",
			"time":     "2025-01-0" + string(rune('1'+i%9)) + "T00:00:00Z",
			"fieldsV1": map[string]interface{}{"f:spec": map[string]interface{}{"f:size": map[string]interface{}{}}},
		})
	}
	changed, out := runNoOpUpdate(t, c, storedWithManagedFields(t, "v1", managed))
	if !changed {
		t.Fatalf("11 update managers kept as they are")
	}
	if !strings.Contains(string(out), "ancient-changes") {
		t.Errorf("encoded %s: no merged ancient-changes entry", out)
	}
}

// A conversion webhook that fails while the field manager converts between
// two listed versions is an error, not cleared managedFields; with the
// webhook working the entries are kept.
func TestNoOpUpdateWebhookFailureIsAnError(t *testing.T) {
	hook := &convWebhook{}
	srv := httptest.NewTLSServer(hook)
	t.Cleanup(srv.Close)
	opts := updateOptions(t)
	c := mustCodec(t, webhookCRD("v1", apiextensionsv1.WebhookClientConfig{
		URL: ptr.To(srv.URL + "/convert"), CABundle: tlsServerCABundle(srv),
	}, []string{"v1"}), opts)
	stored := storedWithManagedFields(t, "v1", widgetManagedFields())

	changed, out := runNoOpUpdate(t, c, stored)
	if changed || !bytes.Equal(out, stored) {
		t.Errorf("webhook working: changed=%v, encoded\n%s\nwant\n%s", changed, out, stored)
	}
	hook.mu.Lock()
	calls := hook.calls
	hook.mu.Unlock()
	if calls == 0 {
		t.Errorf("the field manager never converted the widget to v1beta1 through the webhook")
	}

	hook.setMode("fail")
	u, _, err := c.Decode(stored)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NoOpUpdate(u); err == nil || !strings.Contains(err.Error(), "webhook refuses") {
		t.Errorf("webhook failing: NoOpUpdate error = %v, want the webhook's", err)
	}
	if len(u.GetManagedFields()) != 2 {
		t.Errorf("webhook failing: managedFields changed to %v", u.GetManagedFields())
	}
}

func TestNoOpUpdateNeedsTheStaticSpec(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", false), Options{})
	u, _, err := c.Decode(storedWithManagedFields(t, "v1", widgetManagedFields()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NoOpUpdate(u); err == nil || !strings.Contains(err.Error(), "StaticOpenAPISpec") {
		t.Errorf("NoOpUpdate without a static spec: error %v", err)
	}
}

// BenchmarkNoOpUpdate is the field manager's cost on a custom resource with
// two managedFields entries of listed versions (nothing to change), as
// updatepath's BenchmarkApply is for a built-in object.
func BenchmarkNoOpUpdate(b *testing.B) {
	c := mustCodec(b, widgetCRD("v1", false), updateOptions(b))
	u, _, err := c.Decode(storedWithManagedFields(b, "v1", widgetManagedFields()))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.NoOpUpdate(u.DeepCopy()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if changed, err := c.NoOpUpdate(u.DeepCopy()); err != nil || changed {
			b.Fatalf("changed=%v err=%v", changed, err)
		}
	}
}
