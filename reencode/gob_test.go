package reencode

import (
	"bytes"
	"encoding/gob"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
)

// fill sets every field of v, recursively, to a value of its own (n counts
// them), so that a field the encoding forgets cannot compare equal.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)) + string(rune('0'+*n%10)))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(1000*(*n) + 7))
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), n)
		}
		v.Set(s)
	case reflect.Uint8:
		v.SetUint(uint64(*n % 256))
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).Name == "Err" && v.Type() == reflect.TypeFor[Decision]() {
				continue // not kept: GobEncode refuses a decision with one
			}
			fill(t, v.Field(i), n)
		}
	default:
		t.Fatalf("a field of kind %s: teach fill (and GobEncode) about it", v.Kind())
	}
}

// roundTrip encodes ds as the run's spool does (a gob of the batch) and
// decodes it.
func roundTrip(t *testing.T, ds []Decision) []Decision {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(ds); err != nil {
		t.Fatal(err)
	}
	var out []Decision
	if err := gob.NewDecoder(&buf).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDecisionKeptOnDisk: a batch of decisions reads back from the disk
// the run keeps it on field for field (every field, a field added later
// too), nil and empty slices told apart.
func TestDecisionKeptOnDisk(t *testing.T) {
	var full Decision
	n := 0
	fill(t, reflect.ValueOf(&full).Elem(), &n)
	sparse := Decision{Key: "/registry/secrets/a/s", Resource: schema.GroupResource{Resource: "secrets"}, Status: Stale,
		Reasons: []Reason{}, OldValue: []byte{}, NewValue: nil}
	in := []Decision{full, sparse, {}}
	out := roundTrip(t, in)
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back:\n%#v\nwant\n%#v", out, in)
	}
	// What was read back is its own: the buffer it came from is not kept.
	out[0].NewValue[0]++
	if reflect.DeepEqual(in[0].NewValue, out[0].NewValue) {
		t.Fatal("the value read back shares its bytes")
	}
}

// TestDecisionWithErrorNotKept: a decision with an error is refused (the
// spool then sends the batch itself), and what does not read back whole is
// an error, never a panic.
func TestDecisionWithErrorNotKept(t *testing.T) {
	d := Decision{Key: "/registry/secrets/a/s", Err: &decode.Error{Key: "/registry/secrets/a/s", Reason: decode.ReasonCorruptPayload}}
	if err := gob.NewEncoder(&bytes.Buffer{}).Encode([]Decision{d}); err == nil {
		t.Fatal("a decision with an error was kept")
	}
	var full Decision
	n := 0
	fill(t, reflect.ValueOf(&full).Elem(), &n)
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
