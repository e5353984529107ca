package apiserverconfig

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	basever "k8s.io/component-base/version"

	"kube-etcd-migrate/release"
)

// An older target's --feature-gates are checked as that release's own
// kube-apiserver checks them (its own gate dependencies, generated from its
// code): 1.35 and 1.34 accept AllAlpha=true, which 1.37's gate emulating
// them refuses (EventedPLEG depends there on PLEGOnDemandRelist, new in
// 1.36); 1.35 refuses what its own dependencies refuse, 1.34 (no
// dependencies yet) accepts it. Apply leaves off in the process what the
// linked code cannot have on at that release, and says so.
func TestOlderReleaseFeatureGates(t *testing.T) {
	cases := []struct {
		release, gates string
		err            string   // Load's error, "" = accepted
		off            []string // what Apply leaves off
	}{
		{release: "1.35", gates: "AllAlpha=true,AllBeta=true", off: []string{"EventedPLEG"}},
		{release: "1.34", gates: "AllAlpha=true,AllBeta=true", off: []string{"EventedPLEG"}},
		{release: "1.36", gates: "AllAlpha=true,AllBeta=true"},
		{release: "1.37", gates: "AllAlpha=true,AllBeta=true"},
		{release: "1.35", gates: "ProcMountType=true,UserNamespacesSupport=false", err: "ProcMountType is enabled, but depends on features that are disabled: [UserNamespacesSupport]"},
		{release: "1.34", gates: "ProcMountType=true,UserNamespacesSupport=false", off: []string{"ProcMountType"}},
	}
	for _, c := range cases {
		t.Run(c.release+" "+c.gates, func(t *testing.T) {
			cfg, err := Load(Input{TargetVersion: version.MustParse(c.release), FeatureGates: []string{c.gates}, RuntimeConfig: []string{"api/all=true"}})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Load: %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			t.Cleanup(func() { resetProcessGate(t, cfg) })
			off, err := cfg.Apply(cfg.Release())
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if !slices.Equal(off, c.off) {
				t.Errorf("left off %v, want %v", off, c.off)
			}
			if note := LinkedOffNote(cfg.Release(), off); (note != "") != (len(c.off) > 0) || (note != "" && !strings.Contains(note, c.off[0])) {
				t.Errorf("note %q", note)
			}
			gate := utilfeature.DefaultFeatureGate
			for _, f := range c.off {
				if gate.Enabled(featuregate.Feature(f)) {
					t.Errorf("%s on in the process", f)
				}
			}
			if strings.Contains(c.gates, "AllAlpha=true") && !gate.Enabled(genericfeatures.CBORServingAndStorage) {
				t.Errorf("%s: the alpha gate CBORServingAndStorage is off in the process", c.release)
			}
			if got := utilfeature.DefaultMutableFeatureGate.EmulationVersion().String(); got != c.release {
				t.Errorf("process gate emulates %s, want %s", got, c.release)
			}
		})
	}
}

// resetProcessGate puts the process's gate back to the linked release's
// defaults after cfg.Apply (Load copies it).
func resetProcessGate(t *testing.T, cfg *Config) {
	gate := utilfeature.DefaultMutableFeatureGate
	for _, f := range cfg.applied {
		if err := gate.ResetFeatureValueToDefault(featuregate.Feature(f)); err != nil {
			t.Error(err)
		}
	}
	v := version.MustParse(basever.DefaultKubeBinaryVersion)
	if err := gate.SetEmulationVersionAndMinCompatibilityVersion(v, v.SubtractMinor(1)); err != nil {
		t.Error(err)
	}
}

// The release found after Load (kubeadm's ClusterConfiguration in etcd):
// Apply again replaces what the first Apply set, at the release's version
// and with its own gate dependencies.
func TestFeatureGatesReappliedForTheRelease(t *testing.T) {
	cfg, err := Load(Input{FeatureGates: []string{"AllAlpha=true,AllBeta=true"}, RuntimeConfig: []string{"api/all=true"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resetProcessGate(t, cfg) })
	off, err := cfg.Apply(cfg.Release())
	if err != nil {
		t.Fatalf("Apply as 1.37: %v", err)
	}
	if len(off) != 0 {
		t.Errorf("left off %v as 1.37", off)
	}
	rel, err := release.New(version.MajorMinor(1, 35), cfg.Release().Emulated())
	if err != nil {
		t.Fatal(err)
	}
	if off, err = cfg.Apply(rel); err != nil {
		t.Fatalf("Apply as 1.35: %v", err)
	}
	if !slices.Equal(off, []string{"EventedPLEG"}) {
		t.Errorf("left off %v as 1.35, want [EventedPLEG]", off)
	}
	gate := utilfeature.DefaultMutableFeatureGate
	if got := gate.EmulationVersion().String(); got != "1.35" {
		t.Errorf("process gate emulates %s, want 1.35", got)
	}
	if gate.Enabled("EventedPLEG") || !gate.Enabled(genericfeatures.CBORServingAndStorage) {
		t.Errorf("EventedPLEG %v (want off), CBORServingAndStorage %v (want on)", gate.Enabled("EventedPLEG"), gate.Enabled(genericfeatures.CBORServingAndStorage))
	}
}
