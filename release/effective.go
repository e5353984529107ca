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

// Release is the kube-apiserver the tool writes as: a release (MAJOR.MINOR)
// run with an --emulated-version, and the effective version that release's
// own kube-apiserver has, checked once (New) against what the linked code can
// reproduce. It is a value: nothing changes it after New, and every stage
// reads the release from it rather than from a string. The zero Release is
// the linked kube-apiserver without --emulated-version.
type Release struct {
	version   *version.Version                   // MAJOR.MINOR; nil: the linked release
	emulated  *version.Version                   // --emulated-version; nil: none
	effective basecompatibility.EffectiveVersion // nil: the linked default
}

// ParseTarget parses the release an operator names as the target's
// (--target-version: "1.36", "v1.36.2"); nil for "" (none named). One that is
// not a MAJOR.MINOR version is an *Error.
func ParseTarget(s string) (*version.Version, error) {
	if s == "" {
		return nil, nil
	}
	v, err := Parse(s)
	if err != nil {
		return nil, Errorf(s, "%s %q: %w (allowed %s)", input.TargetVersion, s, err, Range())
	}
	return v, nil
}

// Named is the release s names (ParseTarget; "" = the linked one), run
// without --emulated-version.
func Named(s string) (Release, error) {
	v, err := ParseTarget(s)
	if err != nil {
		return Release{}, err
	}
	return New(v, nil)
}

// New is kube-apiserver of release v (nil = the linked one) run with
// --emulated-version=emulated (nil = none), with its effective version
// reproduced by the linked kube-apiserver's own compatibility code. A
// release the linked code cannot reproduce is an *Error.
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
func New(v, emulated *version.Version) (Release, error) {
	if v == nil && emulated == nil {
		return Release{}, nil
	}
	ev := compatibility.DefaultBuildEffectiveVersion()
	binary := ev.BinaryVersion()
	linked := version.MajorMinor(binary.Major(), binary.Minor())
	allowed := ev.AllowedEmulationVersionRange()
	rel := linked
	if v != nil {
		rel = version.MajorMinor(v.Major(), v.Minor())
	}
	emu := rel
	if emulated != nil {
		if emulated.GreaterThan(rel) {
			return Release{}, fmt.Errorf("--emulated-version %s: kube-apiserver %s cannot emulate a newer release", emulated, rel)
		}
		emu = version.MajorMinor(emulated.Major(), emulated.Minor())
	}
	if rel.GreaterThan(linked) {
		return Release{}, Errorf(rel.String(), "%s %s: newer than the Kubernetes release this tool carries (%s); use a kube-etcd-migrate built with Kubernetes %s (allowed %s)", input.TargetVersion, rel, linked, rel, Range())
	}
	ev.SetEmulationVersion(emu)
	if errs := ev.Validate(); len(errs) > 0 {
		if emulated != nil {
			return Release{}, fmt.Errorf("--emulated-version %s: kube-apiserver %s cannot emulate it: allowed %s", emu, linked, allowed)
		}
		return Release{}, Errorf(rel.String(), "%s %s: kube-apiserver %s cannot reproduce it: allowed %s", input.TargetVersion, rel, linked, Range())
	}
	ev.SetMinCompatibilityVersion(minCompatibility(rel, emu))
	r := Release{version: rel, effective: ev}
	if emulated != nil {
		r.emulated = emu
	}
	return r, nil
}

// Version is the release, MAJOR.MINOR.
func (r Release) Version() *version.Version {
	if r.version == nil {
		bv := compatibility.DefaultBuildEffectiveVersion().BinaryVersion()
		return version.MajorMinor(bv.Major(), bv.Minor())
	}
	return version.MajorMinor(r.version.Major(), r.version.Minor())
}

// String is the release, "1.37".
func (r Release) String() string { return r.Version().String() }

// IsLinked reports whether the release is the one whose code the tool
// carries (emulating an older one or not).
func (r Release) IsLinked() bool { return r.String() == Linked() }

// Emulated is the --emulated-version it runs with, nil when none.
func (r Release) Emulated() *version.Version {
	if r.emulated == nil {
		return nil
	}
	return version.MajorMinor(r.emulated.Major(), r.emulated.Minor())
}

// Emulates reports whether it emulates a release other than its own.
func (r Release) Emulates() bool {
	return r.emulated != nil && !r.emulated.EqualTo(r.Version())
}

// Effective is its effective version: binary, emulation and minimum
// compatibility versions (read only).
func (r Release) Effective() basecompatibility.EffectiveVersion {
	if r.effective == nil {
		return compatibility.DefaultBuildEffectiveVersion()
	}
	return r.effective
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
