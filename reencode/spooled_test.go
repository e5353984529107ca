package reencode

import (
	"errors"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
)

// TestDecisionSpooledReadsBack: a decision kept on disk comes back as it
// was, a nil slice or error as nil and an empty one as empty; one whose
// error holds an error is refused (as gob refused it); an encoding cut
// short or followed by more is an error, never a decision made up.
func TestDecisionSpooledReadsBack(t *testing.T) {
	full := Decision{
		Key: "/registry/secrets/ns/a", Resource: schema.GroupResource{Group: "g", Resource: "secrets"}, Status: Stale,
		Reasons: []Reason{ReasonEncryption, ReasonVersion},
		From:    Form{Version: "v1", MediaType: "protobuf", Encryption: "aescbc:key1"}, To: Form{Version: "v1", MediaType: "protobuf", Encryption: "aescbc:key2"},
		Err:         &decode.Error{Key: "/registry/secrets/ns/a", Reason: decode.ReasonOrphaned, Detail: "d", Orphan: "o"},
		Dropped:     []string{"spec.x", ""},
		ModRevision: 1 << 40, Lease: -3, Read: etcdscan.KVMeta{ModSub: 1, CreateRevision: 2, Version: 3, Lease: 4}, OldSize: 7,
		OldValue: []byte("k8s:enc:aescbc:v1:key1:\x00\xff"), NewValue: []byte("k8s:enc:aescbc:v1:key2:\x01"),
	}
	// Every field of full is set (but the error inside its error, which is
	// never kept): a field added to Decision, or to a type it holds, fails
	// here until AppendSpooled and ReadSpooled keep it.
	var unset func(v reflect.Value, path string)
	unset = func(v reflect.Value, path string) {
		switch {
		case path == ".Err.Err":
		case v.Kind() == reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				unset(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		case v.Kind() == reflect.Pointer && !v.IsNil():
			unset(v.Elem(), path)
		case v.IsZero():
			t.Errorf("the test's full decision leaves %s unset: a field AppendSpooled may not keep", path)
		}
	}
	unset(reflect.ValueOf(full), "")
	empty := Decision{Reasons: []Reason{}, Err: &decode.Error{}, Dropped: []string{}, OldValue: []byte{}, NewValue: []byte{}}
	ds := []Decision{full, {}, empty, {Key: "k", NewValue: []byte("v")}}
	var b []byte
	for i := range ds {
		var err error
		if b, err = ds[i].AppendSpooled(b); err != nil {
			t.Fatal(err)
		}
	}
	rest := b
	for i, want := range ds {
		var got Decision
		var err error
		if rest, err = got.ReadSpooled(rest); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decision %d came back as\n%#v\nwant\n%#v", i, got, want)
		}
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left after the decisions", len(rest))
	}

	// Cut short anywhere: an error.
	one, _ := full.AppendSpooled(nil)
	for n := 0; n < len(one); n++ {
		var got Decision
		if _, err := got.ReadSpooled(one[:n]); err == nil {
			t.Fatalf("a decision cut at byte %d of %d read back as %+v", n, len(one), got)
		}
	}
	// Its error's presence neither 0 nor 1.
	bad, _ := (&Decision{}).AppendSpooled(nil)
	bad[11] = 2
	if _, err := new(Decision).ReadSpooled(bad); err == nil {
		t.Fatal("a decision whose error is marked 2 read back")
	}

	withErr := full
	withErr.Err = &decode.Error{Key: "k", Err: errors.New("no key")}
	if _, err := withErr.AppendSpooled(nil); err == nil {
		t.Fatal("a decision whose error holds an error was kept")
	}
}
