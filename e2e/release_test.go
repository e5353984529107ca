package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	componentversion "k8s.io/component-base/version"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/verify"
)

// The older Kubernetes releases' real kube-apiservers, each built from its own
// module (internal/build/modbuild caches them per machine), once per test binary.
var older struct {
	mu   sync.Mutex
	bins map[string]*olderBinary
}

type olderBinary struct {
	once sync.Once
	bin  string
	err  error
}

// olderAPIServer is the kube-apiserver binary of release (e.g. "v1.35.4").
func olderAPIServer(t *testing.T, release string) string {
	t.Helper()
	older.mu.Lock()
	if older.bins == nil {
		older.bins = map[string]*olderBinary{}
	}
	b := older.bins[release]
	if b == nil {
		b = &olderBinary{}
		older.bins[release] = b
	}
	older.mu.Unlock()
	b.once.Do(func() {
		ctx := context.Background()
		spec, err := modbuild.KubeAPIServer(ctx, release)
		if err != nil {
			b.err = err
			return
		}
		b.bin, b.err = modbuild.Build(ctx, spec)
	})
	if b.err != nil {
		t.Fatalf("kube-apiserver %s: %v", release, b.err)
	}
	return b.bin
}

// releaseMinor is a release ("v1.36.3") as --target-version takes it ("1.36").
func releaseMinor(t *testing.T, release string) string {
	t.Helper()
	var major, minor, patch int
	if _, err := fmt.Sscanf(release, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("release %q: %v", release, err)
	}
	return fmt.Sprintf("%d.%d", major, minor)
}

// previousMinor is modbuild.PreviousKubernetes as --target-version takes it, e.g. "1.36".
func previousMinor(t *testing.T) string {
	t.Helper()
	return releaseMinor(t, modbuild.PreviousKubernetes)
}

// allResources is the encryption configuration's resource list: every
// resource, built-in or custom, is encrypted.
var allResources = []string{"'*.*'"}

// betaAPIs is the --runtime-config of every kube-apiserver of these tests,
// and of the tool, which must know the API versions the cluster serves.
const betaAPIs = "api/beta=true"

// writeEveryResource starts release's real kube-apiserver with the
// encryption configuration enc and beta APIs on, lets it write its bootstrap
// objects and one object of every resource it persists, in every version it
// serves (internal/testrig/everyresource), and returns it running, with what it wrote.
func writeEveryResource(t *testing.T, c *cluster, release, enc string) (*apiserverproc.Server, *everyresource.Result) {
	t.Helper()
	old := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, release),
		EtcdURL:              c.etcd.URL,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: enc,
	})
	res, err := everyresource.Create(context.Background(), old.ClientConfig, everyresource.Options{})
	if err != nil {
		t.Fatalf("kube-apiserver %s: create one object of every resource: %v", release, err)
	}
	if len(res.Missing) > 0 {
		t.Errorf("kube-apiserver %s persists resources Kubernetes' storage data at %s has no stub for, so nothing of them was tested: %v", release, res.Version, res.Missing)
	}
	if want := releaseMinor(t, release); res.Version != want {
		t.Fatalf("kube-apiserver %s says it is %s, want %s", release, res.Version, want)
	}
	applied, status := 0, 0
	for _, o := range res.Objects {
		if o.Applied {
			applied++
		}
		if o.Status {
			status++
		}
	}
	t.Logf("kube-apiserver %s wrote one object of each of the %d resource versions it serves and persists (%d also by server-side apply, %d with an applied status)",
		release, len(res.Objects), applied, status)
	return old, res
}

