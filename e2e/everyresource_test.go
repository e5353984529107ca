package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/verify"
)

// storageSetting is a kube-apiserver configuration as far as it decides the
// bytes it stores: the release (--emulated-version), --storage-media-type and
// the CBORServingAndStorage gate (custom resources in CBOR). Every API group
// and version is served (--runtime-config=api/all=true) with every alpha and
// beta feature on, as in the report of issue 18.
type storageSetting struct {
	release   string // --emulated-version; "" is the binary's own release
	mediaType string // --storage-media-type; "" is protobuf
	cbor      bool
	// binary is an older release (modbuild.OlderKubernetes, e.g. "v1.36.3")
	// whose real kube-apiserver runs as a process; "" is the linked
	// kube-apiserver in-process, always with every alpha and beta API.
	binary string
	// alpha: the real binary runs with every alpha and beta API and
	// feature (AllAlpha, AllBeta, api/all=true); else with its defaults
	// and beta APIs (api/beta=true).
	alpha bool
	// statusRefused, when not nil, are exactly the resources (a
	// GroupVersionResource's String()) whose status stub of the linked
	// release's storage data this setting's kube-apiserver refuses as
	// invalid (everyresource.Options.StatusRefused): those objects are
	// written without it. Kubernetes' storage data of an older release has
	// no status stubs.
	statusRefused []string
}

// target is the release the setting's kube-apiserver is, as --target-version takes it.
func (s storageSetting) target(t *testing.T) string {
	switch {
	case s.binary != "":
		return releaseMinor(t, s.binary)
	case s.release != "":
		return s.release
	}
	return currentMinor
}

const everyRuntimeConfig = "api/all=true"

func (s storageSetting) featureGates(t *testing.T) string {
	switch {
	case s.binary != "" && s.alpha:
		// A real kube-apiserver process: its own AllAlpha and AllBeta.
		return fmt.Sprintf("AllAlpha=true,AllBeta=true,CBORServingAndStorage=%t", s.cbor)
	case s.binary != "":
		return fmt.Sprintf("CBORServingAndStorage=%t", s.cbor)
	}
	// Every alpha gate of the release, named: AllAlpha=true with a gate
	// turned off would do for kube-apiserver and for the tool, but not for
	// the in-process kube-apiserver, whose test server copies to the
	// process's gate only the gates that differ from their defaults and then
	// lets AllAlpha set every alpha gate. Left out: the client-go gates
	// ClientsAllowCBOR and ClientsPreferCBOR (the process's gate backs
	// client-go's: the test's own clients would speak CBOR, and a dynamic
	// client's CBOR loses byte strings on a GET-then-PUT; they decide nothing
	// kube-apiserver stores) and CBORServingAndStorage, set as s says.
	gate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	if s.release != "" {
		if err := gate.SetEmulationVersion(utilversion.MustParse(s.release)); err != nil {
			t.Fatal(err)
		}
	}
	notNamed := map[featuregate.Feature]bool{"AllAlpha": true, genericfeatures.CBORServingAndStorage: true, "ClientsAllowCBOR": true, "ClientsPreferCBOR": true}
	specs := gate.GetAll()
	enabled := map[featuregate.Feature]bool{}
	for f, spec := range specs {
		switch {
		case spec.PreRelease == featuregate.Alpha && !spec.LockToDefault && !notNamed[f]:
			enabled[f] = true
		case spec.PreRelease == featuregate.Beta || spec.Default:
			enabled[f] = true // AllBeta=true, or on by default
		}
	}
	// An alpha gate that depends on one that does not exist yet at the
	// release is refused ("depends on features that are disabled"): leave
	// it out, as AllAlpha leaves it off.
	deps := gate.Dependencies()
	for changed := true; changed; {
		changed = false
		for f := range enabled {
			for _, d := range deps[f] {
				if !enabled[d] {
					delete(enabled, f)
					changed = true
					break
				}
			}
		}
	}
	var on []string
	for f := range enabled {
		if spec := specs[f]; spec.PreRelease == featuregate.Alpha {
			on = append(on, string(f)+"=true")
		}
	}
	sort.Strings(on)
	return fmt.Sprintf("AllBeta=true,%s,CBORServingAndStorage=%t", strings.Join(on, ","), s.cbor)
}

// runtimeConfig is the setting's --runtime-config.
func (s storageSetting) runtimeConfig() string {
	if s.binary != "" && !s.alpha {
		return betaAPIs
	}
	return everyRuntimeConfig
}

