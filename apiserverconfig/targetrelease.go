package apiserverconfig

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
)

// targetRelease decides which kube-apiserver release the tool writes for, from
// the tool's --target-version and the manifest's image and --emulated-version.
// An image of another minor than --target-version contradicts it, unless
// --target-version names what that image emulates: --target-version wins and
// the contradiction is returned (migrate refuses it; a read-only command
// warns, as for a check before an upgrade). "" = no evidence.
func targetRelease(flag, image, emulated string, file string) (rel string, from Source, contradiction error, err error) {
	var flagRel, imageRel string
	if flag != "" {
		v, err := release.Parse(flag)
		if err != nil {
			return "", "", nil, release.Errorf(flag, "%s %q: not a MAJOR.MINOR version (allowed %s)", input.TargetVersion, flag, release.Range())
		}
		flagRel = v.String()
	}
	if image != "" {
		imageRel = ImageRelease(image)
	}
	switch {
	case flagRel != "" && imageRel != "" && flagRel != imageRel:
		if emulated != "" {
			if e, err := release.Parse(emulated); err == nil && e.String() == flagRel {
				return imageRel, FromImage, nil, nil // the image's release, emulating the one given
			}
		}
		return flagRel, FromTool, input.Errorf("%s %s contradicts %s: its kube-apiserver image %s is release %s", input.TargetVersion, flagRel, file, image, imageRel), nil
	case flagRel != "":
		if emulated != "" {
			if ev, err := release.Parse(emulated); err == nil && ev.String() != flagRel {
				if fv, err := release.Parse(flagRel); err == nil && ev.GreaterThan(fv) {
					return "", "", nil, release.Errorf(flag, "%s %s contradicts %s: it runs kube-apiserver with --emulated-version=%s, newer than the release", input.TargetVersion, flagRel, file, emulated)
				}
			}
		}
		return flagRel, FromTool, nil, nil
	case imageRel != "":
		return imageRel, FromImage, nil, nil
	}
	return "", "", nil, nil
}

// ImageRelease is the Kubernetes release (MAJOR.MINOR) of a kube-apiserver
// image reference by its tag (registry.k8s.io/kube-apiserver:v1.37.2 ->
// "1.37"); "" when the reference has no version tag (a digest only, "latest").
func ImageRelease(image string) string {
	ref := image
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon <= slash {
		return ""
	}
	tag := ref[colon+1:]
	if !strings.HasPrefix(tag, "v") {
		return ""
	}
	v, err := version.ParseSemantic(tag)
	if err != nil {
		if v, err = version.ParseGeneric(tag); err != nil {
			return ""
		}
	}
	return fmt.Sprintf("%d.%d", v.Major(), v.Minor())
}

// SetRelease records the release found elsewhere (kubeadm's ClusterConfiguration
// in etcd) when nothing on the command line or in the manifest said it; the
// effective version becomes that release's. Before Apply.
func (c *Config) SetRelease(found string, src Source) error {
	v, err := release.Parse(found)
	if err != nil {
		return fmt.Errorf("release %q (%s): not a version", found, src)
	}
	c.Release = v.String()
	c.From["release"] = src
	if c.EmulatedVersion == "" {
		c.effective.SetEmulationVersion(v)
	}
	return c.setEffective()
}

// setEffective makes the effective version the one the release's own
// kube-apiserver has (release.EffectiveVersion: its min compatibility
// version below the linked binary's floor included), refusing a release the
// linked kube-apiserver cannot reproduce.
func (c *Config) setEffective() error {
	if c.Release == "" {
		return nil
	}
	ev, err := release.EffectiveVersion(c.Release, c.EmulatedVersion)
	if err != nil {
		if src := c.From["release"]; src != FromTool && src != "" {
			return fmt.Errorf("%w (release %s from the %s)", err, c.Release, src)
		}
		return err
	}
	c.effective.SetEmulationVersion(ev.EmulationVersion())
	c.effective.SetMinCompatibilityVersion(ev.MinCompatibilityVersion())
	return nil
}

// ReleaseOrLinked is the release the tool writes for: Release, else the
// linked kube-apiserver's (assumed).
func (c *Config) ReleaseOrLinked() string {
	if c != nil && c.Release != "" {
		return c.Release
	}
	return release.Linked()
}
