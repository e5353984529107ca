package decode

import (
	"errors"
	"testing"
)

// TestUsageErrorTypes: what a caller picks an exit code by is the error's
// type, never its text: a storage media type kube-apiserver does not store
// in and a resource name no built-in resource has are each their own type,
// saying the value given (a release it cannot write for: release.Error).
func TestUsageErrorTypes(t *testing.T) {
	_, err := NewStorageConfig("application/xml")
	var me *MediaTypeError
	if !errors.As(err, &me) || me.MediaType != "application/xml" || err.Error() != `storage media type "application/xml": want one of application/vnd.kubernetes.protobuf, application/json, application/yaml` {
		t.Errorf("media type application/xml: %v (%T), want a *MediaTypeError", err, err)
	}
	storage, err := NewStorageConfig("")
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewResolver("/registry", storage).ParseResource("nosuchthings")
	var rese *ResourceError
	if !errors.As(err, &rese) || rese.Name != "nosuchthings" || len(rese.Ambiguous) != 0 {
		t.Errorf("resource nosuchthings: %v (%T), want a *ResourceError", err, err)
	}
	amb := &ResourceError{Name: "events", Ambiguous: []string{"events", "events.events.k8s.io"}}
	if got := amb.Error(); got != `resource "events" is ambiguous: events, events.events.k8s.io` {
		t.Errorf("ambiguous: %q", got)
	}
}