func (s storageSetting) String() string {
	r, mt, cr := s.release, s.mediaType, "json"
	switch {
	case s.binary != "" && s.alpha:
		r = "real " + s.binary + " (alpha)"
	case s.binary != "":
		r = "real " + s.binary
	case r == "":
		r = currentMinor
	}
	if mt == "" {
		mt = "protobuf"
	}
	if s.cbor {
		cr = "cbor"
	}
	return fmt.Sprintf("%s %s (custom resources %s)", r, strings.TrimPrefix(mt, "application/"), cr)
}

func (s storageSetting) apiserver(t *testing.T, encryptionConfig string) apiservertest.Options {
	o := apiservertest.Options{
		EmulatedVersion:      s.release,
		FeatureGates:         s.featureGates(t),
		RuntimeConfig:        everyRuntimeConfig,
		EncryptionConfigPath: encryptionConfig,
	}
	if s.mediaType != "" {
		o.ExtraFlags = append(o.ExtraFlags, "--storage-media-type="+s.mediaType)
	}
	if s.release == "1.34" || s.release == "1.35" {
		// 1.37's MutatingAdmissionPolicy admission plugin watches the v1 API,
		// which a 1.37 kube-apiserver emulating 1.35 or older does not
		// serve: the plugin never syncs and every write is refused ("not yet
		// ready to handle request"). A real 1.35 binary has no such plugin
		// code; the other test of the older releases runs their binaries.
		o.ExtraFlags = append(o.ExtraFlags, "--disable-admission-plugins=ServiceAccount,MutatingAdmissionPolicy")
	}
	return o
}

// toolFlags are the same settings given to the tool.
func (s storageSetting) toolFlags(t *testing.T) []string {
	flags := []string{"--target-version", s.target(t), "--feature-gates", s.featureGates(t), "--runtime-config", s.runtimeConfig()}
	if s.mediaType != "" {
		flags = append(flags, "--storage-media-type", s.mediaType)
	}
	return flags
}

