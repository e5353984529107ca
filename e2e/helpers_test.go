package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// cluster is one etcd shared by the successive kube-apiservers of a scenario,
// and the tool run against it while no kube-apiserver is up.
type cluster struct {
	t    *testing.T
	etcd *testetcd.Server
	cli  *clientv3.Client
	dir  string
	srv  *apiservertest.Server
	// proc is a real kube-apiserver process (startSetting), on procPort.
	proc     *apiserverproc.Server
	procPort int
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	etcd := testetcd.StartT(t, testetcd.Options{})
	return &cluster{t: t, etcd: etcd, cli: etcd.ClientT(t), dir: t.TempDir()}
}

// start starts a kube-apiserver on the cluster's etcd (stopping the previous one).
func (c *cluster) start(opts apiservertest.Options) *rest.Config {
	c.t.Helper()
	c.stop()
	opts.EtcdURL = c.etcd.URL
	c.srv = apiservertest.Start(c.t, opts)
	return c.srv.ClientConfig
}

func (c *cluster) stop() {
	if c.srv != nil {
		c.srv.Stop()
		c.srv = nil
	}
	if c.proc != nil {
		c.proc.Stop()
		c.proc = nil
	}
}

// env prepares the tool's pipeline against the cluster's etcd; the caller closes it.
func (c *cluster) env(cfg pipeline.Config) *pipeline.Env {
	c.t.Helper()
	env, err := pipeline.Setup(context.Background(), c.cli, cfg)
	if err != nil {
		c.t.Fatalf("pipeline.Setup(%+v): %v", cfg, err)
	}
	return env
}

// verify runs the read-only audit and returns its report.
func (c *cluster) verify(cfg pipeline.Config) *verify.Report {
	c.t.Helper()
	env := c.env(cfg)
	defer env.Close()
	rep, err := verify.Run(context.Background(), env, verify.Options{ShowKeys: 20})
	if err != nil {
		c.t.Fatalf("verify: %v", err)
	}
	for _, r := range rep.Resources {
		if r.Stale > 0 || r.Unreadable > 0 {
			c.t.Logf("verify: %s stale %d %v unreadable %d %v", r.Name(), r.Stale, r.StaleBy, r.Unreadable, r.UnreadableBy)
			for _, k := range append(r.StaleKeys, r.UnreadableKeys...) {
				c.t.Logf("verify:   %s from %+v to %+v %v %s %s", k.Key, k.From, k.To, k.Reasons, k.Reason, k.Detail)
			}
		}
	}
	return rep
}

// migrate runs a migration after the kube-apiserver was stopped. Its identity
// lease was renewed moments ago, so the live-apiserver check is waived: the
// test stopped the only kube-apiserver itself.
func (c *cluster) migrate(cfg pipeline.Config) *migrate.Summary {
	c.t.Helper()
	if c.srv != nil {
		c.t.Fatalf("test bug: migrate while the kube-apiserver is running")
	}
	env := c.env(cfg)
	defer env.Close()
	sum, err := migrate.Run(context.Background(), env, migrate.Options{
		PreflightOptions: guard.PreflightOptions{
			QuotaBackendBytes:  guard.DefaultQuotaBackendBytes,
			AllowLiveAPIServer: true,
			Journal:            filepath.Join(c.dir, fmt.Sprintf("journal-%d", time.Now().UnixNano())),
		},
	})
	if err != nil {
		c.t.Fatalf("migrate: %v (summary %+v, failures %+v)", err, sum.Summary, sum.Failures)
	}
	if sum.Summary.Failed != 0 || sum.Summary.Unreadable != 0 || sum.Summary.Conflicts != 0 {
		c.t.Fatalf("migrate: summary %+v, failures %+v", sum.Summary, sum.Failures)
	}
	return sum
}

// staleResources lists the resources verify found stale, and fails the test on
// anything unreadable.
func staleResources(t *testing.T, rep *verify.Report) []string {
	t.Helper()
	var out []string
	for _, r := range rep.Resources {
		if r.Unreadable > 0 {
			t.Errorf("verify: %s has %d unreadable objects: %+v", r.Name(), r.Unreadable, r.UnreadableKeys)
		}
		if r.Stale > 0 {
			out = append(out, r.Name())
		}
	}
	sort.Strings(out)
	return out
}

// reencodeResources names the resources with objects current in version
// and key whose re-encoding would still change their bytes.
func reencodeResources(rep *verify.Report) []string {
	var out []string
	for _, r := range rep.Resources {
		if r.Reencode > 0 {
			out = append(out, r.Name())
		}
	}
	sort.Strings(out)
	return out
}

