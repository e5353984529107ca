package restore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/apis/apps"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testsnap"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/restore"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/target"
)

var (
	deploymentsGR = schema.GroupResource{Group: "apps", Resource: "deployments"}
	replicaSetsGR = schema.GroupResource{Group: "apps", Resource: "replicasets"}
	podsGR        = schema.GroupResource{Resource: "pods"}
	namespacesGR  = schema.GroupResource{Resource: "namespaces"}
	eventsGR      = schema.GroupResource{Resource: "events"}
)

// backup is a cluster whose namespace "app" was written under key1, saved
// with etcd's own snapshot code, then deleted; the key was rotated to key2
// and key1 retired.
type backup struct {
	c        *testcluster.Cluster
	old, now string // key1's configuration (the backup's), key2's (today's)
	file     string
	good     []byte
	s2       string // a Secret written again since the backup
}

func ownedBy(kind, name string) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes}}
}

func newBackup(t *testing.T) *backup {
	t.Helper()
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	b := &backup{c: c}
	b.old = c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	b.now = c.EncryptionConfig("now.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	ns := &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app", CreationTimestamp: metav1.Unix(1700000000, 0)}, Status: api.NamespaceStatus{Phase: api.NamespaceActive}}
	c.Put("/registry/namespaces/app", namespacesGR, ns, "", "", b.old)
	c.Put("/registry/secrets/app/s1", testcluster.SecretsGR, testcluster.Secret("app", "s1", "one"), "", "", b.old)
	c.Put("/registry/secrets/app/s2", testcluster.SecretsGR, testcluster.Secret("app", "s2", "two"), "", "", b.old)
	c.Put("/registry/configmaps/app/cm", testcluster.ConfigMapsGR, testcluster.ConfigMap("app", "cm"), "", "", b.old)
	dep := &apps.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "app", UID: "uid-web", CreationTimestamp: metav1.Unix(1700000000, 0), Labels: map[string]string{"app": "web"}},
		Spec: apps.DeploymentSpec{Replicas: 1, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: api.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}}, Spec: api.PodSpec{Containers: []api.Container{{Name: "c", Image: "busybox"}}}}},
		Status: apps.DeploymentStatus{Replicas: 1, ObservedGeneration: 1}}
	c.Put("/registry/deployments/app/web", deploymentsGR, dep, "", "", b.old)
	rs := &apps.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "app", UID: "uid-web-1", CreationTimestamp: metav1.Unix(1700000000, 0), Labels: map[string]string{"app": "web"}, OwnerReferences: ownedBy("Deployment", "web")},
		Spec: apps.ReplicaSetSpec{Replicas: 1, Selector: dep.Spec.Selector, Template: dep.Spec.Template}}
	c.Put("/registry/replicasets/app/web-1", replicaSetsGR, rs, "", "", b.old)
	pod := &api.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: "app", UID: "uid-stray", CreationTimestamp: metav1.Unix(1700000000, 0), OwnerReferences: ownedBy("ReplicaSet", "gone")},
		Spec: api.PodSpec{Containers: []api.Container{{Name: "c", Image: "busybox"}}}}
	c.Put("/registry/pods/app/stray", podsGR, pod, "", "", b.old)
	lease, err := c.Cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	c.Put("/registry/events/app/ev", eventsGR, testcluster.Event("app", "ev"), "", "", b.old, clientv3.WithLease(lease.ID))
	// Another namespace, never selected.
	c.Put("/registry/secrets/other/keep", testcluster.SecretsGR, testcluster.Secret("other", "keep", "k"), "", "", b.old)

	b.file = filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(ctx, c.Cli, b.file); err != nil {
		t.Fatal(err)
	}
	if b.good, err = os.ReadFile(b.file); err != nil {
		t.Fatal(err)
	}
	// Since: the namespace deleted, the other rewritten under key2 (the
	// rotation), s2 created again with other content.
	for _, p := range []string{"/registry/namespaces/app", "/registry/secrets/app/", "/registry/configmaps/app/", "/registry/deployments/app/", "/registry/replicasets/app/", "/registry/pods/app/", "/registry/events/app/"} {
		if _, err := c.Cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
	}
	c.Put("/registry/secrets/other/keep", testcluster.SecretsGR, testcluster.Secret("other", "keep", "k"), "", "", b.now)
	b.s2 = "/registry/secrets/app/s2"
	c.Put(b.s2, testcluster.SecretsGR, testcluster.Secret("app", "s2", "changed"), "", "", b.now)
	return b
}