// TestEveryPersistedResource is issue 18's proof for every setting that
// changes the stored bytes, with the linked release (1.37) as the target. For
// each case a kube-apiserver in the older setting (an older release emulated
// by the linked kube-apiserver, one storage media type, custom resources in
// JSON or CBOR, every resource encrypted with key1) creates one object of
// every resource it persists, in every version it serves, enumerated through
// its own discovery (internal/testrig/everyresource, Kubernetes' own storage-test
// stubs: a served resource without a stub fails the test), plus two CRDs of
// several versions whose storage version is then moved. The tool (the built
// binary, given the new setting as kube-apiserver flags) migrates: key
// rotation to key2, storage versions of the target release, the other media
// type, custom resources to or from CBOR. Then a kube-apiserver in the new
// setting with only key2 serves every object with the same content, and its
// no-op update (GET, PUT unchanged) of every object of every updatable
// resource keeps its resourceVersion: kube-apiserver finds each one exactly as
// it would store it.
//
// An older target is the real older release (its own storage versions and
// protobuf and JSON fields, --target-version), which the linked
// kube-apiserver emulating it is not: TestEveryPersistedResourceOlderTargets
// runs each older release's own binary.
func TestEveryPersistedResource(t *testing.T) {
	// The target is the linked release: --target-version of an older release
	// means that release's real kube-apiserver (its own storage versions and
	// fields), which a 1.37 server emulating it is not.
	cases := []struct {
		name     string
		from, to storageSetting
	}{
		{"from 1.36, protobuf to JSON, custom resources JSON to CBOR",
			storageSetting{release: "1.36"}, storageSetting{mediaType: "application/json", cbor: true}},
		{"from 1.36, JSON to protobuf, custom resources CBOR to JSON",
			storageSetting{release: "1.36", mediaType: "application/json", cbor: true}, storageSetting{}},
		{"from 1.35, protobuf to YAML, custom resources CBOR",
			storageSetting{release: "1.35", cbor: true}, storageSetting{mediaType: "application/yaml", cbor: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { everyResourceCase(t, tc.from, tc.to) })
	}
}

// startSetting starts the kube-apiserver of setting s on the cluster's etcd
// (stopping the previous one): the linked one in-process, or an older
// release's real binary as a process, on the port of the previous one.
func (c *cluster) startSetting(s storageSetting, encryptionConfig string) *rest.Config {
	c.t.Helper()
	if s.binary == "" {
		return c.start(s.apiserver(c.t, encryptionConfig))
	}
	c.stop()
	opts := apiserverproc.Options{
		Binary:               olderAPIServer(c.t, s.binary),
		EtcdURL:              c.etcd.URL,
		RuntimeConfig:        s.runtimeConfig(),
		FeatureGates:         s.featureGates(c.t),
		EncryptionConfigPath: encryptionConfig,
		Port:                 c.procPort,
	}
	if s.mediaType != "" {
		opts.ExtraFlags = append(opts.ExtraFlags, "--storage-media-type="+s.mediaType)
	}
	c.proc = apiserverproc.Start(c.t, opts)
	c.procPort = c.proc.Port
	return c.proc.ClientConfig
}

// linkedKnows reports whether the linked release's schemes have gvk.
func linkedKnows(gvk schema.GroupVersionKind) bool {
	return legacyscheme.Scheme.Recognizes(gvk) || apiextensionsapiserver.Scheme.Recognizes(gvk) || aggregatorscheme.Scheme.Recognizes(gvk)
}

// linkedHasGroup reports whether group is one of the linked release's
// built-in API groups (a custom resource's is not).
func linkedHasGroup(group string) bool {
	return legacyscheme.Scheme.IsGroupRegistered(group) || apiextensionsapiserver.Scheme.IsGroupRegistered(group) || aggregatorscheme.Scheme.IsGroupRegistered(group)
}

// linkedHas reports whether the linked release's schemes register gv.
func linkedHas(gv schema.GroupVersion) bool {
	return legacyscheme.Scheme.IsVersionRegistered(gv) || apiextensionsapiserver.Scheme.IsVersionRegistered(gv) || aggregatorscheme.Scheme.IsVersionRegistered(gv)
}

// TestEveryPersistedResourceOlderTargets is TestEveryPersistedResource with
// each older release --target-version accepts as the target, proven by that
// release's own kube-apiserver binary (modbuild.OlderKubernetes; side by
// side, each on an etcd of its own): it writes one object of every resource
// it persists, custom resources in JSON or CBOR; the tool migrates with the
// key rotation to another --storage-media-type and custom resources to the
// other of JSON and CBOR; the same binary so configured serves everything
// unchanged and writes nothing on a no-op update. Every release: with its
// default gates and beta APIs, protobuf to JSON (custom resources JSON to
// CBOR); and with every alpha and beta API and feature on (AllAlpha,
// AllBeta, api/all=true, the same flags given to the tool): 1.36 JSON to
// protobuf (CBOR to JSON), 1.35 and 1.34 protobuf to YAML. The previous
// release also protobuf to YAML with its default gates.
//
// With every alpha API on, what the linked release's code cannot read as
// the older release stores it is not written (logged: 1.36's and 1.35's
// scheduling.k8s.io alpha Workloads, 1.34's v1alpha1 PodCertificateRequests
// and StorageVersionMigrations; docs/design.md, known limits), and the
// status examples of the linked release's storage data that an older
// release's validation refuses are listed exactly (statusRefused).
func TestEveryPersistedResourceOlderTargets(t *testing.T) {
	type tc struct {
		name     string
		from, to storageSetting
	}
	var cases []tc
	for _, release := range modbuild.OlderKubernetes {
		cases = append(cases, tc{releaseMinor(t, release) + ", protobuf to JSON, custom resources JSON to CBOR",
			storageSetting{binary: release}, storageSetting{binary: release, mediaType: "application/json", cbor: true}})
	}
	prev, r135, r134 := modbuild.OlderKubernetes[0], modbuild.OlderKubernetes[1], modbuild.OlderKubernetes[2]
	cases = append(cases,
		tc{previousMinor(t) + ", protobuf to YAML, custom resources CBOR to JSON",
			storageSetting{binary: prev, cbor: true}, storageSetting{binary: prev, mediaType: "application/yaml"}},
		tc{previousMinor(t) + " alpha, JSON to protobuf, custom resources CBOR to JSON",
			storageSetting{binary: prev, alpha: true, mediaType: "application/json", cbor: true}, storageSetting{binary: prev, alpha: true}},
		tc{releaseMinor(t, r135) + " alpha, protobuf to YAML, custom resources JSON to CBOR",
			// 1.37's example status of a StorageVersionMigration has no
			// resourceVersion, which 1.35's validation requires.
			storageSetting{binary: r135, alpha: true, statusRefused: []string{"storagemigration.k8s.io/v1beta1, Resource=storageversionmigrations"}}, storageSetting{binary: r135, alpha: true, mediaType: "application/yaml", cbor: true}},
		tc{releaseMinor(t, r134) + " alpha, protobuf to YAML, custom resources CBOR to JSON",
			storageSetting{binary: r134, alpha: true, cbor: true, statusRefused: []string{}}, storageSetting{binary: r134, alpha: true, mediaType: "application/yaml"}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			everyResourceCase(t, c.from, c.to)
		})
	}
}

