package release

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
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

// TestNamedRefuses: a release out of range, or no version at all, is an
// *Error naming it, with the allowed range in its message.
func TestNamedRefuses(t *testing.T) {
	for _, bad := range []string{"1.20", "1.33", "1.38", "banana"} {
		_, err := Named(bad)
		var re *Error
		if !errors.As(err, &re) || re.Release != bad || !strings.Contains(err.Error(), "1.34..1.37") {
			t.Errorf("Named(%q): %v (%T), want an *Error", bad, err, err)
		}
	}
	_, err := Named("banana")
	if err.Error() != `target release "banana": not a MAJOR.MINOR version (allowed 1.34..1.37)` {
		t.Errorf("Named(banana): %v", err)
	}
}

// TestRelease: a release's effective version is its own kube-apiserver's
// (1.34: min compatibility 1.33, below the linked binary's floor); an
// emulated release is one the release's kube-apiserver can emulate; the
// zero Release is the linked kube-apiserver.
func TestRelease(t *testing.T) {
	r, err := Named("v1.34.2")
	if err != nil {
		t.Fatal(err)
	}
	if ev := r.Effective(); r.String() != "1.34" || r.IsLinked() || r.Emulates() || ev.EmulationVersion().String() != "1.34" || ev.MinCompatibilityVersion().String() != "1.33" {
		t.Errorf("1.34: %s, linked %v, emulates %v, effective %v; want emulation 1.34, min compatibility 1.33 (the real 1.34's)", r, r.IsLinked(), r.Emulates(), ev)
	}
	var zero Release
	if ev := zero.Effective(); zero.String() != Linked() || !zero.IsLinked() || zero.Emulated() != nil || ev.EmulationVersion().String() != Linked() {
		t.Errorf("the zero Release: %s, effective %v; want the linked %s", zero, ev, Linked())
	}
	emu, err := New(nil, version.MajorMinor(1, 35))
	if ev := emu.Effective(); err != nil || !emu.IsLinked() || !emu.Emulates() || emu.Emulated().String() != "1.35" || ev.EmulationVersion().String() != "1.35" || ev.MinCompatibilityVersion().String() != "1.34" {
		t.Errorf("the linked release emulating 1.35: %v, %v", emu.Effective(), err)
	}
	for _, c := range []struct {
		rel, emu *version.Version
		want     string
	}{
		{version.MajorMinor(1, 35), version.MajorMinor(1, 36), "--emulated-version 1.36: kube-apiserver 1.35 cannot emulate a newer release"},
		{nil, version.MajorMinor(1, 30), "--emulated-version 1.30: kube-apiserver 1.37 cannot emulate it: allowed 1.34..1.37(default:1.37)"},
		{version.MajorMinor(1, 38), nil, "target release 1.38: newer than the Kubernetes release this tool carries (1.37); use a kube-etcd-migrate built with Kubernetes 1.38 (allowed 1.34..1.37)"},
	} {
		if _, err := New(c.rel, c.emu); err == nil || err.Error() != c.want {
			t.Errorf("New(%v, %v): %v, want %q", c.rel, c.emu, err, c.want)
		}
	}
	if v, err := ParseTarget(""); v != nil || err != nil {
		t.Errorf(`ParseTarget(""): %v, %v; want none named`, v, err)
	}
}