func (b *backup) env(t *testing.T) *pipeline.Env {
	return b.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: b.now}})
}

func (b *backup) open(t *testing.T) *snapshotdb.File {
	t.Helper()
	f, err := snapshotdb.Open(b.file, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func (b *backup) options(t *testing.T, sel restore.Selector) restore.Options {
	return restore.Options{
		Backup: b.open(t), BackupName: b.file,
		BackupEncryption: b.c.LoadEncryption(b.old), BackupEncryptionName: b.old,
		Select:  sel,
		Journal: filepath.Join(t.TempDir(), "restore.journal"),
	}
}

func actions(res *restore.Result) map[string]string {
	out := map[string]string{}
	for _, e := range res.Entries {
		out[e.Key] = e.Action
	}
	return out
}

// TestRestoreNamespace restores a deleted namespace from a backup written
// under a key retired since: the whole namespace is refused while a Pod
// names an owner that is nowhere; without that Pod every object comes back
// as it was (uids, ownerReferences), readable with today's key alone; the
// Secret written again since is left ("exists") until --overwrite, then
// "same"; a rollback of each run puts etcd back byte for byte.
func TestRestoreNamespace(t *testing.T) {
	b := newBackup(t)
	ctx := context.Background()
	env := b.env(t)
	before := b.c.Raw()

	// The whole namespace: the stray Pod's owner is nowhere.
	res, err := restore.Run(ctx, env, b.options(t, restore.Selector{Namespaces: []string{"app"}}))
	var de *restore.DanglingOwnersError
	if !errors.As(err, &de) || de.N != 1 {
		t.Fatalf("want the dangling owner refused, got %v", err)
	}
	want := map[string]string{
		"/registry/namespaces/app":        restore.ActionCreate,
		"/registry/secrets/app/s1":        restore.ActionCreate,
		"/registry/secrets/app/s2":        restore.ActionExists,
		"/registry/configmaps/app/cm":     restore.ActionCreate,
		"/registry/deployments/app/web":   restore.ActionCreate,
		"/registry/replicasets/app/web-1": restore.ActionCreate,
		"/registry/pods/app/stray":        restore.ActionDanglingOwner,
		"/registry/events/app/ev":         restore.ActionSkipped,
	}
	if d := cmp.Diff(want, actions(res)); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"aescbc:key1", "identity"}, res.Needs); d != "" {
		t.Errorf("needs (-want +got):\n%s", d)
	}
	b.c.RequireBack(before)

	// Without the Pod: written.
	opts := b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets", "configmaps", "deployments.apps", "replicasets.apps"}})
	res, err = restore.Run(ctx, env, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Written != 5 || res.Exists != 1 || res.Conflicts != 0 || res.Failed != 0 {
		t.Fatalf("written %d exists %d conflicts %d failed %d, want 5 1 0 0: %+v", res.Written, res.Exists, res.Conflicts, res.Failed, res.Entries)
	}
	if fi, err := os.Stat(opts.Journal); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("journal: %v %v", fi, err)
	}
	// Today's key alone reads each one as it was.
	today := b.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: b.now}})
	for key, uid := range map[string]types.UID{"/registry/namespaces/app": "uid-app", "/registry/secrets/app/s1": "uid-s1", "/registry/configmaps/app/cm": "uid-cm", "/registry/deployments/app/web": "uid-web", "/registry/replicasets/app/web-1": "uid-web-1"} {
		d := testcluster.Decision(t, today, b.c, key)
		encrypted := strings.Contains(key, "/secrets/") || strings.Contains(key, "/configmaps/")
		if d.Status != "current" || encrypted != strings.HasPrefix(d.From.Encryption, "aescbc:key2") {
			t.Errorf("%s: %s under %s, want current under key2", key, d.Status, d.From.Encryption)
		}
		obj, _ := testcluster.Stored(t, today, b.c, key)
		m, err := meta.Accessor(obj)
		if err != nil || m.GetUID() != uid {
			t.Errorf("%s: uid %v (%v), want %s", key, m.GetUID(), err, uid)
		}
		if key == "/registry/replicasets/app/web-1" && (len(m.GetOwnerReferences()) != 1 || m.GetOwnerReferences()[0].UID != "uid-web") {
			t.Errorf("%s: ownerReferences %v", key, m.GetOwnerReferences())
		}
	}
	s1, _ := testcluster.Stored(t, today, b.c, "/registry/secrets/app/s1")
	if string(s1.(*api.Secret).Data["password"]) != "one" {
		t.Errorf("s1: not the backup's content")
	}
	afterFirst := b.c.Raw()

	// Again: everything the same (the Namespace is there: not taken), the
	// Secret written since still left.
	res, err = restore.Run(ctx, env, b.options(t, opts.Select))
	if err != nil || res.Same != 4 || res.Exists != 1 || res.Written != 0 {
		t.Fatalf("again: same %d exists %d written %d: %v", res.Same, res.Exists, res.Written, err)
	}
	// --overwrite: the Secret written since is replaced.
	over := b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets"}, Names: []string{"s2"}})
	over.Overwrite = true
	res, err = restore.Run(ctx, env, over)
	if err != nil || res.Overwrite != 1 || res.Written != 1 {
		t.Fatalf("overwrite: %d written %d: %v", res.Overwrite, res.Written, err)
	}
	s2, _ := testcluster.Stored(t, today, b.c, b.s2)
	if string(s2.(*api.Secret).Data["password"]) != "two" {
		t.Errorf("s2: not the backup's content after --overwrite")
	}
	res, err = restore.Run(ctx, env, b.options(t, over.Select))
	if err != nil || res.Same != 1 {
		t.Errorf("after the overwrite: same %d: %v", res.Same, err)
	}

	// Rollback, newest run first: the overwrite, then the creations.
	for _, j := range []string{over.Journal, opts.Journal} {
		rb, err := rollback.Rollback(ctx, b.c.Cli, j, &etcdscan.Writer{Client: b.c.Cli})
		if err != nil || rb.Failed != 0 || rb.Skipped != 0 {
			t.Fatalf("rollback %s: %+v %v", j, rb, err)
		}
		if j == over.Journal {
			if d := cmp.Diff(afterFirst, b.c.Raw()); d != "" {
				t.Fatalf("rollback of the overwrite: not back byte for byte")
			}
		}
	}
	b.c.RequireBack(before)
}

