// Package testcluster writes objects into a real (embedded) etcd the way
// kube-apiserver would store them — through its storage codecs and encryption
// transformers — for the tests of the packages that read and rewrite them.
package testcluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/release"
)

// Resources the tests use.
var (
	SecretsGR     = schema.GroupResource{Resource: "secrets"}
	ConfigMapsGR  = schema.GroupResource{Resource: "configmaps"}
	DeviceClassGR = schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}
	EventsGR      = schema.GroupResource{Resource: "events"}
)

type Cluster struct {
	T   *testing.T
	Srv *testetcd.Server
	Cli *clientv3.Client
	Dir string

	encs map[string]*encryption.Transformers
}

func New(t *testing.T, opts testetcd.Options) *Cluster {
	t.Helper()
	srv := testetcd.StartT(t, opts)
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &Cluster{T: t, Srv: srv, Cli: cli, Dir: t.TempDir()}
}

// NewOn is New on etcd the test started itself (a cluster of several
// members, testetcd.StartCluster): cli is its client; Srv is nil.
func NewOn(t *testing.T, cli *clientv3.Client) *Cluster {
	t.Helper()
	return &Cluster{T: t, Cli: cli, Dir: t.TempDir()}
}

// EncryptionConfig writes an EncryptionConfiguration for secrets and configmaps
// with the given providers (YAML snippets) and returns its path.
func (c *Cluster) EncryptionConfig(name string, providers ...string) string {
	c.T.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, configmaps]\n  providers:\n")
	for _, p := range providers {
		b.WriteString(p)
	}
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		c.T.Fatal(err)
	}
	return path
}

func AESCBC(name string, key byte) string {
	return fmt.Sprintf("  - aescbc:\n      keys:\n      - name: %s\n        secret: %s\n", name, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{key}, 32)))
}

const Identity = "  - identity: {}\n"

func (c *Cluster) LoadEncryption(path string) *encryption.Transformers {
	c.T.Helper()
	if enc := c.encs[path]; enc != nil {
		return enc
	}
	enc, err := encryption.Load(context.Background(), path)
	if err != nil {
		c.T.Fatal(err)
	}
	c.T.Cleanup(enc.Close)
	if c.encs == nil {
		c.encs = map[string]*encryption.Transformers{}
	}
	c.encs[path] = enc
	return enc
}

// Encode gives obj's value as kube-apiserver configured with (emulated release,
// media type, encryption config encPath) would store it under key.
func (c *Cluster) Encode(key string, gr schema.GroupResource, obj runtime.Object, emulated, media, encPath string) []byte {
	c.T.Helper()
	value, err := runtime.Encode(c.Codec(emulated, media, gr), obj)
	if err != nil {
		c.T.Fatal(err)
	}
	if encPath != "" {
		value, err = c.LoadEncryption(encPath).Encrypt(context.Background(), gr, key, value)
		if err != nil {
			c.T.Fatal(err)
		}
	}
	return value
}

// PutRaw stores value under key as it is.
func (c *Cluster) PutRaw(key string, value []byte, opts ...clientv3.OpOption) int64 {
	c.T.Helper()
	resp, err := c.Cli.Put(context.Background(), key, string(value), opts...)
	if err != nil {
		c.T.Fatal(err)
	}
	return resp.Header.Revision
}

// Put stores obj as kube-apiserver configured with (emulated, media, encryption
// config) would, and returns the key's mod revision.
func (c *Cluster) Put(key string, gr schema.GroupResource, obj runtime.Object, emulated, media, encPath string, opts ...clientv3.OpOption) int64 {
	c.T.Helper()
	return c.PutRaw(key, c.Encode(key, gr, obj, emulated, media, encPath), opts...)
}

func (c *Cluster) Get(key string) (value []byte, modRev, lease int64) {
	c.T.Helper()
	resp, err := c.Cli.Get(context.Background(), key)
	if err != nil {
		c.T.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		c.T.Fatalf("%s: not found", key)
	}
	kv := resp.Kvs[0]
	return kv.Value, kv.ModRevision, kv.Lease
}

