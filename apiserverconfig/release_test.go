package apiserverconfig

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"

	"kube-etcd-migrate/release"
)

func TestImageRelease(t *testing.T) {
	for image, want := range map[string]string{
		"registry.k8s.io/kube-apiserver:v1.37.2":                 "1.37",
		"registry.k8s.io/kube-apiserver:v1.36.0-rc.1":            "1.36",
		"myregistry:5000/k8s/kube-apiserver:v1.35.4":             "1.35",
		"registry.k8s.io/kube-apiserver:v1.37.2@sha256:0123abcd": "1.37",
		"registry.k8s.io/kube-apiserver@sha256:0123abcd":         "",
		"myregistry:5000/kube-apiserver":                         "",
		"kube-apiserver:latest":                                  "",
	} {
		got := ""
		if v := ImageRelease(image); v != nil {
			got = v.String()
		}
		if got != want {
			t.Errorf("ImageRelease(%q) = %q, want %q", image, got, want)
		}
	}
}

// The release the tool writes for, from the manifest's image and the tool's
// --target-version; the effective version is that release's own.
func TestManifestImageRelease(t *testing.T) {
	image := func(tag string) func(string) string {
		return func(s string) string {
			return strings.Replace(s, "image: registry.k8s.io/kube-apiserver:v1.37.2", "image: registry.k8s.io/kube-apiserver:"+tag, 1)
		}
	}
	cases := []struct {
		name          string
		in            Input
		release       string
		from          Source
		emulated      string
		minCompat     string
		contradiction bool
		err           string
	}{
		{name: "image", in: Input{Manifest: writeManifest(t, image("v1.36.3"))}, release: "1.36", from: FromImage, emulated: "1.36", minCompat: "1.35"},
		{name: "real 1.34 below 1.37's floor", in: Input{Manifest: writeManifest(t, image("v1.34.4"))}, release: "1.34", from: FromImage, emulated: "1.34", minCompat: "1.33"},
		{name: "flag agrees", in: Input{Manifest: writeManifest(t, image("v1.37.2")), TargetVersion: version.MajorMinor(1, 37)}, release: "1.37", from: FromTool, emulated: "1.37", minCompat: "1.36"},
		{name: "flag contradicts", in: Input{Manifest: writeManifest(t, image("v1.36.3")), TargetVersion: version.MajorMinor(1, 37)}, release: "1.37", from: FromTool, emulated: "1.37", minCompat: "1.36", contradiction: true},
		{name: "flag names what the image emulates", in: Input{Manifest: writeManifest(t, func(s string) string { return addFlag("--emulated-version=1.35")(image("v1.37.2")(s)) }), TargetVersion: version.MajorMinor(1, 35)}, release: "1.37", from: FromImage, emulated: "1.35", minCompat: "1.34"},
		{name: "no image tag", in: Input{Manifest: writeManifest(t, image("latest"))}, release: "", emulated: "1.37", minCompat: "1.36"},
		{name: "image newer than the tool", in: Input{Manifest: writeManifest(t, image("v1.38.0"))}, err: "newer than the Kubernetes release this tool carries"},
		{name: "image too old", in: Input{Manifest: writeManifest(t, image("v1.33.5"))}, err: "1.34..1.37"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := c.release
			if want == "" {
				want = release.Linked() // nothing names it: the linked one
			}
			if cfg.Release().String() != want || cfg.From["release"] != c.from || (cfg.Contradiction != nil) != c.contradiction {
				t.Errorf("release %s from %q contradiction %v; want %s from %q contradiction %v", cfg.Release(), cfg.From["release"], cfg.Contradiction, want, c.from, c.contradiction)
			}
			ev := cfg.Release().Effective()
			if ev.EmulationVersion().String() != c.emulated || ev.MinCompatibilityVersion().String() != c.minCompat {
				t.Errorf("emulation %s min compatibility %s, want %s %s", ev.EmulationVersion(), ev.MinCompatibilityVersion(), c.emulated, c.minCompat)
			}
		})
	}
}
