package inventory

import (
	"bytes"
	"context"
	"encoding/json"
	"kube-etcd-migrate/target"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
)

var (
	configmapsGR = schema.GroupResource{Resource: "configmaps"}
	devclassGR   = schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}
	eventsGR     = schema.GroupResource{Resource: "events"}
)

const password = "hunter22-very-secret"

type cluster struct {
	*testcluster.Cluster
	encCfg string // aescbc key1 (writes), identity
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{Cluster: testcluster.New(t, testetcd.Options{})}
	c.encCfg = c.EncryptionConfig("enc.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	return c
}

func (c *cluster) env() *pipeline.Env {
	return c.Env(pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: c.encCfg}})
}

func meta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)}
}

func secret(ns, name string) *api.Secret {
	m := meta(ns, name)
	m.Annotations = map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"Secret","stringData":{"password":"` + password + `"}}`,
		"team": "db",
	}
	return &api.Secret{ObjectMeta: m, Type: api.SecretTypeOpaque, Data: map[string][]byte{"password": []byte(password), "user": []byte("admin")}}
}

func configMap(ns, name string) *api.ConfigMap {
	return &api.ConfigMap{ObjectMeta: meta(ns, name), Data: map[string]string{"app.properties": "color=blue\n"}}
}

func deviceClass(name string) *resource.DeviceClass {
	return &resource.DeviceClass{
		ObjectMeta: meta("", name),
		Spec:       resource.DeviceClassSpec{Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	}
}

func event(ns, name string) *api.Event {
	return &api.Event{
		ObjectMeta:     meta(ns, name),
		InvolvedObject: api.ObjectReference{Kind: "Pod", Namespace: ns, Name: "web-0"},
		Reason:         "Scheduled", Message: "Successfully assigned", Type: "Normal", Count: 1,
	}
}

// seed writes a mixed keyspace and returns the lease of the events.
func (c *cluster) seed() clientv3.LeaseID {
	c.T.Helper()
	other := c.EncryptionConfig("other.yaml", testcluster.AESCBC("gone", 9))
	c.Put("/registry/secrets/default/db", secretsGR, secret("default", "db"), "", "", c.encCfg)
	c.Put("/registry/secrets/default/api", secretsGR, secret("default", "api"), "", "", c.encCfg)
	c.Put("/registry/secrets/kube-system/plain", secretsGR, secret("kube-system", "plain"), "", "", "")
	// Encrypted with a key the configuration no longer has.
	c.Put("/registry/secrets/default/lost", secretsGR, secret("default", "lost"), "", "", other)

	c.Put("/registry/configmaps/default/proto", configmapsGR, configMap("default", "proto"), "", "", "")
	c.Put("/registry/configmaps/default/json", configmapsGR, configMap("default", "json"), "", decode.MediaTypeJSON, "")
	full := c.Encode("/registry/configmaps/default/truncated", configmapsGR, configMap("default", "truncated"), "", "", "")
	c.PutRaw("/registry/configmaps/default/truncated", full[:len(full)/2])
	c.PutRaw("/registry/configmaps/default/garbage", []byte("this is not a kubernetes object"))

	c.Put("/registry/deviceclasses/old-gpu", devclassGR, deviceClass("old-gpu"), "1.34", "", "")
	c.Put("/registry/deviceclasses/gpu", devclassGR, deviceClass("gpu"), "", "", "")

	lease, err := c.Cli.Grant(context.Background(), 3600)
	if err != nil {
		c.T.Fatal(err)
	}
	c.Put("/registry/events/default/e1", eventsGR, event("default", "e1"), "", "", "", clientv3.WithLease(lease.ID))
	c.Put("/registry/events/default/e2", eventsGR, event("default", "e2"), "", "", "", clientv3.WithLease(lease.ID))

	c.PutRaw("/registry/example.com/widgets/default/w1", []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1"}}`))
	c.PutRaw("/registry/health", []byte(`{"health":"true"}`))
	// Outside the prefix: never scanned.
	c.PutRaw("compact_rev_key", []byte("1"))
	return lease.ID
}

// storageVersion is the version kube-apiserver emulating emulated stores gr in.
func storageVersion(t *testing.T, emulated string, gr schema.GroupResource) string {
	t.Helper()
	sc, err := decode.NewStorageConfig(emulated, "")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := sc.Codec(gr)
	if err != nil {
		t.Fatal(err)
	}
	return rc.StorageVersion.String()
}