func everyResourceCase(t *testing.T, from, to storageSetting) {
	ctx := context.Background()
	c := newCluster(t)
	all := []string{"'*.*'"}
	oldKeys := c.writeEncryptionConfig("key1.yaml", all, aescbcProvider("key1", 1), identityProvider)
	rotation := c.writeEncryptionConfig("key2-key1.yaml", all, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	newKeys := c.writeEncryptionConfig("key2.yaml", all, aescbcProvider("key2", 2), identityProvider)

	// 1. The older setting writes everything.
	cfg := c.startSetting(from, oldKeys)
	skipped := map[schema.GroupVersionResource]bool{}
	res, err := everyresource.Create(ctx, cfg, everyresource.Options{
		StatusRefused: from.statusRefused != nil,
		// Nothing the linked release's code cannot read (dropped below): an
		// API version it does not have, or a kind the older release stores
		// in a version that has no such kind in the linked release (1.34's
		// PodCertificateRequests in certificates.k8s.io/v1alpha1, where 1.37
		// has ClusterTrustBundles only).
		Skip: func(gvr schema.GroupVersionResource, kind schema.GroupVersionKind) bool {
			gv, ok := release.StorageVersion(from.target(t), gvr.GroupResource())
			builtin := linkedHasGroup(gvr.Group)
			if (builtin && !linkedHas(gvr.GroupVersion())) || (from.binary != "" && ok && !linkedKnows(gv.WithKind(kind.Kind))) {
				skipped[gvr] = true
			}
			return skipped[gvr]
		},
	})
	if err != nil {
		t.Fatalf("create every resource under %s: %v", from, err)
	}
	if from.statusRefused != nil {
		var refused []string
		for gvr, e := range res.StatusRefused {
			refused = append(refused, gvr.String())
			t.Logf("kube-apiserver %s refuses the status stub of %s (the object is written without it): %s", from, gvr, e)
		}
		sort.Strings(refused)
		want := slices.Sorted(slices.Values(from.statusRefused))
		if !slices.Equal(refused, want) {
			t.Errorf("kube-apiserver %s refused the status stubs of %q, want exactly %q", from, refused, want)
		}
	}
	var missing, dropped []schema.GroupVersionResource
	for _, gvr := range res.Missing {
		if !skipped[gvr] {
			missing = append(missing, gvr)
		} else {
			dropped = append(dropped, gvr)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("kube-apiserver %s serves and persists resources Kubernetes' storage data at %s has no stub for, so this test writes none of them: %v", from, res.Version, missing)
	}
	if len(dropped) > 0 {
		// An alpha API version an older release serves and the linked
		// release no longer has (1.36's scheduling.k8s.io/v1alpha2), or
		// whose storage version has no such kind in the linked release:
		// the tool, the linked release's code, could not read what is
		// stored through it (docs/design.md, known limits). None is
		// written.
		t.Logf("kube-apiserver %s serves resources the linked release cannot read as that release stores them; nothing written through them: %v", from, dropped)
	}
	if len(res.FromRelease) > 0 {
		t.Logf("written from the stubs of %s's own storage test (1.37's have none): %v", res.Version, res.FromRelease)
	}
	created := map[schema.GroupResource]bool{}
	owned := apiserverOwned{}
	for _, o := range res.Objects {
		created[o.GVR.GroupResource()] = true
		if o.GVR.GroupResource() == storageVersion {
			owned[o.Name] = true
		}
	}
	gadgets := createGadgets(t, cfg, everyresource.DefaultNamespace)
	// Both CRDs of several versions move their storage version: every object
	// stored before is stale by version for the tool.
	moveCRDStorageVersion(t, cfg, "pandas.awesome.bears.com", "v3")
	moveCRDStorageVersion(t, cfg, gadgetsCRD, "v1")
	// A write from here on, by the server itself (or the next one), shows
	// in managedFields at since or later (their times are kept to the
	// second): sameContentEvery leaves such objects out.
	since := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(since))
	before := snapshot(t, cfg, servedResources(t, cfg))
	t.Logf("%s: %d objects of %d resources created (stubs of %s), %d objects served in all", from, len(res.Objects), len(created), res.Version, len(before))
	c.stop()

	// 2. The tool, given the new setting, migrates with the key rotation.
	toolArgs := func(cmd string, encryption string, more ...string) []string {
		args := []string{cmd, "--endpoints", c.etcd.Endpoint, "--encryption-provider-config", encryption}
		args = append(args, to.toolFlags(t)...)
		return append(args, more...)
	}
	out, stderr, code := runTool(t, toolArgs("verify", rotation, "-o", "json")...)
	var rep verify.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify -o json: exit %d: %v\n%s", code, err, stderr)
	}
	if code != verify.ExitStale {
		for _, r := range rep.Resources {
			for _, k := range r.UnreadableKeys {
				t.Errorf("verify before migrate: %s unreadable: %s: %s", k.Key, k.Reason, k.Detail)
			}
		}
		t.Fatalf("verify before migrate: exit %d, want %d (stale)\n%s", code, verify.ExitStale, stderr)
	}
	wantCR := "json"
	if to.cbor {
		wantCR = "cbor"
	}
	for _, r := range rep.Resources {
		if r.Stale != r.Objects {
			t.Errorf("verify before migrate: %s has %d of %d objects stale; every object is under key1 or in another media type", r.Name(), r.Stale, r.Objects)
		}
		if strings.HasSuffix(r.Group, ".com") && r.TargetMediaType != wantCR {
			t.Errorf("verify: custom resources %s: target media type %q, want %q", r.Name(), r.TargetMediaType, wantCR)
		}
	}
	out, stderr, code = runTool(t, toolArgs("migrate", rotation, "--allow-live-apiserver", "--journal", filepath.Join(c.dir, "journal"))...)
	if code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("migrate:\n%s", out)
	// With every alpha gate, 1.35 and 1.34 turn EventedPLEG on, which 1.37's
	// code cannot have on there (it needs PLEGOnDemandRelist, new in 1.36):
	// the tool says it leaves it off (apiserverconfig.LinkedOff).
	note := "note: --feature-gates: EventedPLEG on in kube-apiserver " + to.target(t)
	if want := to.binary != "" && to.alpha && (to.target(t) == "1.35" || to.target(t) == "1.34"); strings.Contains(stderr, note) != want {
		t.Errorf("migrate's stderr has %q: %v, want %v\n%s", note, !want, want, stderr)
	}
	if out, stderr, code := runTool(t, toolArgs("verify", newKeys)...); code != verify.ExitCurrent {
		t.Fatalf("verify after migrate with key2 only: exit %d\n%s%s", code, out, stderr)
	}

	// 3. The new setting, key2 only: same content, and no no-op update writes.
	cfg = c.startSetting(to, newKeys)
	sameContentEvery(t, cfg, before, owned, from.target(t) != to.target(t), since)
	checked := noOpUpdateEvery(t, cfg, owned)
	var unchecked []string
	for gr := range created {
		if gr == leaseCandidates && checked[gr] == 0 && noneLeft(t, cfg, gr) {
			t.Logf("no LeaseCandidate left to update: kube-apiserver's garbage collector deleted the expired ones")
			continue
		}
		if checked[gr] == 0 && servesResource(t, cfg, gr) {
			unchecked = append(unchecked, gr.String())
		}
	}
	sort.Strings(unchecked)
	if len(unchecked) > 0 {
		t.Errorf("no object of %v went through a no-op update under %s", unchecked, to)
	}
	if got := checked[schema.GroupResource{Group: gadgetsGroup, Resource: "gadgets"}]; got != len(gadgets) {
		t.Errorf("gadgets checked %d, want %d", got, len(gadgets))
	}
	n := 0
	for _, v := range checked {
		n += v
	}
	t.Logf("%s -> %s: %d objects of %d resources unchanged by a no-op update", from, to, n, len(checked))
}

