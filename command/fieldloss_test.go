package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/plan"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/verify"
)

// legacyValue is the value of every gizmo's spec.legacy: no report may print it.
const legacyValue = "hunter2-legacy-value"

// gizmoCRD has v1alpha1 (no longer served; its schema has spec.legacy) and
// v1 (the storage version, without spec.legacy), conversion None: the CRD
// of a version "removed" by its operator, whose objects are still stored in it.
func gizmoCRD() *apiextensionsv1.CustomResourceDefinition {
	schema := func(props map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceValidation {
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type:       "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: props}},
		}}
	}
	names := apiextensionsv1.CustomResourceDefinitionNames{Plural: "gizmos", Singular: "gizmo", Kind: "Gizmo", ListKind: "GizmoList"}
	established := metav1.Unix(1700000000, 0)
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "gizmos.example.com", UID: "uid-crd-gizmos", Generation: 3, CreationTimestamp: established},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: names,
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1alpha1", Served: false, Storage: false, Schema: schema(map[string]apiextensionsv1.JSONSchemaProps{
					"size": {Type: "integer"}, "legacy": {Type: "string"},
				})},
				{Name: "v1", Served: true, Storage: true, Schema: schema(map[string]apiextensionsv1.JSONSchemaProps{
					"size": {Type: "integer"},
				})},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{
			AcceptedNames:  names,
			StoredVersions: []string{"v1alpha1", "v1"},
			Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
				{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue, Reason: "NoConflicts", Message: "no conflicts found", LastTransitionTime: established},
				{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue, Reason: "InitialNamesAccepted", Message: "the initial names have been accepted", LastTransitionTime: established},
			},
		},
	}
}

// putGizmo stores a gizmo as kube-apiserver wrote it in version.
func putGizmo(t *testing.T, c *testcluster.Cluster, name, version string, spec map[string]any) string {
	t.Helper()
	v, err := json.Marshal(map[string]any{"apiVersion": "example.com/" + version, "kind": "Gizmo",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": "uid-" + name, "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
		"spec":     spec})
	if err != nil {
		t.Fatal(err)
	}
	key := "/registry/example.com/gizmos/ns/" + name
	c.PutRaw(key, append(v, '\n'))
	return key
}

