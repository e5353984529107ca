package apiserverconfig

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/util/compatibility"
	basecompatibility "k8s.io/component-base/compatibility"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
)

// targetRelease decides which kube-apiserver release the tool writes for, from
// the tool's --target-version (flag) and the manifest's image and
// --emulated-version (emulated). An image of another minor than
// --target-version contradicts it, unless --target-version names what that
// image emulates: --target-version wins and the contradiction is returned
// (migrate refuses it; a read-only command warns, as for a check before an
// upgrade). nil = no evidence.
func targetRelease(flag *version.Version, image string, emulated *version.Version, file string) (rel *version.Version, from Source, contradiction error, err error) {
	imageRel := ImageRelease(image)
	switch {
	case flag != nil && imageRel != nil && !flag.EqualTo(imageRel):
		if emulated != nil && emulated.EqualTo(flag) {
			return imageRel, FromImage, nil, nil // the image's release, emulating the one given
		}
		return flag, FromTool, input.Errorf("%s %s contradicts %s: its kube-apiserver image %s is release %s", input.TargetVersion, flag, file, image, imageRel), nil
	case flag != nil:
		if emulated != nil && emulated.GreaterThan(flag) {
			return nil, "", nil, release.Errorf(flag.String(), "%s %s contradicts %s: it runs kube-apiserver with --emulated-version=%s, newer than the release", input.TargetVersion, flag, file, emulated)
		}
		return flag, FromTool, nil, nil
	case imageRel != nil:
		return imageRel, FromImage, nil, nil
	}
	return nil, "", nil, nil
}

// ImageRelease is the Kubernetes release (MAJOR.MINOR) of a kube-apiserver
// image reference by its tag (registry.k8s.io/kube-apiserver:v1.37.2 ->
// 1.37); nil when the reference has no version tag (a digest only, "latest").
func ImageRelease(image string) *version.Version {
	ref := image
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon <= slash {
		return nil
	}
	tag := ref[colon+1:]
	if !strings.HasPrefix(tag, "v") {
		return nil
	}
	v, err := version.ParseSemantic(tag)
	if err != nil {
		if v, err = version.ParseGeneric(tag); err != nil {
			return nil
		}
	}
	return version.MajorMinor(v.Major(), v.Minor())
}

// emulatedVersion is kube-apiserver's own entry of the command line's
// --emulated-version ("1.35", or "kube=1.35" among other components'), as
// its component registry reads it; nil when not given. It is read apart,
// before the registry that parses the whole command line is set: the release
// written for, and so the feature gate the command line is parsed with,
// depends on it. bad is the value when the registry refuses it.
func emulatedVersion(v pflag.Value) (emulated *version.Version, bad string, err error) {
	raw := kubeEmulatedVersion(v)
	if raw == "" {
		return nil, "", nil
	}
	reg := basecompatibility.NewComponentGlobalsRegistry()
	ev := compatibility.DefaultBuildEffectiveVersion()
	if err := reg.Register(basecompatibility.DefaultKubeComponent, ev, nil); err != nil {
		panic(err) // a fresh registry has no component yet
	}
	fs := pflag.NewFlagSet("emulated-version", pflag.ContinueOnError)
	fs.SetOutput(discard{})
	reg.AddFlags(fs)
	if err := fs.Set("emulated-version", raw); err != nil {
		return nil, raw, err
	}
	if err := reg.Set(); err != nil {
		return nil, raw, err
	}
	return ev.EmulationVersion(), "", nil
}

// kubeEmulatedVersion is kube-apiserver's own entry of --emulated-version
// ("1.35", or "kube=1.35" among other components').
func kubeEmulatedVersion(v pflag.Value) string {
	sv, ok := v.(pflag.SliceValue)
	if !ok {
		return v.String()
	}
	for _, e := range sv.GetSlice() {
		component, version, found := strings.Cut(e, "=")
		if !found {
			return component
		}
		if component == basecompatibility.DefaultKubeComponent {
			return version
		}
	}
	return ""
}

// badEmulatedVersion is the error of an --emulated-version the registry
// refuses, for a release named (without one, the registry's own refusal
// stands).
func badEmulatedVersion(raw string) error {
	return fmt.Errorf("--emulated-version %q: not a MAJOR.MINOR version (allowed %s)", raw, compatibility.DefaultBuildEffectiveVersion().AllowedEmulationVersionRange())
}