// TestRestoreEventsFreshLease: Events come back only when asked for, on a
// fresh lease of kube-apiserver's --event-ttl (plus its lease manager's
// reuse period), never on the backup's.
func TestRestoreEventsFreshLease(t *testing.T) {
	b := newBackup(t)
	ctx := context.Background()
	res, err := restore.Run(ctx, b.env(t), b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"events"}}))
	if err != nil || res.Written != 2 { // the Event and its Namespace
		t.Fatalf("written %d: %v %+v", res.Written, err, res.Entries)
	}
	_, _, lease := b.c.Get("/registry/events/app/ev")
	ttl, err := b.c.Cli.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil || ttl.GrantedTTL != 3600+60 {
		t.Errorf("event's lease %x: granted %d s (%v), want 3660", lease, ttl.GrantedTTL, err)
	}
}

// TestRestoreMissingKey: a backup key the given configuration lacks is
// named, and nothing is written.
func TestRestoreMissingKey(t *testing.T) {
	b := newBackup(t)
	before := b.c.Raw()
	opts := b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets"}})
	opts.BackupEncryption, opts.BackupEncryptionName = b.c.LoadEncryption(b.now), b.now
	_, err := restore.Run(context.Background(), b.env(t), opts)
	var me *restore.MissingKeysError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "aescbc:key1") || !strings.Contains(err.Error(), b.now) || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("want aescbc:key1 named: %v", err)
	}
	if _, err := os.Stat(opts.Journal); !os.IsNotExist(err) {
		t.Errorf("journal made: %v", err)
	}
	b.c.RequireBack(before)
}

