package release

import (
	"errors"
	"slices"
	"testing"
)

// TestParse: the one parser of a release takes MAJOR.MINOR with or without
// a "v" and a patch, and refuses what is not a version.
func TestParse(t *testing.T) {
	for in, want := range map[string]string{"1.37": "1.37", "v1.36.3": "1.36", "1.34.0-rc.1": "1.34"} {
		v, err := Parse(in)
		if err != nil || v.String() != want {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, v, err, want)
		}
	}
	for _, bad := range []string{"", "banana", "1"} {
		if v, err := Parse(bad); err == nil || err.Error() != "not a MAJOR.MINOR version" {
			t.Errorf("Parse(%q) = %v, %v; want an error", bad, v, err)
		}
	}
}

// TestRange: the linked release and the three before it; the generated data
// covers exactly the older ones.
func TestRange(t *testing.T) {
	if got := Range(); got != "1.34..1.37" {
		t.Errorf("Range() = %s, want 1.34..1.37", got)
	}
	if got := Linked(); got != "1.37" {
		t.Errorf("Linked() = %s, want 1.37", got)
	}
	if got, want := Generated(), []string{"1.34", "1.35", "1.36"}; !slices.Equal(got, want) {
		t.Errorf("Generated() = %v, want %v", got, want)
	}
	for _, r := range Generated() {
		if _, ok := TypesOf(r); !ok {
			t.Errorf("%s: no generated types", r)
		}
		if vs, ok := StorageVersions(r); !ok || vs["configmaps"] != "v1" {
			t.Errorf("%s: storage versions %v, %v", r, vs["configmaps"], ok)
		}
	}
	if _, ok := TypesOf(Linked()); ok {
		t.Errorf("the linked release has generated types")
	}
}

// TestEffectiveVersionRefuses: a release out of range is an *Error naming
// it, with the allowed range in its message.
func TestEffectiveVersionRefuses(t *testing.T) {
	for _, bad := range []string{"1.33", "1.38", "banana"} {
		_, err := EffectiveVersion(bad, "")
		var re *Error
		if !errors.As(err, &re) || re.Release != bad {
			t.Errorf("EffectiveVersion(%q): %v (%T), want an *Error", bad, err, err)
		}
	}
	ev, err := EffectiveVersion("1.34", "")
	if err != nil || ev.EmulationVersion().String() != "1.34" || ev.MinCompatibilityVersion().String() != "1.33" {
		t.Errorf("EffectiveVersion(1.34) = %v, %v; want emulation 1.34, min compatibility 1.33 (the real 1.34's)", ev, err)
	}
}