// unservedResources lists the resource versions objects were written
// through that the server behind cfg does not serve.
func unservedResources(t *testing.T, cfg *rest.Config, res *everyresource.Result) []string {
	t.Helper()
	_, lists, err := discovery.NewDiscoveryClientForConfigOrDie(cfg).ServerGroupsAndResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	served := map[string]bool{}
	for _, l := range lists {
		for _, r := range l.APIResources {
			served[l.GroupVersion+"/"+r.Name] = true
		}
	}
	var out []string
	for _, o := range res.Objects {
		if name := o.GVR.GroupVersion().String() + "/" + o.GVR.Resource; !served[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// notEncryptedWith lists the keys under /registry/ whose value is not
// encrypted with the aescbc key name.
func notEncryptedWith(t *testing.T, c *cluster, name string) []string {
	t.Helper()
	resp, err := c.cli.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("k8s:enc:aescbc:v1:" + name + ":")
	var other []string
	for _, kv := range resp.Kvs {
		if !bytes.HasPrefix(kv.Value, prefix) {
			other = append(other, string(kv.Key))
		}
	}
	return other
}

// verifyJSON runs the tool's verify -o json and returns its report and exit code.
func verifyJSON(t *testing.T, args []string) (*verify.Report, int) {
	t.Helper()
	out, stderr, code := runTool(t, append([]string{"verify", "-o", "json"}, args...)...)
	var rep verify.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify -o json: exit %d, %v\n%s\n%s", code, err, out, stderr)
	}
	for _, r := range rep.Resources {
		for _, k := range r.UnreadableKeys {
			t.Logf("verify: unreadable %s: %s %s", k.Key, k.Reason, k.Detail)
		}
	}
	return &rep, code
}

// staleBy lists the resources verify found stale for reason.
func staleBy(rep *verify.Report, reason reencode.Reason) []string {
	var out []string
	for _, r := range rep.Resources {
		if r.StaleBy[reason] > 0 {
			out = append(out, r.Name())
		}
	}
	sort.Strings(out)
	return out
}

// noOpCoversEveryObject asserts the no-op update counted, per resource, at
// least the objects served before the migration.
func noOpCoversEveryObject(t *testing.T, byResource map[schema.GroupResource]int, before map[objKey]struct{}) {
	t.Helper()
	// An object served by two resources (an Event) is listed by both and
	// updated through one of them (updateGroup): counted by the resource it
	// is stored under.
	want, got := map[schema.GroupResource]int{}, map[schema.GroupResource]int{}
	owners := storageGroups(t)
	storedAs := func(gr schema.GroupResource) schema.GroupResource {
		return schema.GroupResource{Group: owners.group(gr), Resource: gr.Resource}
	}
	for k := range before {
		if gr := k.GVR.GroupResource(); owners.group(gr) == gr.Group && !volatile[gr] {
			want[gr]++
		}
	}
	for gr, n := range byResource {
		got[storedAs(gr)] += n
	}
	for gr, n := range want {
		if got[gr] < n {
			t.Errorf("the no-op update covered %d %s, %d were served before the migration", got[gr], gr, n)
		}
	}
}

func keysOf[V any](m map[objKey]V) map[objKey]struct{} {
	out := make(map[objKey]struct{}, len(m))
	for k := range m {
		out[k] = struct{}{}
	}
	return out
}

// TestUpgradeFromPreviousRelease: the previous release's real kube-apiserver
// (built from its own module, beta APIs on, every resource encrypted with
// aescbc key1) writes its bootstrap objects and one object of every resource
// it persists, in every version it serves, some of them versions this
// release no longer serves, some in a storage version this release no longer
// stores. The tool, after a key rotation (key2 first), migrates for this
// release. This release's kube-apiserver with only key2 then serves every
// object with the content it served before the migration and writes nothing
// on a no-op update of any object of any resource.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	c := newCluster(t)
	enc := c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key1", 1))
	old, res := writeEveryResource(t, c, modbuild.PreviousKubernetes, enc)
	old.Stop()
	plaintext := notEncryptedWith(t, c, "key1")
	t.Logf("values kube-apiserver %s left unencrypted: %v", modbuild.PreviousKubernetes, plaintext)

	// This release's kube-apiserver reads what the previous one wrote: the
	// reference content. Reads do not rewrite; what it writes itself on
	// start (its bootstrap objects) it writes with key1, as the cluster had.
	opts := apiservertest.Options{RuntimeConfig: betaAPIs, EncryptionConfigPath: enc, PriorityAndFairness: true}
	rc := c.start(opts)
	unserved := unservedResources(t, rc, res)
	t.Logf("written through versions this release no longer serves: %v", unserved)
	for _, want := range []string{
		"networking.k8s.io/v1beta1/ipaddresses",
		"networking.k8s.io/v1beta1/servicecidrs",
		"storage.k8s.io/v1beta1/volumeattributesclasses",
	} {
		if !slices.Contains(unserved, want) {
			t.Errorf("the test's premise: an object written through %s, which this release no longer serves", want)
		}
	}
	before := snapshot(t, rc, servedResources(t, rc))
	t.Logf("%d objects served before the migration", len(before))
	c.stop()

	// Key rotation: everything is stale; what this release stores in
	// another version than the previous one is stale by storage version too.
	c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
	tool := []string{"--endpoints", c.etcd.Endpoint, "--encryption-provider-config", enc, "--runtime-config", betaAPIs, "--target-version", currentMinor}
	rep, code := verifyJSON(t, tool)
	if code != verify.ExitStale {
		t.Fatalf("verify after the key rotation: exit %d, want %d (stale)", code, verify.ExitStale)
	}
	byVersion := staleBy(rep, reencode.ReasonVersion)
	t.Logf("stale by storage version: %v; by managedFields: %v", byVersion, staleBy(rep, reencode.ReasonManagedFields))
	if !slices.Contains(byVersion, "mutatingadmissionpolicies.admissionregistration.k8s.io") {
		t.Errorf("the test's premise: MutatingAdmissionPolicies stored by %s in a version this release does not store (stale by storage version: %v)", modbuild.PreviousKubernetes, byVersion)
	}

	if _, stderr, code := runTool(t, append([]string{"migrate", "--allow-live-apiserver", "--journal", filepath.Join(c.dir, "journal")}, tool...)...); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, stderr)
	}
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent {
		t.Fatalf("verify after migrate: exit %d, want 0 (summary %+v)", code, rep.Summary)
	}
	if got := notEncryptedWith(t, c, "key2"); !slices.Equal(got, plaintext) {
		t.Errorf("after migrate, values not encrypted with key2: %v, want only what kube-apiserver leaves unencrypted: %v", got, plaintext)
	}

	// Only key2 now: this release serves everything unchanged and rewrites nothing.
	c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key2", 2))
	rc = c.start(opts)
	sameContent(t, rc, before)
	byResource := noOpUpdatesByResource(t, rc)
	noOpCoversEveryObject(t, byResource, keysOf(before))
	t.Logf("no-op update of %d objects of %d resources", total(byResource), len(byResource))
}