// Raw is every key under /registry/ with its stored bytes.
func (c *Cluster) Raw() map[string]string {
	c.T.Helper()
	resp, err := c.Cli.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		c.T.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// RequireBack fails the test unless every key under /registry/ holds what
// before (Raw) held, byte for byte, and no other key is there.
func (c *Cluster) RequireBack(before map[string]string) {
	c.T.Helper()
	after := c.Raw()
	if len(after) != len(before) {
		c.T.Fatalf("%d keys after the rollback, %d before", len(after), len(before))
	}
	for k, v := range before {
		if after[k] != v {
			c.T.Fatalf("%s: not back byte for byte", k)
		}
	}
}

func (c *Cluster) Revision() int64 {
	c.T.Helper()
	resp, err := c.Cli.Get(context.Background(), "nonexistent-probe")
	if err != nil {
		c.T.Fatal(err)
	}
	return resp.Header.Revision
}

func (c *Cluster) Env(cfg pipeline.Config) *pipeline.Env {
	c.T.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = "/registry"
	}
	env, err := pipeline.Setup(context.Background(), c.Cli, cfg)
	if err != nil {
		c.T.Fatal(err)
	}
	c.T.Cleanup(env.Close)
	return env
}

// Stored decodes one key as stored now with env and returns the internal
// object and its mod revision.
func Stored(t *testing.T, env *pipeline.Env, c *Cluster, key string) (runtime.Object, int64) {
	t.Helper()
	value, rev, _ := c.Get(key)
	obj, err := env.Decoder.Decode(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: rev})
	if err != nil {
		t.Fatal(err)
	}
	return obj.Internal, rev
}

// Decision decodes one key with env and decides it.
func Decision(t *testing.T, env *pipeline.Env, c *Cluster, key string) reencode.Decision {
	t.Helper()
	value, rev, lease := c.Get(key)
	return env.DecideOne(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: rev, Lease: lease}, pipeline.Decide)
}

func Secret(ns, name, password string) *api.Secret {
	return &api.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)},
		Type:       api.SecretTypeOpaque,
		Data:       map[string][]byte{"password": []byte(password)},
	}
}

func ConfigMap(ns, name string) *api.ConfigMap {
	return &api.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)},
		Data:       map[string]string{"app.properties": "color=blue\n"},
	}
}

func DeviceClass(name string) *resource.DeviceClass {
	return &resource.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       resource.DeviceClassSpec{Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	}
}

func Event(ns, name string) *api.Event {
	return &api.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)},
		InvolvedObject: api.ObjectReference{Kind: "Pod", Namespace: ns, Name: "web-0"},
		Reason:         "Scheduled",
		Message:        "Successfully assigned",
		Type:           "Normal",
		Count:          1,
	}
}

// SeedMany writes n secrets under the old key and n DeviceClasses as kube-apiserver 1.34 stored
// them, all stale for the new configuration, in multi-key transactions.
func (c *Cluster) SeedMany(n int, oldCfg string) {
	c.T.Helper()
	ctx := context.Background()
	enc := c.LoadEncryption(oldCfg)
	cur := c.Codec("", "", SecretsGR)
	old := c.Codec("1.34", "", DeviceClassGR)
	txn := c.putsInTxns(64)
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("/registry/secrets/ns%d/s-%04d", i%7, i)
		plain, err := runtime.Encode(cur, Secret(fmt.Sprintf("ns%d", i%7), fmt.Sprintf("s-%04d", i), fmt.Sprintf("pw-%d", i)))
		if err != nil {
			c.T.Fatal(err)
		}
		value, err := enc.Encrypt(ctx, SecretsGR, key, plain)
		if err != nil {
			c.T.Fatal(err)
		}
		txn.put(key, value)
		dc, err := runtime.Encode(old, DeviceClass(fmt.Sprintf("dc-%04d", i)))
		if err != nil {
			c.T.Fatal(err)
		}
		txn.put(fmt.Sprintf("/registry/deviceclasses/dc-%04d", i), dc)
	}
	txn.flush()
}

