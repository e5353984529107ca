package customresource

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// crShape is a managedFields list many custom resources of the corpus share,
// its times as seconds (-1: none).
type crShape struct {
	entries []metav1.ManagedFieldsEntry
	secs    []int64
}

var crFields = []string{`{"f:spec":{".":{},"f:size":{}}}`, `{"f:spec":{"f:color":{}}}`, `{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}`,
	`{"f:status":{"f:ready":{}}}`, `{"f:spec":{"f:free":{"f:x":{}}}}`, `{"f:nope":{}}`, `{"f:metadata":{"f:managedFields":{}}}`, `{}`, `"not a set"`}

func randomCRShape(r *mrand.Rand) crShape {
	clean := r.Intn(10) < 6
	n := 1 + r.Intn(3)
	if !clean && r.Intn(4) == 0 {
		n = 10 + r.Intn(4) // more than ten update managers
	}
	var s crShape
	for j := 0; j < n; j++ {
		e := metav1.ManagedFieldsEntry{Manager: fmt.Sprintf("m%d", j), Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: testGroup + "/v1",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(crFields[r.Intn(2)])}
		if r.Intn(4) == 0 {
			e.Operation = metav1.ManagedFieldsOperationApply
		}
		if r.Intn(3) == 0 {
			e.APIVersion = testGroup + "/v1beta1"
		}
		if !clean {
			e.Manager = fmt.Sprintf("m%d", r.Intn(12))
			e.APIVersion = []string{testGroup + "/v1", testGroup + "/v1beta1", testGroup + "/v0", "other.example.com/v1", "a/b/c"}[r.Intn(5)]
			e.FieldsV1 = metav1.NewFieldsV1(crFields[r.Intn(len(crFields))])
			if r.Intn(10) == 0 {
				e.Subresource = "status"
			}
			if r.Intn(20) == 0 {
				e.FieldsType = "FieldsV2"
			}
		}
		s.entries = append(s.entries, e)
		s.secs = append(s.secs, int64(1000+10*r.Intn(4)))
		if !clean && r.Intn(10) == 0 {
			s.secs[j] = -1
		}
	}
	if clean || r.Intn(2) == 0 {
		// Sorted as the field manager writes them (insertion sort on its keys).
		less := func(a, b int) bool {
			p, q := s.entries[a], s.entries[b]
			if p.Operation != q.Operation {
				return p.Operation < q.Operation
			}
			if ps, qs := max(s.secs[a], 0), max(s.secs[b], 0); ps != qs {
				return ps < qs
			}
			if p.Manager != q.Manager {
				return p.Manager < q.Manager
			}
			if p.APIVersion != q.APIVersion {
				return p.APIVersion < q.APIVersion
			}
			return p.Subresource < q.Subresource
		}
		for i := 1; i < len(s.entries); i++ {
			for j := i; j > 0 && less(j, j-1); j-- {
				s.entries[j], s.entries[j-1] = s.entries[j-1], s.entries[j]
				s.secs[j], s.secs[j-1] = s.secs[j-1], s.secs[j]
			}
		}
	}
	return s
}

