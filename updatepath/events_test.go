package updatepath

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	api "k8s.io/kubernetes/pkg/apis/core"
)

// event is a core Event as stored, with the managedFields entries given.
func event(entries ...metav1.ManagedFieldsEntry) *api.Event {
	return &api.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "e1", Namespace: "default", UID: "4d2b1c7e-0000-4000-8000-000000000002", ResourceVersion: "9", ManagedFields: entries},
		InvolvedObject:      api.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0"},
		Reason:              "Scheduled",
		Message:             "Successfully assigned",
		Type:                "Normal",
		ReportingController: "default-scheduler",
		ReportingInstance:   "default-scheduler-node1",
		Action:              "Binding",
		EventTime:           metav1.NewMicroTime(metav1.Unix(1700000000, 0).Time),
	}
}

// The fields the two groups' clients set (events.k8s.io/v1 names them
// regarding, note, reportingController; core v1 involvedObject, message).
const (
	eventsV1Fields = `{"f:action":{},"f:eventTime":{},"f:note":{},"f:reason":{},"f:regarding":{},"f:reportingController":{},"f:reportingInstance":{},"f:type":{}}`
	coreV1Fields   = `{"f:action":{},"f:eventTime":{},"f:involvedObject":{},"f:message":{},"f:reason":{},"f:reportingComponent":{},"f:reportingInstance":{},"f:type":{}}`
)

// TestEventsJudgedByTheirManagersGroup: an Event is current when a no-op
// update through the API group its managers wrote through leaves its
// managedFields unchanged: events.k8s.io for kube-scheduler's and the
// controllers' on the new events API, the core group for the others.
func TestEventsJudgedByTheirManagersGroup(t *testing.T) {
	for _, full := range []bool{false, true} {
		p := path(t)
		p.cfg.FullFieldManager = full
		for _, tc := range []struct {
			name    string
			entries []metav1.ManagedFieldsEntry
			changed bool
			left    []string
		}{
			{"events.k8s.io/v1", []metav1.ManagedFieldsEntry{entry("kube-scheduler", "events.k8s.io/v1", eventsV1Fields)}, false, []string{"kube-scheduler@events.k8s.io/v1"}},
			{"core v1", []metav1.ManagedFieldsEntry{entry("kubelet", "v1", coreV1Fields)}, false, []string{"kubelet@v1"}},
			// Not served: dropped by both groups' field managers; written
			// as events.k8s.io's, the group its manager wrote through.
			{"events.k8s.io/v1beta1", []metav1.ManagedFieldsEntry{entry("old", "events.k8s.io/v1beta1", eventsV1Fields), entry("kube-scheduler", "events.k8s.io/v1", eventsV1Fields)}, true, []string{"kube-scheduler@events.k8s.io/v1"}},
		} {
			ev := event(tc.entries...)
			changed, err := p.Apply(ev)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got := managers(ev.ManagedFields); changed != tc.changed || !slices.Equal(got, tc.left) {
				t.Errorf("full %v, %s: changed %v, managedFields %v; want changed %v, %v", full, tc.name, changed, got, tc.changed, tc.left)
			}
		}
	}
}

// TestEventsMixedManagers: an Event whose managers wrote through both
// groups is changed by a no-op update through either (each group's field
// manager drops the other's entries); it is written as the core group's no-op
// update writes it, the first of the groups its managers name.
func TestEventsMixedManagers(t *testing.T) {
	p := path(t)
	ev := event(entry("kubelet", "v1", coreV1Fields), entry("kube-scheduler", "events.k8s.io/v1", eventsV1Fields))
	changed, err := p.Apply(ev)
	if err != nil {
		t.Fatal(err)
	}
	if got := managers(ev.ManagedFields); !changed || !slices.Equal(got, []string{"kubelet@v1"}) {
		t.Errorf("changed %v, managedFields %v; want changed, [kubelet@v1]", changed, got)
	}
}

// TestEventsGroupNotServed: with events.k8s.io turned off (--runtime-config),
// no update can go through it: the core group's no-op update decides, and
// drops the entries of the version it does not serve.
func TestEventsGroupNotServed(t *testing.T) {
	p := path(t, "events.k8s.io/v1=false")
	ev := event(entry("kube-scheduler", "events.k8s.io/v1", eventsV1Fields))
	changed, err := p.Apply(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !changed || len(ev.ManagedFields) != 0 {
		t.Errorf("changed %v, managedFields %v; want changed, none left", changed, managers(ev.ManagedFields))
	}
}
