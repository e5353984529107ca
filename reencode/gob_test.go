package reencode

import (
	"bytes"
	"encoding/gob"
	"errors"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
)

// keptDecision is a decision with every field set (migrate's
// TestHeldDecisionsComeBackWhole sets every field by reflection, through the
// spool itself).
func keptDecision() Decision {
	return Decision{
		Key: "/registry/secrets/a/s", Resource: schema.GroupResource{Group: "g", Resource: "secrets"}, Status: Stale,
		Reasons: []Reason{"key", "version"}, From: Form{"v1", "protobuf", "aescbc:key1"}, To: Form{"v1", "protobuf", "aescbc:key2"},
		Err:     &decode.Error{Key: "/registry/secrets/a/s", Reason: decode.ReasonOrphaned, Detail: "d", Orphan: "o"},
		Dropped: []string{".spec.x"}, ModRevision: 12, Lease: -3, Read: etcdscan.KVMeta{ModSub: 1, CreateRevision: 2, Version: 3, Lease: 4},
		OldSize: 5, OldValue: []byte("old"), NewValue: []byte("new"),
	}
}

// TestDecisionKeptOnDisk: a batch of decisions reads back from the disk
// the run keeps it on as it was, nil and empty slices told apart, its
// values its own.
func TestDecisionKeptOnDisk(t *testing.T) {
	sparse := Decision{Key: "/registry/secrets/a/s", Status: Stale, Reasons: []Reason{}, OldValue: []byte{}}
	in := []Decision{keptDecision(), sparse, {}}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(in); err != nil {
		t.Fatal(err)
	}
	var out []Decision
	if err := gob.NewDecoder(&buf).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back:\n%#v\nwant\n%#v", out, in)
	}
	out[0].NewValue[0]++
	if reflect.DeepEqual(in[0].NewValue, out[0].NewValue) {
		t.Fatal("the value read back shares its bytes")
	}
}

// TestDecisionNotKept: a decision whose error has a cause is refused (the
// spool then sends the batch itself), and what does not read back whole is
// an error, never a panic.
func TestDecisionNotKept(t *testing.T) {
	d := keptDecision()
	d.Err.Err = errors.New("cause")
	if err := gob.NewEncoder(&bytes.Buffer{}).Encode([]Decision{d}); err == nil {
		t.Fatal("a decision with an error's cause was kept")
	}
	full := keptDecision()
	b, err := full.GobEncode()
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(b) {
		var got Decision
		if err := got.GobDecode(b[:i]); err == nil {
			t.Fatalf("%d of %d bytes read back without an error", i, len(b))
		}
	}
	var got Decision
	if err := got.GobDecode(append(b, 0)); err == nil {
		t.Fatal("a byte after the decision read back without an error")
	}
}