var (
	storageVersion = schema.GroupResource{Group: "internal.apiserver.k8s.io", Resource: "storageversions"}
	apiServices    = schema.GroupResource{Group: "apiregistration.k8s.io", Resource: "apiservices"}
	crdsGR         = schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}
	// LeaseCandidates are deleted by kube-apiserver itself once expired
	// (its coordinated leader election's garbage collector): a test's stub
	// may be gone before, or after, the snapshot.
	leaseCandidates = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leasecandidates"}
)

// noneLeft reports whether the server behind cfg holds no object of gr (in
// any served version).
func noneLeft(t *testing.T, cfg *rest.Config, gr schema.GroupResource) bool {
	t.Helper()
	for _, gvr := range servedResources(t, cfg) {
		if gvr.GroupResource() != gr {
			continue
		}
		list, err := dynamic.NewForConfigOrDie(cfg).Resource(gvr).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", gvr, err)
		}
		return len(list.Items) == 0
	}
	return true
}

// apiserverOwned are objects the running kube-apiserver itself keeps
// rewriting: its identity leases (kube-system, renewed every 10 s) and the
// StorageVersions it records for its own storage versions at start-up (all
// but the one the test created).
type apiserverOwned map[string]bool // the names of the StorageVersions the test created

func (created apiserverOwned) has(gr schema.GroupResource, namespace, name string) bool {
	return (gr == storageVersion && !created[name]) || (gr == schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"} && namespace == "kube-system")
}

// noOpUpdateEvery GETs then PUTs back unchanged every object of every
// updatable resource the server behind cfg serves (its preferred versions,
// through discovery) and asserts kube-apiserver did not write it. It
// returns how many objects it checked per resource. Left out: the objects
// the server itself keeps rewriting (apiserverOwned). An Event is updated
// through the group its managers wrote through (updateGroup): kube-apiserver's
// field manager differs per group (a no-op update through events.k8s.io
// drops the managedFields entries written through the core group, and the
// other way round), and the tool judges each Event by its managers' group.
func noOpUpdateEvery(t *testing.T, cfg *rest.Config, owned apiserverOwned) map[schema.GroupResource]int {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	versions := servedVersions(t, cfg)
	owners := storageGroups(t)
	n := map[schema.GroupResource]int{}
	for _, gvr := range servedResources(t, cfg) {
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", gvr, err)
		}
		for _, item := range list.Items {
			if owned.has(gvr.GroupResource(), item.GetNamespace(), item.GetName()) {
				continue
			}
			if owners.updateGroup(gvr.GroupResource(), item.GetManagedFields()) != gvr.Group {
				continue // updated through the other resource
			}
			k := objKey{GVR: gvr, Namespace: item.GetNamespace(), Name: item.GetName()}
			// Through the preferred version, else through another served
			// one: a version may not carry every field of an older one (a
			// PodCertificateRequest's spec.pkixPublicKey of v1beta1 is not in
			// v1), and kube-apiserver refuses the PUT of an immutable field
			// it reads as changed, whatever is stored.
			var got, upd *unstructured.Unstructured
			var err error
			for _, v := range append([]schema.GroupVersionResource{gvr}, versions[gvr.GroupResource()]...) {
				ri := dyn.Resource(v).Namespace(k.Namespace)
				if got, err = ri.Get(ctx, k.Name, metav1.GetOptions{}); err != nil {
					break
				}
				if upd, err = ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"}); !apierrors.IsInvalid(err) {
					break
				}
				t.Logf("%s: a no-op update through %s is refused (%v); trying another version", k, v.GroupVersion(), err)
			}
			if err != nil {
				t.Errorf("%s: no-op update: %v", k, err)
				continue
			}
			n[gvr.GroupResource()]++
			if upd.GetResourceVersion() != got.GetResourceVersion() {
				t.Errorf("%s: a no-op update was written (resourceVersion %s -> %s): kube-apiserver found it stale or re-encoded it differently\n%s",
					k, got.GetResourceVersion(), upd.GetResourceVersion(), cmp.Diff(got.Object, upd.Object))
			}
		}
	}
	return n
}