// expectCurrent asserts verify finds everything current (exit 0) and
// nothing left whose re-encoding would change its bytes.
func (c *cluster) expectCurrent(cfg pipeline.Config) {
	c.t.Helper()
	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != verify.ExitCurrent {
		c.t.Fatalf("verify exit %d after migrate, want 0: stale %v, summary %+v", code, staleResources(c.t, rep), rep.Summary)
	}
	if got := reencodeResources(rep); len(got) > 0 {
		c.t.Errorf("verify after migrate: %v still have objects a re-encode would change (summary %+v)", got, rep.Summary)
	}
}

// writeEncryptionConfig writes an EncryptionConfiguration for the given
// resources with the given providers (YAML list items) and returns its path.
func (c *cluster) writeEncryptionConfig(name string, resources []string, providers ...string) string {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [%s]\n  providers:\n", strings.Join(resources, ", "))
	for _, p := range providers {
		b.WriteString(p)
	}
	path := filepath.Join(c.dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

func aescbcProvider(name string, key byte) string {
	return fmt.Sprintf("  - aescbc:\n      keys:\n      - name: %s\n        secret: %s\n", name, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{key}, 32)))
}

func kmsV2Provider(name, endpoint string) string {
	return fmt.Sprintf("  - kms:\n      apiVersion: v2\n      name: %s\n      endpoint: %s\n      timeout: 10s\n", name, endpoint)
}

const identityProvider = "  - identity: {}\n"

// objKey names one object as the API serves it.
type objKey struct {
	GVR       schema.GroupVersionResource
	Namespace string
	Name      string
}

func (k objKey) String() string {
	gr := k.GVR.GroupResource().String()
	if k.Namespace == "" {
		return gr + " " + k.Name
	}
	return gr + " " + k.Namespace + "/" + k.Name
}

// volatile are resources the running kube-apiserver itself keeps rewriting
// (its identity lease is renewed every 10 s): their content and
// resourceVersion change on their own, whatever etcd held before.
var volatile = map[schema.GroupResource]bool{
	{Group: "coordination.k8s.io", Resource: "leases"}: true,
}

// servedResources lists, through discovery, every resource in its preferred
// version that can be listed, read and updated.
func servedResources(t *testing.T, cfg *rest.Config) []schema.GroupVersionResource {
	t.Helper()
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	lists, err := dc.ServerPreferredResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	var out []schema.GroupVersionResource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			verbs := strings.Join(r.Verbs, ",") + ","
			if !strings.Contains(verbs, "list,") || !strings.Contains(verbs, "get,") || !strings.Contains(verbs, "update,") {
				continue
			}
			out = append(out, gv.WithResource(r.Name))
		}
	}
	return out
}

// snapshot reads every object of every listable resource (in the preferred
// version), except the volatile ones.
func snapshot(t *testing.T, cfg *rest.Config, gvrs []schema.GroupVersionResource) map[objKey]*unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	out := map[objKey]*unstructured.Unstructured{}
	for _, gvr := range gvrs {
		if volatile[gvr.GroupResource()] {
			continue
		}
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", gvr, err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			out[objKey{GVR: gvr, Namespace: u.GetNamespace(), Name: u.GetName()}] = u
		}
	}
	return out
}

// content is an object without its resourceVersion (a direct etcd write moves
// it; nothing else may change) and its managedFields (compared on their own).
func content(u *unstructured.Unstructured) map[string]any {
	c := u.DeepCopy()
	c.SetResourceVersion("")
	c.SetManagedFields(nil)
	return c.Object
}

// sameContent asserts every object of before is served with the same content
// by the server behind cfg, and with the managedFields kube-apiserver's field
// manager would leave of them on its next write: every entry of a version it
// serves, unchanged, and none of a version it does not.
func sameContent(t *testing.T, cfg *rest.Config, before map[objKey]*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	served := keptGroupVersions(t, cfg)
	owners := storageGroups(t)
	for k, want := range before {
		got, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: served before the migration, now: %v", k, err)
			continue
		}
		if d := cmp.Diff(content(want), content(got)); d != "" {
			t.Errorf("%s: content changed by the migration (-before +after):\n%s", k, d)
		}
		if d := cmp.Diff(ownGroupEntries(managedFieldsLeft(want, served), owners.updateGroup(k.GVR.GroupResource(), want.GetManagedFields())), got.GetManagedFields(), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: managedFields are not what kube-apiserver's field manager leaves (-want +got):\n%s", k, d)
		}
	}
}