// TestTargetOlderReleases: the reverse, for every older release
// --target-version accepts, each proven by its own real kube-apiserver
// (modbuild.OlderKubernetes, run side by side on etcds of their own). That
// release's kube-apiserver writes its bootstrap objects and one object of
// every resource it persists (every resource encrypted with key1); after a
// key rotation the tool migrates with --target-version set to that release;
// the same real kube-apiserver with only key2 then serves every object with
// the content it served before and writes nothing on a no-op update of any
// object of any resource: the tool wrote exactly the bytes it writes.
// This release's kube-apiserver run with --emulated-version of an older one
// would not: it stores DeviceTaintRules in another version and writes
// CSINodes with a field the older releases' types do not have (see
// internal/build/releasegen).
func TestTargetOlderReleases(t *testing.T) {
	targets := map[string]bool{}
	for _, release := range modbuild.OlderKubernetes {
		targets[releaseMinor(t, release)] = true
	}
	for _, v := range release.Versions() {
		if v != release.Linked() && !targets[v] {
			t.Errorf("--target-version %s is accepted but no real kube-apiserver of it is in modbuild.OlderKubernetes: nothing proves it", v)
		}
	}
	for _, release := range modbuild.OlderKubernetes {
		t.Run(releaseMinor(t, release), func(t *testing.T) {
			t.Parallel()
			targetOlderRelease(t, release)
		})
	}
}

func targetOlderRelease(t *testing.T, release string) {
	c := newCluster(t)
	enc := c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key1", 1))
	old, _ := writeEveryResource(t, c, release, enc)
	before := snapshot(t, old.ClientConfig, servedResources(t, old.ClientConfig))
	t.Logf("%d objects served before the migration", len(before))
	old.Stop()
	plaintext := notEncryptedWith(t, c, "key1")

	c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
	target := releaseMinor(t, release)
	tool := []string{"--endpoints", c.etcd.Endpoint, "--encryption-provider-config", enc, "--runtime-config", betaAPIs, "--target-version", target}
	if _, stderr, code := runTool(t, append([]string{"migrate", "--allow-live-apiserver", "--journal", filepath.Join(c.dir, "journal")}, tool...)...); code != 0 {
		t.Fatalf("migrate --target-version %s: exit %d\n%s", target, code, stderr)
	}
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent {
		t.Fatalf("verify --target-version %s after migrate: exit %d, want 0 (summary %+v)", target, code, rep.Summary)
	}
	if got := notEncryptedWith(t, c, "key2"); !slices.Equal(got, plaintext) {
		t.Errorf("after migrate, values not encrypted with key2: %v, want only what kube-apiserver leaves unencrypted: %v", got, plaintext)
	}

	c.writeEncryptionConfig("encryption.yaml", allResources, aescbcProvider("key2", 2))
	again := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, release),
		EtcdURL:              c.etcd.URL,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: enc,
		Port:                 old.Port,
	})
	sameContent(t, again.ClientConfig, before)
	byResource := noOpUpdatesByResource(t, again.ClientConfig)
	noOpCoversEveryObject(t, byResource, keysOf(before))
	t.Logf("kube-apiserver %s: no-op update of %d objects of %d resources", release, total(byResource), len(byResource))
}

// currentMinor is the release this module links (kube-apiserver's binary
// version), as --target-version takes it.
const currentMinor = componentversion.DefaultKubeBinaryVersion
