package inventory

import (
	"context"
	"kube-etcd-migrate/target"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/pipeline"
)

var devclassGR = testcluster.DeviceClassGR

// cluster is the mixed keyspace of the read-only commands' tests.
type cluster struct{ *testcluster.Mixed }

func newCluster(t *testing.T) *cluster { return &cluster{testcluster.NewMixed(t)} }

func (c *cluster) env() *pipeline.Env { return c.MixedEnv() }

func (c *cluster) seed() clientv3.LeaseID { return c.Seed() }

func storageVersion(t *testing.T, emulated string, gr schema.GroupResource) string {
	return testcluster.StorageVersion(t, emulated, gr)
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
}

func TestInventoryResourceFilter(t *testing.T) {
	c := newCluster(t)
	c.seed()
	env, err := pipeline.Setup(context.Background(), c.Cli, pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: c.EncCfg}, Resources: []string{"events"}})
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