// TestRestoreDamagedBackup: a truncated or altered backup is refused on one
// line naming it; one whose pages are garbage (read without its hash check)
// fails while it is read; etcd is unchanged byte for byte.
func TestRestoreDamagedBackup(t *testing.T) {
	b := newBackup(t)
	before := b.c.Raw()
	dmg := testsnap.Damage(t, t.TempDir(), b.good)
	for _, p := range []string{dmg.Truncated, dmg.Flipped} {
		_, err := snapshotdb.Open(p, snapshotdb.Options{})
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want a one-line refusal naming it", p, err)
		}
	}
	f, err := snapshotdb.Open(dmg.Garbage, snapshotdb.Options{SkipHashCheck: true})
	if err == nil {
		defer f.Close()
		opts := b.options(t, restore.Selector{Namespaces: []string{"app"}})
		opts.Backup = f
		if _, err := restore.Run(context.Background(), b.env(t), opts); err == nil {
			t.Errorf("garbage backup: no error")
		}
	}
	b.c.RequireBack(before)
}

// TestRestoreSelectors: the selectors compose; a resource no live CRD
// serves is refused, naming how to restore the CRD first.
func TestRestoreSelectors(t *testing.T) {
	b := newBackup(t)
	ctx := context.Background()
	opts := b.options(t, restore.Selector{Keys: []string{"/registry/secrets/app/s"}, Names: []string{"s1"}})
	opts.DryRun = true
	res, err := restore.Run(ctx, b.env(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range res.Entries {
		keys = append(keys, e.Key+" "+e.Action)
	}
	sort.Strings(keys)
	if d := cmp.Diff([]string{"/registry/secrets/app/s1 create"}, keys); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	opts.Select = restore.Selector{Resources: []string{"widgets.example.com"}}
	_, err = restore.Run(ctx, b.env(t), opts)
	var se *restore.SelectError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "customresourcedefinitions.apiextensions.k8s.io --name widgets.example.com") {
		t.Errorf("unknown CR: %v", err)
	}
}

// TestRestoreMissingCRD: a custom resource of the backup whose CRD the live
// etcd lacks is refused, naming the CRD; nothing is written.
func TestRestoreMissingCRD(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	c.Put("/registry/namespaces/app", namespacesGR, &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app"}}, "", "", "")
	c.PutRaw("/registry/example.com/widgets/app/w1", []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"app","uid":"uid-w1"},"spec":{"size":3}}`))
	file := filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(ctx, c.Cli, file); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/registry/example.com/", "/registry/namespaces/app"} {
		if _, err := c.Cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
	}
	before := c.Raw()
	f, err := snapshotdb.Open(file, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = restore.Run(ctx, c.Env(pipeline.Config{}), restore.Options{Backup: f, BackupName: file, BackupEncryption: c.LoadEncryption(""),
		Select: restore.Selector{Namespaces: []string{"app"}}, Journal: filepath.Join(t.TempDir(), "j")})
	var me *restore.MissingCRDError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "CRD widgets.example.com is not in the live etcd") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("want the CRD named: %v", err)
	}
	c.RequireBack(before)
}

// TestRestoreIntoTerminatingNamespace: a live namespace being deleted is
// refused: its controller would delete what is restored into it.
func TestRestoreIntoTerminatingNamespace(t *testing.T) {
	b := newBackup(t)
	now := metav1.Now()
	ns := &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app-2", DeletionTimestamp: &now, Finalizers: []string{"kubernetes"}}, Status: api.NamespaceStatus{Phase: api.NamespaceTerminating}}
	b.c.Put("/registry/namespaces/app", namespacesGR, ns, "", "", "")
	before := b.c.Raw()
	_, err := restore.Run(context.Background(), b.env(t), b.options(t, restore.Selector{Namespaces: []string{"app"}}))
	var se *restore.SelectError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "Terminating") {
		t.Fatalf("want the terminating namespace refused: %v", err)
	}
	b.c.RequireBack(before)
}

// TestRestoreCRDThenItsObjects: a CRD deleted with its custom resources. A
// restore of the namespace names the CRD and how to restore it first; the
// CRD restored, a second restore brings its objects back through it.
func TestRestoreCRDThenItsObjects(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	c.Put("/registry/namespaces/ns1", namespacesGR, &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1", UID: "uid-ns1"}}, "", "", "")
	props := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type:       "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}}},
	}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: "crd-uid", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group:    "example.com",
			Names:    apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope:    apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: props}},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
	}
	internal := &apiextensions.CustomResourceDefinition{}
	if err := decode.ExtensionsScheme.Convert(crd, internal, nil); err != nil {
		t.Fatal(err)
	}
	const crdKey = "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com"
	c.Put(crdKey, decode.CRDGroupResource, internal, "", "", "")
	const crKey = "/registry/example.com/widgets/ns1/w1"
	c.PutRaw(crKey, []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"ns1","uid":"uid-w1","creationTimestamp":"2026-01-02T03:04:05Z"},"spec":{"size":3}}`+"\n"))
	file := filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(ctx, c.Cli, file); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{crdKey, crKey} {
		if _, err := c.Cli.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	f, err := snapshotdb.Open(file, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts := func(sel restore.Selector) restore.Options {
		return restore.Options{Backup: f, BackupName: file, BackupEncryption: c.LoadEncryption(""), Select: sel, Journal: filepath.Join(t.TempDir(), "j")}
	}
	_, err = restore.Run(ctx, c.Env(pipeline.Config{}), opts(restore.Selector{Namespaces: []string{"ns1"}}))
	if err == nil || !strings.Contains(err.Error(), "restore it first (restore --resource customresourcedefinitions.apiextensions.k8s.io --name widgets.example.com)") {
		t.Fatalf("want the CRD named with the way to restore it: %v", err)
	}
	res, err := restore.Run(ctx, c.Env(pipeline.Config{}), opts(restore.Selector{Resources: []string{"customresourcedefinitions.apiextensions.k8s.io"}, Names: []string{"widgets.example.com"}}))
	if err != nil || res.Written != 1 {
		t.Fatalf("the CRD: written %d, %v %+v", res.Written, err, res.Entries)
	}
	env := c.Env(pipeline.Config{}) // today's CRDs: the one restored
	res, err = restore.Run(ctx, env, opts(restore.Selector{Resources: []string{"widgets.example.com"}}))
	if err != nil || res.Written != 1 {
		t.Fatalf("its objects: written %d, %v %+v", res.Written, err, res.Entries)
	}
	obj, _ := testcluster.Stored(t, env, c, crKey)
	if m, err := meta.Accessor(obj); err != nil || m.GetUID() != "uid-w1" {
		t.Errorf("custom resource: %v %v", obj, err)
	}
}

// TestRestoreToManifests: the selection as manifests for kubectl create, one
// file per object, mode 0600, without the fields kube-apiserver sets; etcd
// untouched; nothing decrypted in the result.
func TestRestoreToManifests(t *testing.T) {
	b := newBackup(t)
	before := b.c.Raw()
	dir := filepath.Join(t.TempDir(), "manifests")
	opts := b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets", "deployments.apps", "replicasets.apps"}})
	opts.ToManifests = dir
	res, err := restore.Run(context.Background(), b.env(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifests != 5 || res.Secrets != 2 {
		t.Fatalf("manifests %d secrets %d, want 5 and 2: %+v", res.Manifests, res.Secrets, res.Entries)
	}
	b.c.RequireBack(before)
	out, _ := json.Marshal(res)
	if strings.Contains(string(out), "two") || strings.Contains(string(out), "dHdv") {
		t.Errorf("a decrypted value in the result")
	}
	for name, want := range map[string][]string{
		"00-namespaces_app.yaml":             {"apiVersion: v1\n", "kind: Namespace\n", "name: app\n"},
		"10-secrets_app_s2.yaml":             {"kind: Secret\n", "password: dHdv\n"},
		"10-deployments.apps_app_web.yaml":   {"apiVersion: apps/v1\n", "kind: Deployment\n", "replicas: 1\n"},
		"10-replicasets.apps_app_web-1.yaml": {"kind: ReplicaSet\n"},
	} {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", name, fi, err)
			continue
		}
		data, _ := os.ReadFile(path)
		for _, w := range want {
			if !strings.Contains(string(data), w) {
				t.Errorf("%s lacks %q:\n%s", name, w, data)
			}
		}
		for _, no := range []string{"uid:", "resourceVersion:", "creationTimestamp: \"", "ownerReferences:", "status:"} {
			if strings.Contains(string(data), no) {
				t.Errorf("%s has %q:\n%s", name, no, data)
			}
		}
	}
	// A second run never replaces a file.
	if _, err := restore.Run(context.Background(), b.env(t), opts); err == nil || !strings.Contains(err.Error(), "never replaced") {
		t.Errorf("second run into the same directory: %v", err)
	}
}

// TestRestoreWrongKeyMaterial: a backup configuration whose key has the
// backup's name but other material refuses the restore, naming the key.
func TestRestoreWrongKeyMaterial(t *testing.T) {
	b := newBackup(t)
	before := b.c.Raw()
	wrong := b.c.EncryptionConfig("wrong.yaml", testcluster.AESCBC("key1", 9), testcluster.Identity)
	opts := b.options(t, restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets"}})
	opts.BackupEncryption, opts.BackupEncryptionName = b.c.LoadEncryption(wrong), wrong
	_, err := restore.Run(context.Background(), b.env(t), opts)
	var me *restore.MissingKeysError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "under aescbc:key1 (e.g. /registry/secrets/app/s1) do not decrypt") {
		t.Fatalf("want aescbc:key1 named as refusing: %v", err)
	}
	b.c.RequireBack(before)
}

// TestRestoreKMSv2Backup: a backup written under a KMS v2 plugin is
// restored with that configuration (its plugin running) into a cluster
// that encrypts with aescbc today.
func TestRestoreKMSv2Backup(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	kmsCfg := filepath.Join(t.TempDir(), "kms.yaml")
	if err := os.WriteFile(kmsCfg, []byte(fmt.Sprintf("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 3s}\n  - identity: {}\n", plugin.Endpoint())), 0o600); err != nil {
		t.Fatal(err)
	}
	now := c.EncryptionConfig("now.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	c.Put("/registry/namespaces/app", namespacesGR, &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app"}}, "", "", "")
	c.Put("/registry/secrets/app/k", testcluster.SecretsGR, testcluster.Secret("app", "k", "kms"), "", "", kmsCfg)
	file := filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(ctx, c.Cli, file); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cli.Delete(ctx, "/registry/secrets/app/k"); err != nil {
		t.Fatal(err)
	}
	f, err := snapshotdb.Open(file, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: now}})
	res, err := restore.Run(ctx, env, restore.Options{Backup: f, BackupName: file, BackupEncryption: c.LoadEncryption(kmsCfg), BackupEncryptionName: kmsCfg,
		Select: restore.Selector{Namespaces: []string{"app"}, Resources: []string{"secrets"}}, Journal: filepath.Join(t.TempDir(), "j")})
	if err != nil || res.Written != 1 || !cmp.Equal(res.Needs, []string{"kms2:vault"}) {
		t.Fatalf("written %d needs %v: %v", res.Written, res.Needs, err)
	}
	if v, _, _ := c.Get("/registry/secrets/app/k"); !strings.HasPrefix(string(v), "k8s:enc:aescbc:v1:key2:") {
		t.Errorf("not under today's key2")
	}
	obj, _ := testcluster.Stored(t, env, c, "/registry/secrets/app/k")
	if string(obj.(*api.Secret).Data["password"]) != "kms" {
		t.Errorf("not the backup's content")
	}
}