// TestFieldLossSurfaced (issue 27, item 4): three gizmos stored in v1alpha1
// carry spec.legacy, which v1's schema lacks; one stored in v1alpha1 does not,
// one is in v1 already. verify (table and JSON), plan and inspect name the
// field, the stored version and the count, never the value; migrate rewrites
// them (as kube-apiserver's next write would, dropping the field), says so,
// and its journal holds each original byte for byte.
func TestFieldLossSurfaced(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put("/registry/apiextensions.k8s.io/customresourcedefinitions/gizmos.example.com", decode.CRDGroupResource, gizmoCRD(), "", "", "")
	var lossy []string
	for i := 0; i < 3; i++ {
		lossy = append(lossy, putGizmo(t, c, fmt.Sprintf("g-%d", i), "v1alpha1", map[string]any{"size": i, "legacy": legacyValue}))
	}
	plainKey := putGizmo(t, c, "g-plain", "v1alpha1", map[string]any{"size": 7})
	putGizmo(t, c, "g-v1", "v1", map[string]any{"size": 8})
	before := c.Raw()
	conn := []string{"--endpoints", c.Srv.Endpoint, "--target-version", "1.37"}
	ep := []string{"--endpoints", c.Srv.Endpoint} // inspect's
	want := []reencode.FieldLoss{{Group: "example.com", Resource: "gizmos", StoredVersion: "v1alpha1", StorageVersion: "v1",
		Objects: 3, FirstKey: lossy[0], Fields: []reencode.FieldCount{{Path: "spec.legacy", Objects: 3}}}}
	row := regexp.MustCompile(`(?m)^\s+gizmos\.example\.com\s+v1alpha1\s+v1\s+spec\.legacy\s+3$`)
	noValue := func(what, out string) {
		t.Helper()
		if strings.Contains(out, legacyValue) {
			t.Errorf("%s prints the value of a dropped field:\n%s", what, out)
		}
	}

	// verify: the table's field-loss row and the JSON, exit 3 (stale, all readable).
	code, out, stderr := runCLI(t, append([]string{"verify"}, conn...)...)
	t.Logf("verify: exit %d\n%s%s", code, out, stderr)
	if code != exitStale || !row.MatchString(out) || !strings.Contains(out, "gizmos.example.com stored as v1alpha1: 3 object(s) lose fields") {
		t.Errorf("verify: exit %d, want %d and the field-loss row of spec.legacy in v1alpha1 for 3 objects", code, exitStale)
	}
	noValue("verify", out+stderr)
	code, out, _ = runCLI(t, append([]string{"verify", "-o", "json"}, conn...)...)
	var rep verify.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify -o json: exit %d, %v\n%s", code, err, out)
	}
	if !reflect.DeepEqual(rep.FieldLoss, want) {
		t.Errorf("verify -o json fieldLoss:\n got %+v\nwant %+v", rep.FieldLoss, want)
	}
	noValue("verify -o json", out)

	// plan: the same, in its table and JSON, and it proceeds.
	code, out, stderr = runCLI(t, append([]string{"plan", "--liveness-window", "500ms"}, conn...)...)
	t.Logf("plan: exit %d\n%s%s", code, out, stderr)
	if code != exitOK || !row.MatchString(out) || !strings.Contains(out, "field loss: migrate would rewrite 3 object(s) without these fields; its journal keeps each one's original value") {
		t.Errorf("plan: exit %d, want %d and the field-loss row of spec.legacy in v1alpha1 for 3 objects", code, exitOK)
	}
	noValue("plan", out+stderr)
	code, out, _ = runCLI(t, append([]string{"plan", "-o", "json", "--liveness-window", "500ms"}, conn...)...)
	var p plan.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("plan -o json: exit %d, %v\n%s", code, err, out)
	}
	if !reflect.DeepEqual(p.FieldLoss, want) {
		t.Errorf("plan -o json fieldLoss:\n got %+v\nwant %+v", p.FieldLoss, want)
	}

	// inspect: the key that carries the field names it; the one that does not, nothing.
	_, out, stderr = runCLI(t, append([]string{"inspect", lossy[1]}, ep...)...)
	t.Logf("inspect %s:\n%s", lossy[1], out)
	if !regexp.MustCompile(`(?m)^# drops field:\s+spec\.legacy \(in the schema of example\.com/v1alpha1, pruned by example\.com/v1's`).MatchString(out) {
		t.Errorf("inspect %s does not name spec.legacy:\n%s%s", lossy[1], out, stderr)
	}
	_, out, _ = runCLI(t, append([]string{"inspect", "-o", "json", lossy[1]}, ep...)...)
	var ins struct {
		Rewrite struct{ FieldsDropped []string }
	}
	if err := json.Unmarshal([]byte(out), &ins); err != nil || !reflect.DeepEqual(ins.Rewrite.FieldsDropped, []string{"spec.legacy"}) {
		t.Errorf("inspect -o json %s: fieldsDropped %v (%v)\n%s", lossy[1], ins.Rewrite.FieldsDropped, err, out)
	}
	_, out, _ = runCLI(t, append([]string{"inspect", plainKey}, ep...)...)
	if strings.Contains(out, "drops field") || !strings.Contains(out, "would rewrite it") {
		t.Errorf("inspect %s (no spec.legacy) names a dropped field or no rewrite:\n%s", plainKey, out)
	}
	if after := c.Raw(); !reflect.DeepEqual(after, before) {
		t.Fatal("a read-only command changed etcd")
	}

	// migrate: rewritten as kube-apiserver would, said so, the originals journaled.
	code, out, stderr = runCLI(t, append([]string{"migrate", "--liveness-window", "500ms"}, conn...)...)
	t.Logf("migrate: exit %d\n%s%s", code, out, stderr)
	if code != exitOK || !regexp.MustCompile(`(?m)^\s+gizmos\.example\.com\s+v1alpha1\s+v1\s+spec\.legacy\s+3$`).MatchString(out) {
		t.Fatalf("migrate: exit %d, want %d and the field-loss row", code, exitOK)
	}
	noValue("migrate", out+stderr)
	m := regexp.MustCompile(`field loss: 3 object\(s\) rewritten without these fields; their original values, fields included, are in the journal (\S+) \(`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("migrate's summary does not say where the originals are:\n%s", out)
	}
	journaled := journalOldValues(t, m[1])
	for _, key := range lossy {
		if !bytes.Equal(journaled[key], []byte(before[key])) {
			t.Errorf("%s: the journal holds %q, want the original %q", key, journaled[key], before[key])
		}
		v, _, _ := c.Get(key)
		if bytes.Contains(v, []byte("legacy")) || !bytes.Contains(v, []byte(`"apiVersion":"example.com/v1"`)) {
			t.Errorf("%s after migrate: %s, want v1 without spec.legacy", key, v)
		}
	}
	code, out, _ = runCLI(t, append([]string{"verify"}, conn...)...)
	if code != exitOK || strings.Contains(out, "Field loss") {
		t.Errorf("verify after migrate: exit %d, want %d and no field loss\n%s", code, exitOK, out)
	}
}

// journalOldValues reads a journal's intent records: key -> old value.
func journalOldValues(t *testing.T, path string) map[string][]byte {
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
