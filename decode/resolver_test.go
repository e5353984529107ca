package decode

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/test/integration/etcd"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/release"
)

// upstreamOracle checks our key layout and storage-version choice against the
// data kube-apiserver's own integration test (TestEtcdStoragePath) asserts: for
// every persisted resource at a release, the etcd path and the stored GVK.
func upstreamOracle(t *testing.T, emulated string) {
	t.Helper()
	storage := storageFor(t, emulated)
	r := NewResolver("/registry", storage)
	for _, crd := range etcd.GetCustomResourceDefinitionData() {
		r.AddCustomResource(crd.Spec.Group, crd.Spec.Names.Plural)
	}
	var data map[schema.GroupVersionResource]etcd.StorageData
	if emulated == "" {
		data = etcd.GetEtcdStorageData()
	} else {
		data = etcd.GetEtcdStorageDataServedAt(emulated, true)
	}
	checked := 0
	for gvr, d := range data {
		info, err := r.Resolve(d.ExpectedEtcdPath)
		if err != nil {
			t.Errorf("%s: resolve %s: %v", gvr, d.ExpectedEtcdPath, err)
			continue
		}
		want := gvr.GroupResource()
		wantGV := gvr.GroupVersion()
		if d.ExpectedGVK != nil {
			wantGV = d.ExpectedGVK.GroupVersion()
			if d.ExpectedGVK.Group != gvr.Group { // cohabiting: stored by the other group
				want = schema.GroupResource{Group: d.ExpectedGVK.Group, Resource: gvr.Resource}
			}
		}
		if info.Resource != want {
			t.Errorf("%s: key %s resolved to %s, want %s", gvr, d.ExpectedEtcdPath, info.Resource, want)
			continue
		}
		if info.Custom {
			continue
		}
		rc, err := storage.Codec(info.Resource)
		if err != nil {
			t.Errorf("%s: %v", gvr, err)
			continue
		}
		// Upstream's data for an older release is what the linked
		// kube-apiserver emulating it stores; where that release's real
		// kube-apiserver stores otherwise (generated from its own code,
		// releasegen; proved by e2e's TestTargetOlderReleases), the real
		// release is the target.
		if gv, ok := release.StorageVersion(emulated, info.Resource); ok && gv != wantGV {
			t.Logf("%s: upstream's emulation of %s stores %s, the real %s stores %s", gvr, emulated, wantGV, emulated, gv)
			wantGV = gv
		}
		if rc.StorageVersion != wantGV {
			t.Errorf("emulated %q: %s is stored as %s by kube-apiserver, we would write %s", emulated, gvr, wantGV, rc.StorageVersion)
		}
		checked++
	}
	if checked < 60 {
		t.Fatalf("only %d built-in resources checked against upstream data", checked)
	}
}

func TestResolverAndStorageVersionsMatchUpstream(t *testing.T) {
	upstreamOracle(t, "")
}

// Every older release the tool writes for: the storage versions upstream's
// data gives for a server at that release.
func TestStorageVersionsMatchUpstreamAtOlderReleases(t *testing.T) {
	for _, v := range release.Versions() {
		if v == release.Linked() {
			continue
		}
		t.Run(v, func(t *testing.T) { upstreamOracle(t, v) })
	}
}

// kube-apiserver 1.37 run with --emulated-version=1.34 clamps its minimum
// compatibility version to its own floor (1.34), so types introduced in 1.34
// are storable: DRA objects as resource.k8s.io/v1. A real 1.34 has 1.33 and
// stores them as v1beta2. --target-version 1.34 means the real release; a
// manifest's --emulated-version the emulation.
func TestRealReleaseAndEmulationDiffer(t *testing.T) {
	for _, c := range []struct {
		release, emulated, want string
	}{
		{"1.34", "", "resource.k8s.io/v1beta2"},
		{release.Linked(), "1.34", "resource.k8s.io/v1"},
		{"1.35", "", "resource.k8s.io/v1"},
	} {
		var emulated *version.Version
		if c.emulated != "" {
			emulated = version.MustParse(c.emulated)
		}
		rel, err := release.New(version.MustParse(c.release), emulated)
		if err != nil {
			t.Fatal(err)
		}
		storage, err := NewStorageConfigFor(StorageOptions{Release: rel})
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range []string{"deviceclasses", "resourceclaimtemplates"} {
			rc, err := storage.Codec(schema.GroupResource{Group: "resource.k8s.io", Resource: res})
			if err != nil {
				t.Fatal(err)
			}
			if rc.StorageVersion.String() != c.want {
				t.Errorf("%s of release %s emulating %q: stored as %s, want %s", res, c.release, c.emulated, rc.StorageVersion, c.want)
			}
		}
	}
}

