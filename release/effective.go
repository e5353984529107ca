package release

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/util/compatibility"
	basecompatibility "k8s.io/component-base/compatibility"

	"kube-etcd-migrate/internal/input"
)

// Error is a release the linked kube-apiserver cannot write for: not a
// MAJOR.MINOR version, newer than the linked release, older than its
// emulation reaches, or contradicted by what the target kube-apiserver is
// run with. Release is the release as given; the message says why and which
// releases are allowed.
type Error struct {
	Release string
	err     error
}

// Errorf is an *Error for release with the message of input.Errorf(format,
// args...) (which it wraps, %w included, and whose input names the command
// layer spells as flags).
func Errorf(release, format string, args ...any) *Error {
	return &Error{Release: release, err: input.Errorf(format, args...)}
}

func (e *Error) Error() string { return e.err.Error() }

func (e *Error) Unwrap() error { return e.err }

// EffectiveVersion returns the effective version of kube-apiserver of
// release ("" = the linked one) run with --emulated-version=emulated ("" =
// none), reproduced by the linked kube-apiserver's own compatibility code.
//
// Storage versions follow the minimum compatibility version: a version of a
// resource is stored only once every release from it on can read it. A real
// kube-apiserver of release R emulating E has min compatibility E-1, clamped
// to its own floor R-3. The linked binary emulating an older release clamps
// to its own, newer floor instead (1.37 emulating 1.34: 1.34, where a real
// 1.34 has 1.33, and would store DRA objects as resource.k8s.io/v1 where a
// real 1.34 stores v1beta2). So the minimum compatibility version is set to
// what the target release itself has, after the linked binary has validated
// the emulation.
func EffectiveVersion(release, emulated string) (basecompatibility.MutableEffectiveVersion, error) {
	ev := compatibility.DefaultBuildEffectiveVersion()
	if release == "" && emulated == "" {
		return ev, nil
	}
	binary := ev.BinaryVersion()
	allowed := ev.AllowedEmulationVersionRange()
	rel := version.MajorMinor(binary.Major(), binary.Minor())
	if release != "" {
		parsed, err := Parse(release)
		if err != nil {
			return nil, Errorf(release, "%s %q: %w (allowed %s)", input.TargetVersion, release, err, Range())
		}
		rel = parsed
	}
	emu := rel
	if emulated != "" {
		parsed, err := Parse(emulated)
		if err != nil {
			return nil, fmt.Errorf("--emulated-version %q: %w (allowed %s)", emulated, err, allowed)
		}
		if parsed.GreaterThan(rel) {
			return nil, fmt.Errorf("--emulated-version %s: kube-apiserver %s cannot emulate a newer release", emulated, rel)
		}
		emu = parsed
	}
	if rel.GreaterThan(version.MajorMinor(binary.Major(), binary.Minor())) {
		return nil, Errorf(release, "%s %s: newer than the Kubernetes release this tool carries (%d.%d); use a kube-etcd-migrate built with Kubernetes %s (allowed %s)", input.TargetVersion, rel, binary.Major(), binary.Minor(), rel, Range())
	}
	ev.SetEmulationVersion(emu)
	if errs := ev.Validate(); len(errs) > 0 {
		if emulated != "" {
			return nil, fmt.Errorf("--emulated-version %s: kube-apiserver %d.%d cannot emulate it: allowed %s", emu, binary.Major(), binary.Minor(), allowed)
		}
		return nil, Errorf(release, "%s %s: kube-apiserver %d.%d cannot reproduce it: allowed %s", input.TargetVersion, rel, binary.Major(), binary.Minor(), Range())
	}
	ev.SetMinCompatibilityVersion(minCompatibility(rel, emu))
	return ev, nil
}

// minCompatibility is kube-apiserver release rel's default
// --min-compatibility-version when it emulates emu: emu-1, but not below its
// floor rel-3 (k8s.io/apiserver's compatibility.DefaultBuildEffectiveVersion;
// its lower bound, 1.31, is below every release the linked one reaches).
func minCompatibility(rel, emu *version.Version) *version.Version {
	floor := version.MajorMinor(rel.Major(), rel.Minor()).SubtractMinor(3)
	minCompat := version.MajorMinor(emu.Major(), emu.Minor()).SubtractMinor(1)
	if minCompat.LessThan(floor) {
		return floor
	}
	return minCompat
}
