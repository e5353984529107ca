package reencode

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestFieldLossesByResourceAndStoredVersion: dropped fields are counted per
// resource and stored version, each path by the objects that carry it; a
// decision that drops nothing is not counted.
func TestFieldLossesByResourceAndStoredVersion(t *testing.T) {
	gr := schema.GroupResource{Group: "example.com", Resource: "gizmos"}
	d := func(key, from string, dropped ...string) *Decision {
		return &Decision{Key: key, Resource: gr, Status: Stale, From: Form{Version: "example.com/" + from}, To: Form{Version: "example.com/v1"}, Dropped: dropped}
	}
	var t1 FieldLosses
	t1.Add(d("/registry/example.com/gizmos/ns/a", "v1alpha1", "spec.legacy"))
	t1.Add(d("/registry/example.com/gizmos/ns/b", "v1alpha1", "spec.legacy", "spec.old[*].x"))
	t1.Add(d("/registry/example.com/gizmos/ns/c", "v1alpha1"))
	t1.Add(d("/registry/example.com/gizmos/ns/d", "v1beta1", "spec.other"))
	want := []FieldLoss{
		{Group: "example.com", Resource: "gizmos", StoredVersion: "v1alpha1", StorageVersion: "v1", Objects: 2, FirstKey: "/registry/example.com/gizmos/ns/a",
			Fields: []FieldCount{{Path: "spec.legacy", Objects: 2}, {Path: "spec.old[*].x", Objects: 1}}},
		{Group: "example.com", Resource: "gizmos", StoredVersion: "v1beta1", StorageVersion: "v1", Objects: 1, FirstKey: "/registry/example.com/gizmos/ns/d",
			Fields: []FieldCount{{Path: "spec.other", Objects: 1}}},
	}
	if got := t1.List(); !reflect.DeepEqual(got, want) {
		t.Fatalf("List:\n got %+v\nwant %+v", got, want)
	}
	var none FieldLosses
	if got := none.List(); got != nil {
		t.Fatalf("nothing dropped: %+v", got)
	}
}