// servedVersions lists, through discovery, every served version of each
// updatable resource.
func servedVersions(t *testing.T, cfg *rest.Config) map[schema.GroupResource][]schema.GroupVersionResource {
	t.Helper()
	_, lists, err := discovery.NewDiscoveryClientForConfigOrDie(cfg).ServerGroupsAndResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	out := map[schema.GroupResource][]schema.GroupVersionResource{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") && slices.Contains(r.Verbs, "update") {
				gvr := gv.WithResource(r.Name)
				out[gvr.GroupResource()] = append(out[gvr.GroupResource()], gvr)
			}
		}
	}
	return out
}

// servesResource reports whether the server behind cfg serves gr in some version.
func servesResource(t *testing.T, cfg *rest.Config, gr schema.GroupResource) bool {
	t.Helper()
	for _, gvr := range servedResources(t, cfg) {
		if gvr.GroupResource() == gr {
			return true
		}
	}
	return false
}

// sameContentEvery is sameContent for every object the old server served,
// read through the same API version when the new server still serves it:
// the same content, and the managedFields kube-apiserver's field manager
// leaves (entries of the versions it keeps; for Events, those of the group
// its managers wrote through, whose field manager the tool runs, see
// noOpUpdateEvery). Besides
// the objects the server itself rewrites (apiserverOwned), what legitimately
// differs: a CRD's status.storedVersions, which the tool trims to the storage
// version once every object is in it (checked here), and the APIServices of
// group versions the new release no longer serves, which kube-apiserver
// deletes itself.
//
// An object whose managedFields show a write at since or later (since is
// when before was taken, to the second: the tool keeps managedFields as
// they are) was written since by kube-apiserver itself, the old one or the
// new one at its start (its API Priority and Fairness controller's status
// of a FlowSchema, an Event it records again): its content is not compared
// (logged); its no-op update is checked all the same.
func sameContentEvery(t *testing.T, cfg *rest.Config, before map[objKey]*unstructured.Unstructured, owned apiserverOwned, newRelease bool, since time.Time) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	served := map[schema.GroupVersionResource]bool{}
	for _, gvr := range servedResources(t, cfg) {
		served[gvr] = true
	}
	kept := keptGroupVersions(t, cfg)
	owners := storageGroups(t)
	skipped, rewritten := map[string]bool{}, map[string]bool{}
	for k, want := range before {
		gr := k.GVR.GroupResource()
		switch {
		case owned.has(gr, k.Namespace, k.Name):
			continue
		case !served[k.GVR]:
			skipped[k.GVR.String()] = true
			continue
		case gr == apiServices && !kept[apiServiceGroupVersion(k.Name)]:
			continue
		}
		got, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if gr == leaseCandidates && apierrors.IsNotFound(err) {
			t.Logf("%s: deleted since the snapshot (kube-apiserver's garbage collector deletes an expired LeaseCandidate)", k)
			continue
		}
		if err != nil {
			t.Errorf("%s: served before the migration, now: %v", k, err)
			continue
		}
		if m := writtenSince(got, since); m != "" {
			rewritten[k.String()+" by "+m] = true
			continue
		}
		wantContent, gotContent := content(want), content(got)
		if gr == crdsGR {
			storage := ""
			for _, v := range got.Object["spec"].(map[string]any)["versions"].([]any) {
				if v.(map[string]any)["storage"] == true {
					storage = v.(map[string]any)["name"].(string)
				}
			}
			stored, _, _ := unstructured.NestedStringSlice(got.Object, "status", "storedVersions")
			if len(stored) != 1 || stored[0] != storage {
				t.Errorf("%s: status.storedVersions %v after the migration, want [%s]", k, stored, storage)
			}
			unstructured.RemoveNestedField(wantContent, "status", "storedVersions")
			unstructured.RemoveNestedField(gotContent, "status", "storedVersions")
		}
		w, g := dropEmpty(wantContent), dropEmpty(gotContent)
		if newRelease {
			// The newer release may default on read a field the older one
			// did not know (a CSIDriver's spec.preventPodSchedulingIfMissing
			// in 1.35): it shows with or without the migration. Nothing
			// may be lost or changed.
			if lost := lostOrChanged("", w, g); len(lost) > 0 {
				t.Errorf("%s: %v lost or changed by the migration (-before +after):\n%s", k, lost, cmp.Diff(w, g))
			}
		} else if d := cmp.Diff(w, g); d != "" {
			t.Errorf("%s: content changed by the migration (-before +after):\n%s", k, d)
		}
		left := ownGroupEntries(managedFieldsLeft(want, kept), owners.updateGroup(gr, want.GetManagedFields()))
		if d := cmp.Diff(left, got.GetManagedFields(), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: managedFields are not what kube-apiserver's field manager leaves (-want +got):\n%s", k, d)
		}
	}
	if len(skipped) > 0 {
		t.Logf("content not compared (no longer a served preferred version; the no-op updates read them through another): %v", sortedNames(skipped))
	}
	if len(rewritten) > 0 {
		t.Logf("content not compared (written by kube-apiserver itself since the snapshot): %v", sortedNames(rewritten))
	}
}

