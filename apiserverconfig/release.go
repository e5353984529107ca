package apiserverconfig

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	"kube-etcd-migrate/decode"
)

// targetRelease decides which kube-apiserver release the tool writes for, from
// the tool's --target-version and the manifest's image and --emulated-version.
// An image of another minor than --target-version contradicts it, unless
// --target-version names what that image emulates: --target-version wins and
// the contradiction is returned as text (migrate refuses it; a read-only
// command warns, as for a check before an upgrade). "" = no evidence.
func targetRelease(flag, image, emulated string, file string) (release string, from Source, contradiction string, err error) {
	var flagRel, imageRel string
	if flag != "" {
		v, err := majorMinor(flag)
		if err != nil {
			return "", "", "", decode.NewReleaseError(flag, "--target-version %q: not a MAJOR.MINOR version (allowed %s)", flag, decode.TargetRange())
		}
		flagRel = v
	}
	if image != "" {
		imageRel = ImageRelease(image)
	}
	switch {
	case flagRel != "" && imageRel != "" && flagRel != imageRel:
		if emulated != "" {
			if e, err := majorMinor(emulated); err == nil && e == flagRel {
				return imageRel, FromImage, "", nil // the image's release, emulating --target-version
			}
		}
		return flagRel, FromTool, fmt.Sprintf("--target-version %s contradicts %s: its kube-apiserver image %s is release %s", flagRel, file, image, imageRel), nil
	case flagRel != "":
		if emulated != "" {
			if e, err := majorMinor(emulated); err == nil && e != flagRel {
				ev, _ := version.ParseGeneric(e)
				fv, _ := version.ParseGeneric(flagRel)
				if ev != nil && fv != nil && ev.GreaterThan(fv) {
					return "", "", "", decode.NewReleaseError(flag, "--target-version %s contradicts %s: it runs kube-apiserver with --emulated-version=%s, newer than the release", flagRel, file, emulated)
				}
			}
		}
		return flagRel, FromTool, "", nil
	case imageRel != "":
		return imageRel, FromImage, "", nil
	}
	return "", "", "", nil
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

func majorMinor(s string) (string, error) {
	v, err := version.ParseGeneric(strings.TrimPrefix(s, "v"))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", v.Major(), v.Minor()), nil
}

// SetRelease records the release found elsewhere (kubeadm's ClusterConfiguration
// in etcd) when nothing on the command line or in the manifest said it; the
// effective version becomes that release's. Before Apply.
func (c *Config) SetRelease(release string, src Source) error {
	rel, err := majorMinor(release)
	if err != nil {
		return fmt.Errorf("release %q (%s): not a version", release, src)
	}
	c.Release = rel
	c.From["release"] = src
	if c.EmulatedVersion == "" {
		v, _ := version.ParseGeneric(rel)
		c.effective.SetEmulationVersion(v)
	}
	return c.setEffective()
}

// setEffective makes the effective version the one the release's own
// kube-apiserver has (decode.TargetEffectiveVersion: its min compatibility
// version below the linked binary's floor included), refusing a release the
// linked kube-apiserver cannot reproduce.
func (c *Config) setEffective() error {
	if c.Release == "" {
		return nil
	}
	ev, err := decode.TargetEffectiveVersion(c.Release, c.EmulatedVersion)
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
	return decode.LinkedRelease()
}
