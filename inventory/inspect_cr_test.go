package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// TestInspectCustomResourceDroppedEntries: a widget stored in its storage
// version with twelve update managers. apiextensions-apiserver's field
// manager keeps ten on the next write, merging the oldest into one entry;
// inspect names the entries that go, as it does for built-ins.
func TestInspectCustomResourceDroppedEntries(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: "crd-uid", CreationTimestamp: metav1.Unix(1700000000, 0), Generation: 1},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type:                   "object",
					XPreserveUnknownFields: ptr.To(true),
				}}}},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
	}
	c.Put("/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", decode.CRDGroupResource, crd, "", "", "")
	var entries []any
	spec := map[string]any{}
	for i := range 12 {
		field := fmt.Sprintf("f%02d", i)
		spec[field] = int64(i)
		entries = append(entries, map[string]any{"manager": fmt.Sprintf("ctrl-%02d", i), "operation": "Update", "apiVersion": "example.com/v1",
			"time": fmt.Sprintf("2023-11-14T22:%02d:00Z", 10+i), "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{"f:spec": map[string]any{"f:" + field: map[string]any{}}}})
	}
	w := map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "ns1", "uid": "uid-w", "creationTimestamp": "2023-11-14T22:13:20Z", "generation": int64(1),
			"managedFields": entries},
		"spec": spec,
	}
	data, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	const key = "/registry/example.com/widgets/ns1/w"
	if _, err := c.Cli.Put(context.Background(), key, string(data)+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := Inspect(context.Background(), c.Env(pipeline.Config{}), key, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Rewrite == nil || got.Rewrite.Status != reencode.Stale || !slices.Contains(got.Rewrite.Reasons, reencode.ReasonManagedFields) {
		t.Fatalf("rewrite %+v: want stale by managed-fields", got.Rewrite)
	}
	if len(got.Rewrite.ManagedFieldsDropped) == 0 {
		t.Fatalf("rewrite %+v: no managedFields entry named as dropped", got.Rewrite)
	}
	for _, e := range got.Rewrite.ManagedFieldsDropped {
		if !strings.HasPrefix(e, "ctrl-0") || !strings.HasSuffix(e, " Update example.com/v1") {
			t.Errorf("dropped entry %q: want one of the oldest update managers", e)
		}
	}
}