func TestResolveSpecialKeys(t *testing.T) {
	storage, err := NewStorageConfig("")
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver("/kubernetes.io", storage)
	r.AddCustomResource("example.com", "widgets")
	cases := []struct {
		key, gr, ns, name string
		reason            Reason
	}{
		{key: "/kubernetes.io/minions/node-1", gr: "nodes", name: "node-1"},
		{key: "/kubernetes.io/services/specs/default/kubernetes", gr: "services", ns: "default", name: "kubernetes"},
		{key: "/kubernetes.io/services/endpoints/default/kubernetes", gr: "endpoints", ns: "default", name: "kubernetes"},
		{key: "/kubernetes.io/controllers/ns1/rc", gr: "replicationcontrollers", ns: "ns1", name: "rc"},
		{key: "/kubernetes.io/ingress/ns1/web", gr: "ingresses.networking.k8s.io", ns: "ns1", name: "web"},
		{key: "/kubernetes.io/events/ns1/e.1", gr: "events", ns: "ns1", name: "e.1"},
		{key: "/kubernetes.io/deployments/ns1/d", gr: "deployments.apps", ns: "ns1", name: "d"},
		{key: "/kubernetes.io/masterleases/10.0.0.1", gr: "apiServerIPInfo", name: "10.0.0.1"},
		{key: "/kubernetes.io/ranges/serviceips", gr: "serviceipallocations", name: "serviceips"},
		{key: "/kubernetes.io/example.com/widgets/ns1/w", gr: "widgets.example.com", ns: "ns1", name: "w"},
		{key: "/kubernetes.io/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", gr: "customresourcedefinitions.apiextensions.k8s.io", name: "widgets.example.com"},
		{key: "/kubernetes.io/apiregistration.k8s.io/apiservices/v1.apps", gr: "apiservices.apiregistration.k8s.io", name: "v1.apps"},
		{key: "compact_rev_key", reason: ReasonNotObject},
		{key: "/registry/secrets/ns/s", reason: ReasonNotObject},
		{key: "/kubernetes.io/health", reason: ReasonNotObject},
		{key: "/kubernetes.io/other.io/gadgets/ns/g", reason: ReasonOrphaned},
		{key: "/kubernetes.io/nonsense/x", reason: ReasonOrphaned},
		{key: "/kubernetes.io/pods/ns/p/extra", reason: ReasonUnknownResource},
	}
	for _, c := range cases {
		info, err := r.Resolve(c.key)
		if c.reason != "" {
			e, ok := err.(*Error)
			if !ok || e.Reason != c.reason || e.Key != c.key {
				t.Errorf("%s: got %v, want %s", c.key, err, c.reason)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.key, err)
			continue
		}
		if info.Resource.String() != c.gr || info.Namespace != c.ns || info.Name != c.name {
			t.Errorf("%s: got %s ns=%q name=%q, want %s ns=%q name=%q", c.key, info.Resource, info.Namespace, info.Name, c.gr, c.ns, c.name)
		}
	}
}

func TestParseResourceAndTargetVersionErrors(t *testing.T) {
	storage, err := NewStorageConfig("")
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver("/registry", storage)
	for in, want := range map[string]string{"secrets": "secrets", "deployments.apps": "deployments.apps", "Deployments": "deployments.apps", "hpa": ""} {
		gr, err := r.ParseResource(in)
		if want == "" {
			if err == nil {
				t.Errorf("%q: want error, got %s", in, gr)
			}
			continue
		}
		if err != nil || gr.String() != want {
			t.Errorf("%q: got %s, %v; want %s", in, gr, err, want)
		}
	}
	if p, _ := r.KeyPrefix(schema.GroupResource{Resource: "nodes"}, ""); p != "/registry/minions/" {
		t.Errorf("nodes prefix %q", p)
	}
	if got := release.Range(); got != "1.34..1.37" {
		t.Errorf("release.Range() = %s, want 1.34..1.37 (kube-apiserver 1.37 reaches back three releases)", got)
	}
}

