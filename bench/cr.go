package main

import (
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The custom-resource dataset (-dataset cr, -cr-n objects): every object a
// widget of the CRD widgets.bench.example.com, which has two versions, both
// served (v1beta1, and v1 the storage version); -stale-version of them (30 %
// by default) are stored in v1beta1, so migrate rewrites them in v1. Each
// carries the managedFields kube-apiserver leaves after a server-side apply
// through v1beta1 or v1 (manager kubectl, Apply), an update of its spec by a
// controller (Update, v1) and of its status through the status subresource
// (Update, v1, subresource status), sorted as its field manager writes them,
// at times of their own per object. So apiextensions-apiserver's field
// manager (NewDefaultCRDFieldManager, through the CRD's type converter and
// converter) runs on every object, as on a cluster run by operators.

const crNDefault = 30000

// crWidget gives u (a widget of the mixed dataset's form) its status and
// managedFields.
func crWidget(u *unstructured.Unstructured, s objSpec) {
	t0 := time.Unix(created.Unix()+int64(s.i), 0).UTC()
	at := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339) }
	applyVersion := crGroup + "/v1"
	if s.i%3 == 0 {
		applyVersion = crGroup + "/v1beta1"
	}
	u.Object["status"] = map[string]any{"ready": s.i%2 == 0}
	md := u.Object["metadata"].(map[string]any)
	md["managedFields"] = []any{
		map[string]any{"manager": "kubectl", "operation": "Apply", "apiVersion": applyVersion, "time": at(0), "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{
				"f:metadata": map[string]any{"f:labels": map[string]any{"f:app": map[string]any{}}},
				"f:spec":     map[string]any{"f:color": map[string]any{}, "f:size": map[string]any{}, "f:tags": map[string]any{}},
			}},
		map[string]any{"manager": "widget-controller", "operation": "Update", "apiVersion": crGroup + "/v1", "time": at(time.Minute), "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{"f:spec": map[string]any{"f:replicas": map[string]any{}}}},
		map[string]any{"manager": "widget-controller", "operation": "Update", "apiVersion": crGroup + "/v1", "time": at(2 * time.Minute), "fieldsType": "FieldsV1",
			"subresource": "status",
			"fieldsV1":    map[string]any{"f:status": map[string]any{".": map[string]any{}, "f:ready": map[string]any{}}}},
	}
}
