package testcluster

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/target"
)

// MixedPassword is the password of every Secret a Mixed keyspace holds (in
// its data and in kubectl's last-applied annotation): no report may print it.
const MixedPassword = "hunter22-very-secret"

// Mixed is a cluster for the read-only commands' tests (inventory, inspect):
// Seed writes a keyspace of every kind of key they report.
type Mixed struct {
	*Cluster
	EncCfg string // aescbc key1 (writes), identity
}

// NewMixed starts the etcd and writes the encryption configuration.
func NewMixed(t *testing.T) *Mixed {
	t.Helper()
	c := &Mixed{Cluster: New(t, testetcd.Options{})}
	c.EncCfg = c.EncryptionConfig("enc.yaml", AESCBC("key1", 1), Identity)
	return c
}

// MixedEnv is the environment of the whole keyspace with EncCfg.
func (c *Mixed) MixedEnv() *pipeline.Env {
	return c.Env(pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: c.EncCfg}})
}

// MixedSecret is a Secret with MixedPassword in its data and in kubectl's
// last-applied annotation, and a "team: db" annotation.
func MixedSecret(ns, name string) *api.Secret {
	s := Secret(ns, name, MixedPassword)
	s.Annotations = map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"Secret","stringData":{"password":"` + MixedPassword + `"}}`,
		"team": "db",
	}
	s.Data["user"] = []byte("admin")
	return s
}

// Seed writes the mixed keyspace and returns the lease of the events:
// Secrets under key1, identity and a key the configuration no longer has;
// ConfigMaps in protobuf and JSON, one truncated, one garbage; DeviceClasses
// as 1.34 and 1.37 store them; two Events on a lease; a custom resource
// without its CRD (orphaned); /registry/health; a key outside the prefix.
func (c *Mixed) Seed() clientv3.LeaseID {
	c.T.Helper()
	other := c.EncryptionConfig("other.yaml", AESCBC("gone", 9))
	c.Put("/registry/secrets/default/db", SecretsGR, MixedSecret("default", "db"), "", "", c.EncCfg)
	c.Put("/registry/secrets/default/api", SecretsGR, MixedSecret("default", "api"), "", "", c.EncCfg)
	c.Put("/registry/secrets/kube-system/plain", SecretsGR, MixedSecret("kube-system", "plain"), "", "", "")
	// Encrypted with a key the configuration no longer has.
	c.Put("/registry/secrets/default/lost", SecretsGR, MixedSecret("default", "lost"), "", "", other)

	c.Put("/registry/configmaps/default/proto", ConfigMapsGR, ConfigMap("default", "proto"), "", "", "")
	c.Put("/registry/configmaps/default/json", ConfigMapsGR, ConfigMap("default", "json"), "", decode.MediaTypeJSON, "")
	full := c.Encode("/registry/configmaps/default/truncated", ConfigMapsGR, ConfigMap("default", "truncated"), "", "", "")
	c.PutRaw("/registry/configmaps/default/truncated", full[:len(full)/2])
	c.PutRaw("/registry/configmaps/default/garbage", []byte("this is not a kubernetes object"))

	c.Put("/registry/deviceclasses/old-gpu", DeviceClassGR, DeviceClass("old-gpu"), "1.34", "", "")
	c.Put("/registry/deviceclasses/gpu", DeviceClassGR, DeviceClass("gpu"), "", "", "")

	lease, err := c.Cli.Grant(context.Background(), 3600)
	if err != nil {
		c.T.Fatal(err)
	}
	c.Put("/registry/events/default/e1", EventsGR, Event("default", "e1"), "", "", "", clientv3.WithLease(lease.ID))
	c.Put("/registry/events/default/e2", EventsGR, Event("default", "e2"), "", "", "", clientv3.WithLease(lease.ID))

	c.PutRaw("/registry/example.com/widgets/default/w1", []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1"}}`))
	c.PutRaw("/registry/health", []byte(`{"health":"true"}`))
	// Outside the prefix: never scanned.
	c.PutRaw("compact_rev_key", []byte("1"))
	return lease.ID
}

// StorageVersion is the version kube-apiserver emulating emulated stores gr in.
func StorageVersion(t *testing.T, emulated string, gr schema.GroupResource) string {
	t.Helper()
	sc, err := storageConfig(emulated, "")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := sc.Codec(gr)
	if err != nil {
		t.Fatal(err)
	}
	return rc.StorageVersion.String()
}