// writtenSince names the field manager of a managedFields entry of u
// written at t or later, "" when there is none.
func writtenSince(u *unstructured.Unstructured, t time.Time) string {
	for _, e := range u.GetManagedFields() {
		if e.Time != nil && !e.Time.Time.Before(t) {
			return e.Manager
		}
	}
	return ""
}

// lostOrChanged lists the paths of before that after lacks or holds a
// different value at; fields only after has are not listed.
func lostOrChanged(path string, before, after any) []string {
	switch b := before.(type) {
	case map[string]any:
		a, ok := after.(map[string]any)
		if !ok {
			return []string{path}
		}
		var out []string
		for k, v := range b {
			av, ok := a[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, lostOrChanged(path+"."+k, v, av)...)
		}
		return out
	case []any:
		a, ok := after.([]any)
		if !ok || len(a) != len(b) {
			return []string{path}
		}
		var out []string
		for i := range b {
			out = append(out, lostOrChanged(fmt.Sprintf("%s[%d]", path, i), b[i], a[i])...)
		}
		return out
	}
	if !cmp.Equal(before, after) {
		return []string{path}
	}
	return nil
}

// dropEmpty removes null, empty lists and empty objects from a JSON value:
// protobuf does not tell an empty list from an absent one, so an object
// stored as JSON with "endpoints": [] is served with "endpoints": null once
// stored as protobuf, by kube-apiserver's own rewrite as by the tool's.
func dropEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			e = dropEmpty(e)
			switch y := e.(type) {
			case nil:
				continue
			case []any:
				if len(y) == 0 {
					continue
				}
			case map[string]any:
				if len(y) == 0 {
					continue
				}
			}
			out[k] = e
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = dropEmpty(e)
		}
		return out
	}
	return v
}