// TestPreviousReleaseStorageVersions: at --target-version of a previous
// release whose real storage versions were generated (releasegen), every
// built-in resource is stored in the version that release's own storage
// factory gives, where this release has it; 1.36 stores DeviceTaintRules
// as resource.k8s.io/v1alpha3, which 1.37's emulation of 1.36 does not.
func TestPreviousReleaseStorageVersions(t *testing.T) {
	if len(release.Generated()) == 0 {
		t.Fatal("no generated storage versions (go run ./internal/build/releasegen)")
	}
	for _, rel := range release.Generated() {
		versions, _ := release.StorageVersions(rel)
		storage := storageFor(t, rel)
		checked := 0
		for resource, version := range versions {
			gr := schema.ParseGroupResource(resource)
			gv, _ := schema.ParseGroupVersion(version)
			if gv.Group != gr.Group || !storage.IsBuiltin(gr) {
				continue
			}
			rc, err := storage.Codec(gr)
			if err != nil {
				t.Errorf("%s: %v", resource, err)
				continue
			}
			if rc.StorageVersion != gv && legacyscheme.Scheme.IsVersionRegistered(gv) {
				t.Errorf("--target-version %s: %s stored as %s, kube-apiserver %s stores %s", rel, resource, rc.StorageVersion, rel, gv)
			}
			checked++
		}
		if checked < 60 {
			t.Errorf("--target-version %s: only %d resources checked", rel, checked)
		}
	}
	storage := storageFor(t, "1.36")
	rc, err := storage.Codec(schema.GroupResource{Group: "resource.k8s.io", Resource: "devicetaintrules"})
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.StorageVersion.String(); got != "resource.k8s.io/v1alpha3" {
		t.Errorf("--target-version 1.36: DeviceTaintRules stored as %s, kube-apiserver 1.36 stores resource.k8s.io/v1alpha3", got)
	}
}

// TestTargetCannotStoreAVersionItLacks: 1.37 overrides DeviceTaintRules to
// resource.k8s.io/v1beta2, introduced in 1.36; a 1.35 or 1.34 target stores
// them in a version it has (its emulated default), never v1beta2.
func TestTargetCannotStoreAVersionItLacks(t *testing.T) {
	for _, release := range []string{"1.34", "1.35"} {
		storage := storageFor(t, release)
		rc, err := storage.Codec(schema.GroupResource{Group: "resource.k8s.io", Resource: "devicetaintrules"})
		if err != nil {
			t.Fatal(err)
		}
		if got := rc.StorageVersion.String(); got != "resource.k8s.io/v1alpha3" {
			t.Errorf("--target-version %s: DeviceTaintRules stored as %s, want resource.k8s.io/v1alpha3 (the only version %s has)", release, got, release)
		}
	}
}

// TestRawStorageNeverEncrypted: every raw-storage key (the peer endpoint leases
// included: /registry/peerserverleases/, UnknownVersionInteroperabilityProxy)
// resolves to a group/resource package encryption reads and writes as
// identity whatever the configuration says, as kube-apiserver does.
func TestRawStorageNeverEncrypted(t *testing.T) {
	gr := schema.GroupResource{Resource: "apiServerPeerIPInfo"}
	info, err := NewResolver("/registry", testStorage(t)).Resolve("/registry/peerserverleases/apiserver-1")
	if err != nil || info.Resource != gr {
		t.Errorf("peerserverleases resolve to %+v, %v; want %s", info, err, gr)
	}
	for _, k := range rawStorageKeys {
		if !encryption.NeverEncrypted(k.gr) {
			t.Errorf("%s (%s): encryption.NeverEncrypted = false, want true", k.segment, k.gr)
		}
	}
	if encryption.NeverEncrypted(secretsGR) {
		t.Errorf("encryption.NeverEncrypted(%s) = true, want false", secretsGR)
	}
}

// storageFor is the storage configuration of the real kube-apiserver of
// release rel ("" = the linked one).
func storageFor(t *testing.T, rel string) *StorageConfig {
	t.Helper()
	r, err := release.Named(rel)
	if err != nil {
		t.Fatal(err)
	}
	storage, err := NewStorageConfigFor(StorageOptions{Release: r})
	if err != nil {
		t.Fatal(err)
	}
	return storage
}