// TestRestoreQuota: a selection whose writes would take etcd past its quota
// (less the margin) is refused before the first write, naming the quota and
// the remedies: etcd unchanged byte for byte, no alarm raised (without the
// check, the restore wrote until etcd refused with NOSPACE and raised its
// alarm, the cluster read-only). One that fits is restored, with the
// quota's line among the checks.
func TestRestoreQuota(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{QuotaBackendBytes: 16 << 20})
	enc := c.EncryptionConfig("identity.yaml", testcluster.Identity)
	ns := &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", UID: "uid-app", CreationTimestamp: metav1.Unix(1700000000, 0)}, Status: api.NamespaceStatus{Phase: api.NamespaceActive}}
	c.Put("/registry/namespaces/app", namespacesGR, ns, "", "", enc)
	big := strings.Repeat("x", 900<<10)
	for i := range 12 {
		cm := testcluster.ConfigMap("app", fmt.Sprintf("big-%d", i))
		cm.Data = map[string]string{"blob": big}
		c.Put(fmt.Sprintf("/registry/configmaps/app/big-%d", i), testcluster.ConfigMapsGR, cm, "", "", enc)
	}
	file := filepath.Join(t.TempDir(), "backup.db")
	if _, err := etcdscan.SaveSnapshot(ctx, c.Cli, file); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cli.Delete(ctx, "/registry/configmaps/app/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	f, err := snapshotdb.Open(file, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: enc}})
	opts := func(sel restore.Selector) restore.Options {
		return restore.Options{Backup: f, BackupName: file, BackupEncryption: c.LoadEncryption(enc), BackupEncryptionName: enc,
			Select: sel, Journal: filepath.Join(t.TempDir(), "restore.journal")}
	}

	before := c.Raw()
	res, err := restore.Run(ctx, env, opts(restore.Selector{Namespaces: []string{"app"}, Resources: []string{"configmaps"}}))
	var pe *guard.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "past etcd's 16.0 MiB quota") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("12 × 900 KB into a 16 MiB quota holding their history: %v; want a preflight refusal naming the quota", err)
	}
	if res.Written != 0 {
		t.Errorf("written %d after the refusal", res.Written)
	}
	c.RequireBack(before)
	if alarms, err := c.Cli.AlarmList(ctx); err != nil || len(alarms.Alarms) > 0 {
		t.Errorf("alarms: %v %v", alarms, err)
	}

	res, err = restore.Run(ctx, env, opts(restore.Selector{Namespaces: []string{"app"}, Names: []string{"big-0"}}))
	if err != nil || res.Written != 1 {
		t.Fatalf("one ConfigMap: written %d, %v", res.Written, err)
	}
	if !slices.ContainsFunc(res.Preflight, func(l string) bool { return strings.HasPrefix(l, "etcd's quota: 16.0 MiB") }) {
		t.Errorf("no quota line among the checks: %q", res.Preflight)
	}
}