// apiServiceGroupVersion is the group/version an APIService named
// "v1beta1.storage.k8s.io" (or "v1." for the core group) registers.
func apiServiceGroupVersion(name string) string {
	version, group, _ := strings.Cut(name, ".")
	if group == "" {
		return version
	}
	return group + "/" + version
}

func sortedNames(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

const (
	gadgetsGroup = "gadgets.e2e.example.com"
	gadgetsCRD   = "gadgets." + gadgetsGroup
)

// createGadgets creates a second CRD of several versions (v1alpha1, v1beta1,
// v1, all served, stored in v1beta1, conversion None, a structural schema
// with a default) and one object through each version, and returns them.
func createGadgets(t *testing.T, cfg *rest.Config, ns string) []string {
	t.Helper()
	ctx := context.Background()
	schemaProps := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"size":   {Type: "integer", Default: &apiextensionsv1.JSON{Raw: []byte("3")}},
				"ratio":  {Type: "number"},
				"color":  {Type: "string"},
				"labels": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
				"free":   {Type: "object", XPreserveUnknownFields: ptr.To(true)},
			}},
			"status": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"ready": {Type: "boolean"}}},
		},
	}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: gadgetsCRD},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gadgetsGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
		},
	}
	versions := []string{"v1alpha1", "v1beta1", "v1"}
	for _, v := range versions {
		crd.Spec.Versions = append(crd.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{
			Name: v, Served: true, Storage: v == "v1beta1", Schema: schemaProps,
			Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
		})
	}
	ext := apiextensionsclient.NewForConfigOrDie(cfg)
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD %s: %v", gadgetsCRD, err)
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	var names []string
	for i, v := range versions {
		gvr := schema.GroupVersionResource{Group: gadgetsGroup, Version: v, Resource: "gadgets"}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": gadgetsGroup + "/" + v, "kind": "Gadget",
			"metadata": map[string]any{"name": "gadget-" + v, "namespace": ns, "annotations": map[string]any{"note": "ünïcode & <html>"}},
			"spec": map[string]any{
				"ratio": 0.5 + float64(i), "color": "blue", "labels": map[string]any{"a": "b"},
				"free": map[string]any{"nested": []any{int64(1), "two", 3.25, true, nil}, "big": int64(1) << 53},
			},
		}}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{FieldManager: "gadget-maker"})
			return err == nil, nil // until the CRD's version is served
		})
		if err != nil {
			t.Fatalf("create gadget through %s: %v", gvr, err)
		}
		status := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": gadgetsGroup + "/" + v, "kind": "Gadget",
			"metadata": map[string]any{"name": "gadget-" + v, "namespace": ns},
			"status":   map[string]any{"ready": true},
		}}
		if _, err := dyn.Resource(gvr).Namespace(ns).ApplyStatus(ctx, "gadget-"+v, status, metav1.ApplyOptions{FieldManager: "gadget-status", Force: true}); err != nil {
			t.Fatalf("apply status of gadget-%s: %v", v, err)
		}
		names = append(names, "gadget-"+v)
	}
	return names
}

// moveCRDStorageVersion makes version the storage version of CRD name,
// through the API (status.storedVersions keeps the old one).
func moveCRDStorageVersion(t *testing.T, cfg *rest.Config, name, version string) {
	t.Helper()
	ctx := context.Background()
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	crd, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CRD %s: %v", name, err)
	}
	for i := range crd.Spec.Versions {
		crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == version
	}
	if _, err := crds.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("move the storage version of CRD %s to %s: %v", name, version, err)
	}
	// The CRD handler serves the new storage version once its informer has
	// the update: wait until storedVersions lists it.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, v := range got.Status.StoredVersions {
			if v == version {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s: storedVersions never listed %s: %v", name, version, err)
	}
}
