package migrate

import (
	"reflect"
	"testing"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/reencode"
)

// fill sets every field v holds, recursively, to a value that is not its
// zero (interfaces, which a stale decision never carries, are left nil).
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < 2; i++ {
			fill(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), n)
		v.Set(p)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	}
}

// TestHeldDecisionsComeBackWhole: a decision held while the first write
// waits comes back from the spool with every field as it was decided (a
// field added to reencode.Decision that the spool would drop or could not
// carry fails here).
func TestHeldDecisionsComeBackWhole(t *testing.T) {
	var d reencode.Decision
	n := 0
	fill(reflect.ValueOf(&d).Elem(), &n)
	d.Status = reencode.Stale
	for i := 0; i < reflect.TypeOf(d).NumField(); i++ {
		if f := reflect.TypeOf(d).Field(i); !f.IsExported() {
			t.Fatalf("reencode.Decision has an unexported field %s: the spool would drop it", f.Name)
		}
	}
	s, err := guard.OpenSpool[reencode.Decision](t.TempDir(), guard.SpoolMax)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []reencode.Decision{d, d}
	want[1].Key = "/registry/secrets/ns/other"
	if !s.Add(want, 1000) {
		t.Fatal("the spool refused a batch of two decisions")
	}
	var got []reencode.Decision
	if err := s.Drain(func(b []reencode.Decision) error { got = append(got, b...); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("held decisions came back as\n%+v\nwant\n%+v", got, want)
	}
}