func find(t *testing.T, inv *Inventory, name string) *Resource {
	t.Helper()
	for _, r := range inv.Resources {
		if r.Name() == name {
			return r
		}
	}
	t.Fatalf("no resource %s in the inventory", name)
	return nil
}

func eq[K comparable, V comparable](t *testing.T, what string, got, want map[K]V) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", what, got, want)
			return
		}
	}
}

func TestInventoryMixedKeyspace(t *testing.T) {
	c := newCluster(t)
	c.seed()
	env := c.env()
	var progressed int64
	inv, err := Run(context.Background(), env, Options{}, func(n int64) { progressed = n })
	if err != nil {
		t.Fatal(err)
	}
	if !inv.Consistent || inv.Revision == 0 {
		t.Errorf("revision %d consistent %v, want a pinned consistent scan", inv.Revision, inv.Consistent)
	}
	if inv.Total.Keys != 14 || progressed != 14 {
		t.Errorf("keys %d, progress %d, want 14 (every key under /registry/)", inv.Total.Keys, progressed)
	}
	if inv.Total.Objects != 12 || inv.Total.NotObjects != 1 || inv.Total.Unreadable != 3 || inv.Total.Orphaned != 1 || inv.Total.WithLease != 2 {
		t.Errorf("totals %+v, want 12 objects, 1 not-object, 3 unreadable, 1 orphaned, 2 with lease", inv.Total)
	}

	sec := find(t, inv, "secrets")
	if sec.Count != 4 {
		t.Errorf("secrets count %d, want 4", sec.Count)
	}
	eq(t, "secrets encryption", sec.Encryption, map[string]int64{"aescbc:key1": 2, "identity": 1, "aescbc:gone": 1})
	eq(t, "secrets versions", sec.Versions, map[string]int64{"v1": 3, unknown: 1})
	eq(t, "secrets unreadable", sec.UnreadableBy, map[decode.Reason]int64{decode.ReasonUndecryptable: 1})
	if len(sec.UnreadableKeys) != 1 || sec.UnreadableKeys[0].Key != "/registry/secrets/default/lost" {
		t.Errorf("secrets unreadable keys %+v", sec.UnreadableKeys)
	}

	cm := find(t, inv, "configmaps")
	if cm.Count != 4 || cm.Unreadable != 2 {
		t.Errorf("configmaps count %d unreadable %d, want 4 and 2", cm.Count, cm.Unreadable)
	}
	if cm.MediaTypes["protobuf"] < 1 || cm.MediaTypes["json"] != 1 {
		t.Errorf("configmaps media types %v, want protobuf and json=1", cm.MediaTypes)
	}
	var sum int64
	for _, n := range cm.UnreadableBy {
		sum += n
	}
	if sum != 2 || cm.UnreadableBy[decode.ReasonCorruptPayload]+cm.UnreadableBy[decode.ReasonCorruptEnvelope] != 2 {
		t.Errorf("configmaps unreadable by %v, want the truncated value and the garbage as corrupt", cm.UnreadableBy)
	}
	var size int64
	for _, k := range []string{"proto", "json", "truncated", "garbage"} {
		resp, err := c.Cli.Get(context.Background(), "/registry/configmaps/default/"+k)
		if err != nil {
			t.Fatal(err)
		}
		size += int64(len(resp.Kvs[0].Value))
	}
	if cm.Bytes != size {
		t.Errorf("configmaps bytes %d, want %d (the stored values)", cm.Bytes, size)
	}

	dc := find(t, inv, "deviceclasses.resource.k8s.io")
	oldVersion := storageVersion(t, "1.34", devclassGR)
	if oldVersion == "resource.k8s.io/v1" {
		t.Fatalf("kube-apiserver 1.34 stores deviceclasses in %s: the test needs an older version", oldVersion)
	}
	eq(t, "deviceclass versions", dc.Versions, map[string]int64{oldVersion: 1, "resource.k8s.io/v1": 1})

	ev := find(t, inv, "events")
	if ev.Count != 2 || ev.WithLease != 2 {
		t.Errorf("events count %d with lease %d, want 2 and 2", ev.Count, ev.WithLease)
	}

	// The widget's CRD is not in etcd: orphaned, apart from the resources.
	if len(inv.Orphaned) != 1 || inv.Orphaned[0].Reason != decode.OrphanCRDMissing || inv.Orphaned[0].Prefix != "/registry/example.com/widgets/" ||
		inv.Orphaned[0].Keys != 1 || len(inv.Orphaned[0].SampleKeys) != 1 || inv.Orphaned[0].SampleKeys[0] != "/registry/example.com/widgets/default/w1" {
		t.Errorf("orphaned %+v, want the widget as crd-missing", inv.Orphaned)
	}

	if len(inv.NotObjects) != 1 || inv.NotObjects[0].Key != "/registry/health" {
		t.Errorf("not objects %+v, want /registry/health", inv.NotObjects)
	}

	// The table names every resource, the unreadable keys and the not-object key,
	// and never a secret value.
	var out bytes.Buffer
	if err := inv.Write(&out, "table"); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, want := range []string{"secrets", "aescbc:key1=2", "deviceclasses.resource.k8s.io",
		oldVersion + "=1", "/registry/configmaps/default/truncated", "/registry/configmaps/default/garbage", "/registry/secrets/default/lost", "undecryptable",
		"Keys that are not API objects (1)", "/registry/health", "Orphaned keys (1;", "crd-missing", "/registry/example.com/widgets/default/w1"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, password) {
		t.Error("table shows a secret value")
	}
}