// unstructuredEntries gives an object the shape's entries as stored JSON has
// them, the times shifted by an offset (the order kept) and now and then one
// moved (the order possibly changed).
func (s crShape) unstructuredEntries(t *testing.T, r *mrand.Rand) []interface{} {
	offset := int64(r.Intn(5)) * 100000
	moved := -1
	if r.Intn(6) == 0 {
		moved = r.Intn(len(s.entries))
	}
	var out []interface{}
	for i, e := range s.entries {
		if sec := s.secs[i]; sec >= 0 {
			if i == moved {
				sec += int64(r.Intn(41)) - 20
			}
			tm := metav1.NewTime(time.Unix(1735689600+offset+sec, 0).UTC())
			e.Time = &tm
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// itemsCRD is widgetCRD with spec.items, a list of map type keyed by name.
func itemsCRD() *apiextensionsv1.CustomResourceDefinition {
	crd := widgetCRD("v1", false)
	for i := range crd.Spec.Versions {
		spec := crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"]
		spec.Properties["items"] = apiextensionsv1.JSONSchemaProps{Type: "array", XListType: ptr.To("map"), XListMapKeys: []string{"name"},
			Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Required: []string{"name"},
				Properties: map[string]apiextensionsv1.JSONSchemaProps{"name": {Type: "string"}, "value": {Type: "integer"}}}}}
		crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"] = spec
	}
	return crd
}

// TestNoOpUpdateShortcutDifferential runs a generated corpus of custom
// resources of a CRD with two versions (v1 the storage version, v1beta1
// served; objects stored in either) through apiextensions-apiserver's field
// manager twice, each on its own codec: with the shortcut
// (updatepath.Memo) and with FullFieldManager, and asserts the same verdict
// and the same encoded bytes. managedFields are drawn from shapes many
// objects share: one to thirteen managers, Apply and Update, entries of both
// versions, of a version the CRD does not list, of another group, malformed,
// with subresources, unknown and metadata fields, a field set that is not
// one, a wrong fieldsType, times that keep or change the order; content
// with and without UID, and now and then a duplicate key in a list of map
// type. (No content found makes this field manager fail: the failures here
// come from the entries, which the key holds; updatepath's corpus has
// content that does.)
func TestNoOpUpdateShortcutDifferential(t *testing.T) {
	full := mustCodec(t, itemsCRD(), Options{StaticOpenAPISpec: staticSpec(t), Manager: "kube-etcd-migrate", FullFieldManager: true})
	short := mustCodec(t, itemsCRD(), Options{StaticOpenAPISpec: staticSpec(t), Manager: "kube-etcd-migrate"})
	r := mrand.New(mrand.NewSource(19))
	var shapes []crShape
	for j := 0; j < 40; j++ {
		shapes = append(shapes, randomCRShape(r))
	}
	var objects, changed, unchanged, errs int
	for i := 0; i < 2000; i++ {
		s := shapes[int(float64(len(shapes))*r.Float64()*r.Float64())]
		version := "v1"
		if r.Intn(3) == 0 {
			version = "v1beta1"
		}
		spec := map[string]interface{}{"size": int64(r.Intn(5)), "color": []string{"red", "blue"}[r.Intn(2)]}
		items := []interface{}{map[string]interface{}{"name": "a", "value": int64(r.Intn(3))}}
		if r.Intn(6) == 0 {
			// A duplicate key of a list of map type.
			items = append(items, map[string]interface{}{"name": "a", "value": int64(9)})
		}
		spec["items"] = items
		obj := storedWidget(version, spec)
		md := obj["metadata"].(map[string]interface{})
		md["name"] = fmt.Sprintf("w%d", i)
		if r.Intn(10) == 0 {
			delete(md, "uid")
		}
		md["managedFields"] = s.unstructuredEntries(t, r)
		stored := apiserverJSON(t, obj)

		var outs [2][]byte
		var verdicts [2]bool
		var failures [2]error
		for j, c := range []*Codec{short, full} {
			u, _, err := c.Decode(stored)
			if err != nil {
				t.Fatalf("object %d: Decode: %v", i, err)
			}
			verdicts[j], failures[j] = c.NoOpUpdate(u)
			if failures[j] == nil {
				if outs[j], err = c.Encode(context.Background(), u); err != nil {
					t.Fatalf("object %d: Encode: %v", i, err)
				}
			}
		}
		objects++
		if (failures[0] == nil) != (failures[1] == nil) {
			t.Fatalf("object %d: error %v with the shortcut, %v with the full field manager", i, failures[0], failures[1])
		}
		if failures[1] != nil {
			errs++
			continue
		}
		if verdicts[0] != verdicts[1] || !bytes.Equal(outs[0], outs[1]) {
			t.Fatalf("object %d: changed=%v with the shortcut, %v with the full field manager\nshortcut: %s\nfull:     %s", i, verdicts[0], verdicts[1], outs[0], outs[1])
		}
		if verdicts[1] {
			changed++
		} else {
			unchanged++
		}
	}
	hits := short.memo.Len()
	t.Logf("%d custom resources: %d changed, %d unchanged, %d errors; %d keys remembered", objects, changed, unchanged, errs, hits)
	if changed < objects/20 || unchanged < objects/3 || hits == 0 || hits > unchanged/4 {
		t.Errorf("corpus too uniform: %d changed, %d unchanged, %d keys remembered", changed, unchanged, hits)
	}
}