// putsInTxns writes puts to etcd in transactions of up to n.
func (c *Cluster) putsInTxns(n int) *txnPuts { return &txnPuts{c: c, n: n} }

type txnPuts struct {
	c   *Cluster
	n   int
	ops []clientv3.Op
}

// put adds a put, and sends the transaction once it holds n.
func (p *txnPuts) put(key string, value []byte) {
	p.ops = append(p.ops, clientv3.OpPut(key, string(value)))
	if len(p.ops) >= p.n {
		p.flush()
	}
}

// flush sends what is not sent yet.
func (p *txnPuts) flush() {
	p.c.T.Helper()
	if len(p.ops) == 0 {
		return
	}
	if _, err := p.c.Cli.Txn(context.Background()).Then(p.ops...).Commit(); err != nil {
		p.c.T.Fatal(err)
	}
	p.ops = p.ops[:0]
}

// Ballast writes n Secrets of about 48 KiB each in namespace ns (identity
// encoding, the linked release's codec), 16 a transaction, and returns their
// keys. etcd 3.7 answers a scan's RangeStream ahead of what the scan has
// consumed: each chunk is read at the scan's revision with a key limit that
// doubles while chunks stay small, and sent as far ahead as gRPC's
// flow-control windows let it (up to 16 MB each). A test that
// acts on etcd mid-scan (a compaction, a write) needs, after the key where it
// acts, more than the next chunk and those windows hold, or etcd has read the
// whole keyspace at the scan's revision before the test acts: 1,000 keys
// (48 MB) after a few hundred small ones are well past both.
func (c *Cluster) Ballast(ns string, n int) []string {
	c.T.Helper()
	codec := c.Codec("", "", SecretsGR)
	blob := bytes.Repeat([]byte{'b'}, 48<<10)
	keys := make([]string, 0, n)
	txn := c.putsInTxns(16)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ballast-%04d", i)
		s := Secret(ns, name, "")
		s.Data = map[string][]byte{"blob": blob}
		value, err := runtime.Encode(codec, s)
		if err != nil {
			c.T.Fatal(err)
		}
		key := "/registry/secrets/" + ns + "/" + name
		txn.put(key, value)
		keys = append(keys, key)
	}
	txn.flush()
	return keys
}

// Codec is the storage codec of gr as the real kube-apiserver of a release
// ("" = the linked one) with a storage media type ("" = protobuf) writes it.
func (c *Cluster) Codec(emulated, media string, gr schema.GroupResource) runtime.Codec {
	c.T.Helper()
	sc, err := storageConfig(emulated, media)
	if err != nil {
		c.T.Fatal(err)
	}
	rc, err := sc.Codec(gr)
	if err != nil {
		c.T.Fatal(err)
	}
	return rc.Codec
}

var stateDirs sync.Map // test name -> its state directory

// StateDir is the state directory of the tool's runs in test t: made on
// first use under t's temporary directory and the same for every later call
// of t, so that 'runs' and 'rollback --run' find the runs t made before.
func StateDir(t *testing.T) string {
	t.Helper()
	if d, ok := stateDirs.Load(t.Name()); ok {
		return d.(string)
	}
	d := filepath.Join(t.TempDir(), "state")
	stateDirs.Store(t.Name(), d)
	t.Cleanup(func() { stateDirs.Delete(t.Name()) })
	return d
}

// storageConfig is the storage configuration of the real kube-apiserver of
// release ("" = the linked one) with a storage media type ("" = protobuf).
func storageConfig(rel, media string) (*decode.StorageConfig, error) {
	r, err := release.Named(rel)
	if err != nil {
		return nil, err
	}
	return decode.NewStorageConfigFor(decode.StorageOptions{Release: r, MediaType: media})
}