// noOpUpdates GETs then PUTs back unchanged every object of every served
// resource (except the volatile ones; an object served by two resources,
// an Event, through the one of the group its managers wrote through: see
// updateGroup) and asserts the kube-apiserver did not
// write it: the resourceVersion stays. kube-apiserver skips the write exactly
// when the stored value is not stale and re-encoding gives the same bytes, so
// this is the apiserver's own verdict that the object is current. It returns
// how many objects it checked.
func noOpUpdates(t *testing.T, cfg *rest.Config) int {
	t.Helper()
	n := 0
	for _, c := range noOpUpdatesByResource(t, cfg) {
		n += c
	}
	return n
}

// noOpUpdatesByResource is noOpUpdates, counting the objects it checked per
// resource.
func noOpUpdatesByResource(t *testing.T, cfg *rest.Config) map[schema.GroupResource]int {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	n := map[schema.GroupResource]int{}
	owners := storageGroups(t)
	for _, gvr := range servedResources(t, cfg) {
		if volatile[gvr.GroupResource()] {
			continue
		}
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", gvr, err)
		}
		for _, item := range list.Items {
			if owners.updateGroup(gvr.GroupResource(), item.GetManagedFields()) != gvr.Group {
				continue // updated through the other resource
			}
			k := objKey{GVR: gvr, Namespace: item.GetNamespace(), Name: item.GetName()}
			ri := dyn.Resource(gvr).Namespace(k.Namespace)
			got, err := ri.Get(ctx, k.Name, metav1.GetOptions{})
			if err != nil {
				t.Errorf("%s: get: %v", k, err)
				continue
			}
			// A field manager of its own: the objects' creator may have
			// written through another API version, and an Update by the
			// same manager at a new version rewrites managedFields.
			upd, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
			if err != nil {
				var st apierrors.APIStatus
				if errors.As(err, &st) {
					t.Errorf("%s: no-op update refused: %v (%+v)", k, err, st.Status().Details)
				} else {
					t.Errorf("%s: no-op update: %v", k, err)
				}
				continue
			}
			n[gvr.GroupResource()]++
			if upd.GetResourceVersion() != got.GetResourceVersion() {
				t.Errorf("%s: a no-op update was written (resourceVersion %s -> %s): the kube-apiserver found it stale or re-encoded it differently\n%s",
					k, got.GetResourceVersion(), upd.GetResourceVersion(), cmp.Diff(got.Object, upd.Object))
			}
		}
	}
	return n
}

// storageOwners knows the group whose version each built-in resource is
// stored in: its own, except for a resource that shares the storage of
// another group's (events.events.k8s.io, stored as core v1 Events).
type storageOwners struct{ sc *decode.StorageConfig }

func storageGroups(t *testing.T) storageOwners {
	t.Helper()
	sc, err := decode.NewStorageConfig("")
	if err != nil {
		t.Fatal(err)
	}
	return storageOwners{sc}
}

// group is the group gr is stored in (gr's own for custom resources).
func (o storageOwners) group(gr schema.GroupResource) string {
	rc, err := o.sc.Codec(gr)
	if err != nil {
		return gr.Group
	}
	return rc.StorageVersion.Group
}

// updateGroup is the API group whose resource a no-op update of an object
// of gr goes through, as the tool judges it: for an object served by two
// resources of different groups (an Event, as events and as
// events.events.k8s.io), whose field managers each drop the other group's
// managedFields entries on every write, the group its entries name when
// they name one of the two (kube-scheduler's Events: events.k8s.io);
// else, and for every other object, the group gr is stored in. (The tool's
// rule for entries naming both groups, updatepath.Path.Apply, is not
// needed here: no test writes such an Event.)
func (o storageOwners) updateGroup(gr schema.GroupResource, entries []metav1.ManagedFieldsEntry) string {
	storing := o.group(gr)
	named := map[string]bool{}
	for _, e := range entries {
		if gv, err := schema.ParseGroupVersion(e.APIVersion); err == nil {
			named[gv.Group] = true
		}
	}
	if len(named) == 1 {
		for g := range named {
			if o.group(schema.GroupResource{Group: g, Resource: gr.Resource}) == storing {
				return g
			}
		}
	}
	return storing
}

// ownGroupEntries keeps the managedFields entries of group: those a no-op
// update through group's resource keeps (see updateGroup).
func ownGroupEntries(entries []metav1.ManagedFieldsEntry, group string) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range entries {
		if gv, err := schema.ParseGroupVersion(e.APIVersion); err == nil && gv.Group == group {
			out = append(out, e)
		}
	}
	return out
}

// etcdValue reads one raw value.
func etcdValue(t *testing.T, cli *clientv3.Client, key string) ([]byte, int64, int64) {
	t.Helper()
	kv := etcdGet(t, cli, key).Kvs[0]
	return kv.Value, kv.ModRevision, kv.Lease
}
