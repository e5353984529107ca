package apiserverconfig

import (
	"fmt"
	"sort"
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
)

// releaseFeatureGate is the feature gate of the real kube-apiserver of an
// older release, as far as the linked code can have it: the linked gate's
// features (their specs by version, so that at the release's emulation
// version they are what the release had), with the dependencies among them
// that the release itself declares (release.FeatureDependencies,
// generated from its own code by internal/build/releasegen), not the linked
// release's. The linked release declares dependencies the older one did not
// (1.37: EventedPLEG on PLEGOnDemandRelist, a gate new in 1.36), so its gate
// emulating 1.35 refuses --feature-gates=AllAlpha=true, which 1.35's own
// kube-apiserver accepts. own is false for a release without such data (the
// linked one): gate is then a copy of the linked gate.
//
// A dependency on a gate the linked release no longer has is left out: the
// tool refuses that gate by name ("unrecognized feature gate") anyway.
func releaseFeatureGate(rel release.Release) (gate featuregate.MutableVersionedFeatureGate, own bool, err error) {
	deps, ok := release.FeatureDependencies(rel.String())
	if !ok {
		return utilfeature.DefaultMutableFeatureGate.DeepCopy(), false, nil
	}
	gate = utilfeature.DefaultMutableFeatureGate.DeepCopyAndReset() // known features, no dependencies
	known := gate.GetAllVersioned()
	add := map[featuregate.Feature][]featuregate.Feature{}
	for f, ds := range deps {
		if _, ok := known[featuregate.Feature(f)]; !ok {
			continue
		}
		var kept []featuregate.Feature
		for _, d := range ds {
			if _, ok := known[featuregate.Feature(d)]; ok {
				kept = append(kept, featuregate.Feature(d))
			}
		}
		if len(kept) > 0 {
			add[featuregate.Feature(f)] = kept
		}
	}
	if err := gate.AddDependencies(add); err != nil {
		return nil, false, fmt.Errorf("the feature gate dependencies of kube-apiserver %s: %w", rel, err)
	}
	return gate, true, nil
}

// linkedOff lists the feature gates that the real kube-apiserver of the
// release turns on with the flags (its own gate, releaseFeatureGate, at its
// effective version)
// but that the linked gate at the same emulation version cannot have on: a
// dependency the linked release declares is off at that release (a gate
// the release did not have yet), or one of those gates is left off in turn.
// Apply leaves them off in the process: the linked code cannot run them
// otherwise (1.35 with AllAlpha: EventedPLEG, which only the kubelet reads;
// TestOlderReleaseFeatureGates pins the list). An error is what the
// release's own kube-apiserver refuses.
func (c *Config) linkedOff(rel release.Release) ([]string, error) {
	gate, own, err := releaseFeatureGate(rel)
	if err != nil || !own {
		return nil, err
	}
	ev := rel.Effective()
	if err := gate.SetEmulationVersionAndMinCompatibilityVersion(ev.EmulationVersion(), ev.MinCompatibilityVersion()); err != nil {
		return nil, fmt.Errorf("--emulated-version: %w", err)
	}
	if c.FeatureGates != "" {
		if err := gate.Set(c.FeatureGates); err != nil {
			return nil, input.Errorf("%s (kube-apiserver %s): %w", input.FeatureGates, rel, err)
		}
	}
	off := map[featuregate.Feature]bool{}
	on := func(f featuregate.Feature) bool { return !off[f] && gate.Enabled(f) }
	linked := utilfeature.DefaultMutableFeatureGate.Dependencies()
	for changed := true; changed; {
		changed = false
		for f, ds := range linked {
			if !on(f) {
				continue
			}
			for _, d := range ds {
				if !on(d) {
					off[f], changed = true, true
					break
				}
			}
		}
	}
	out := make([]string, 0, len(off))
	for f := range off {
		out = append(out, string(f))
	}
	sort.Strings(out)
	return out, nil
}

// LinkedOffNote is the line the commands print when Apply left gates off
// for release rel, "" when it left none.
func LinkedOffNote(rel release.Release, off []string) string {
	if len(off) == 0 {
		return ""
	}
	return fmt.Sprintf("note: --feature-gates: %s on in kube-apiserver %s, off in the tool's linked kube-apiserver %s code, which declares dependencies on gates %s did not have",
		strings.Join(off, ", "), rel, release.Linked(), rel)
}