func TestInventoryJSON(t *testing.T) {
	c := newCluster(t)
	c.seed()
	inv, err := Run(context.Background(), c.env(), Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := inv.Write(&out, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Revision   *int64 `json:"revision"`
		Consistent *bool  `json:"consistent"`
		Resources  []struct {
			Group      *string          `json:"group"`
			Resource   string           `json:"resource"`
			Count      *int64           `json:"count"`
			Bytes      *int64           `json:"bytes"`
			Versions   map[string]int64 `json:"versions"`
			MediaTypes map[string]int64 `json:"mediaTypes"`
			Encryption map[string]int64 `json:"encryption"`
			WithLease  int64            `json:"withLease"`
		} `json:"resources"`
		NotObjects []struct {
			Key string `json:"key"`
		} `json:"notObjects"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("inventory JSON: %v\n%s", err, out.String())
	}
	if doc.Revision == nil || *doc.Revision != inv.Revision || doc.Consistent == nil || !*doc.Consistent {
		t.Errorf("revision/consistent missing or wrong:\n%s", out.String())
	}
	byName := map[string]int{}
	for i, r := range doc.Resources {
		if r.Group == nil || r.Count == nil || r.Bytes == nil {
			t.Errorf("resource %s lacks group, count or bytes", r.Resource)
			continue
		}
		byName[*r.Group+"/"+r.Resource] = i
	}
	ev, ok := byName["/events"]
	if !ok || *doc.Resources[ev].Count != 2 || doc.Resources[ev].WithLease != 2 || doc.Resources[ev].Versions["v1"] != 2 {
		t.Errorf("events entry wrong or missing:\n%s", out.String())
	}
	dc, ok := byName["resource.k8s.io/deviceclasses"]
	if !ok || *doc.Resources[dc].Count != 2 || *doc.Resources[dc].Bytes <= 0 {
		t.Errorf("deviceclasses entry wrong or missing:\n%s", out.String())
	}
	sec := byName["/secrets"]
	if doc.Resources[sec].Encryption["aescbc:key1"] != 2 {
		t.Errorf("secrets encryption %v", doc.Resources[sec].Encryption)
	}
	if len(doc.NotObjects) != 1 || doc.NotObjects[0].Key != "/registry/health" {
		t.Errorf("notObjects %+v", doc.NotObjects)
	}
	if strings.Contains(out.String(), password) {
		t.Error("JSON shows a secret value")
	}
}

func TestInventoryResourceFilter(t *testing.T) {
	c := newCluster(t)
	c.seed()
	env, err := pipeline.Setup(context.Background(), c.Cli, pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: c.encCfg}, Resources: []string{"events"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	inv, err := Run(context.Background(), env, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Resources) != 1 || inv.Resources[0].Name() != "events" || inv.Total.Objects != 2 {
		t.Errorf("--resource events gave %d resources, %d objects", len(inv.Resources), inv.Total.Objects)
	}
}
