// Package release is what the tool knows of Kubernetes releases, and the one
// place that knows it: the release whose kube-apiserver code is linked, the
// range of releases the tool can write for (those the linked kube-apiserver's
// emulation reaches), the one parser of a MAJOR.MINOR release, a Release
// value (a release, its --emulated-version, and the effective and minimum
// compatibility versions of that release's own kube-apiserver, computed once
// by New) that every stage receives instead of a string, and
// the data generated from the older releases' own code by internal/build/releasegen
// (zz_generated_releases.go: storage versions, protobuf and JSON fields of
// their Go types, feature gate dependencies). It is a leaf: it imports no
// package of this module, and every package that asks "which release, and
// what does it do" asks it. A release it refuses is an *Error.
package release

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/util/compatibility"
)

// Parse parses a release, "1.37" or "v1.37.2", to its MAJOR.MINOR version
// (String() gives "1.37").
func Parse(s string) (*version.Version, error) {
	parsed, err := version.ParseGeneric(strings.TrimPrefix(s, "v"))
	if err != nil {
		return nil, fmt.Errorf("not a MAJOR.MINOR version")
	}
	return version.MajorMinor(parsed.Major(), parsed.Minor()), nil
}

// Linked is the Kubernetes release (MAJOR.MINOR) whose kube-apiserver code
// the tool carries, e.g. "1.37", from the linked modules' build version.
func Linked() string {
	bv := compatibility.DefaultBuildEffectiveVersion().BinaryVersion()
	return fmt.Sprintf("%d.%d", bv.Major(), bv.Minor())
}

// Range is the range of releases the linked kube-apiserver can reproduce,
// "1.34..1.37".
func Range() string {
	vs := Versions()
	if len(vs) == 0 {
		return "none"
	}
	return vs[0] + ".." + vs[len(vs)-1]
}

// Versions lists the releases the tool can write for, oldest first: the
// linked release and those its emulation reaches.
func Versions() []string {
	ev := compatibility.DefaultBuildEffectiveVersion()
	bv := ev.BinaryVersion()
	var out []string
	for m := int(bv.Minor()); m >= 0; m-- {
		probe := compatibility.DefaultBuildEffectiveVersion()
		probe.SetEmulationVersion(version.MajorMinor(bv.Major(), uint(m)))
		if len(probe.Validate()) > 0 {
			break
		}
		out = append([]string{fmt.Sprintf("%d.%d", bv.Major(), m)}, out...)
	}
	return out
}
