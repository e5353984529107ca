// Package seed writes a realistic, deterministic, stale Kubernetes cluster into etcd
// through kube-apiserver's own storage codecs and encryption transformers: the
// cluster the demo, tests and benchmark migrate. It owns nothing the tool itself
// uses at run time.
package seed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/release"
)

// Options tune Cluster.
type Options struct {
	// Dir receives the two EncryptionConfiguration files (required).
	Dir string
	// Scale multiplies the team namespaces (4 per unit, about 320 objects at 1).
	// 0 means 1.
	Scale int
	// Prefix is kube-apiserver's --etcd-prefix; "" means /registry.
	Prefix string
}

// Result describes what Cluster wrote.
type Result struct {
	// OldConfig is the EncryptionConfiguration the cluster was written with
	// (secrets: aescbc[key1], identity); NewConfig rotates to key2
	// (secrets: aescbc[key2, key1], identity).
	OldConfig, NewConfig string
	// Objects is the number of keys written under the prefix (compact_rev_key,
	// outside it, is not counted).
	Objects int
	// Counts is the number of keys per resource, keyed by GroupResource.String()
	// ("secrets", "deployments.apps", "widgets.example.com").
	Counts map[string]int
	// SecretKey is the key of one secret encrypted under key1, for inspect.
	SecretKey string
	// Revision is etcd's revision after the last write.
	Revision int64
}

// Stale objects the seed writes on purpose, against the linked kube-apiserver (1.37) with NewConfig:
//   - every secret: aescbc under key1 (the rotation's old key), and one secret that
//     predates encryption (identity);
//   - DeviceClasses written by 1.33 (resource.k8s.io/v1beta1) and 1.34 (v1beta2);
//     1.37 stores v1;
//   - configmaps and deployments of every fourth team namespace in JSON, as an
//     apiserver run with --storage-media-type=application/json wrote them;
//   - widgets.example.com written at v1beta1 before the CRD's storage version moved
//     to v1 (status.storedVersions [v1beta1, v1]).
//
// Everything else is current for 1.37 (protobuf, byte-identical after a decode and
// re-encode) so that the census shows a mix.

var (
	grNamespaces      = schema.GroupResource{Resource: "namespaces"}
	grConfigMaps      = schema.GroupResource{Resource: "configmaps"}
	grSecrets         = schema.GroupResource{Resource: "secrets"}
	grServiceAccounts = schema.GroupResource{Resource: "serviceaccounts"}
	grServices        = schema.GroupResource{Resource: "services"}
	grPods            = schema.GroupResource{Resource: "pods"}
	grEvents          = schema.GroupResource{Resource: "events"}
	grDeployments     = schema.GroupResource{Group: "apps", Resource: "deployments"}
	grReplicaSets     = schema.GroupResource{Group: "apps", Resource: "replicasets"}
	grLeases          = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	grDeviceClasses   = schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}
	// GRWidgets is the custom resource of the seeded CRD widgets.example.com.
	GRWidgets = schema.GroupResource{Group: "example.com", Resource: "widgets"}
)

// EventLeaseTTL is the TTL of the etcd lease events are written with: kube-apiserver's
// --event-ttl default (1h) plus the 60 s it adds (storage/etcd3 leaseManager).
const EventLeaseTTL = 3660

// maxTxnOps stays below etcd's default --max-txn-ops (128); maxTxnBytes well below
// its default --max-request-bytes (1.5 MiB).
const (
	maxTxnOps   = 100
	maxTxnBytes = 1 << 20
)

// baseTime is the creation time of the seeded cluster: fixed, so that the output is
// deterministic, and long past (the liveness check judges by what etcd shows written,
// not by this time, so a seeded apiserver lease, written once, is not alive).
var baseTime = time.Date(2025, 3, 3, 9, 0, 0, 0, time.UTC)

// Cluster writes the stale cluster into etcd through cli and the two encryption
// configurations into opts.Dir. Object names are deterministic; the AES keys are not.
// Keys are created fresh (puts overwrite an earlier seed of the same scale).
func Cluster(ctx context.Context, cli *clientv3.Client, opts Options) (*Result, error) {
	if cli == nil {
		return nil, errors.New("seed: nil etcd client")
	}
	if opts.Dir == "" {
		return nil, errors.New("seed: Options.Dir is required (the encryption configs go there)")
	}
	if opts.Scale <= 0 {
		opts.Scale = 1
	}
	if opts.Prefix == "" {
		opts.Prefix = "/registry"
	}
	oldPath, newPath, err := WriteEncryptionConfigs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	enc, err := encryption.Load(ctx, oldPath)
	if err != nil {
		return nil, fmt.Errorf("seed: load %s: %w", oldPath, err)
	}
	defer enc.Close()

	w := &writer{
		ctx:     ctx,
		cli:     cli,
		prefix:  opts.Prefix,
		enc:     enc,
		configs: map[string]*decode.StorageConfig{},
		counts:  map[string]int{},
	}
	res := &Result{OldConfig: oldPath, NewConfig: newPath, Counts: w.counts}
	if err := w.cluster(opts.Scale, res); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	if err := w.flush(); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	// The apiserver's compactor keeps the last compacted revision in compact_rev_key,
	// at the etcd root, outside the prefix (storage/etcd3/compact.go).
	resp, err := cli.Put(ctx, "compact_rev_key", strconv.FormatInt(w.rev, 10))
	if err != nil {
		return nil, fmt.Errorf("seed: put compact_rev_key: %w", err)
	}
	res.Revision = resp.Header.Revision
	res.Objects = w.objects
	return res, nil
}

// writer encodes objects as kube-apiserver would and puts them in batched txns.
type writer struct {
	ctx     context.Context
	cli     *clientv3.Client
	prefix  string
	enc     *encryption.Transformers
	configs map[string]*decode.StorageConfig

	eventLease clientv3.LeaseID
	eventsOnIt int

	ops      []clientv3.Op
	opsBytes int
	rev      int64
	objects  int
	counts   map[string]int
}

// storage returns the storage config of kube-apiserver release version with media type.
func (w *writer) storage(emulated, media string) (*decode.StorageConfig, error) {
	id := emulated + "|" + media
	if sc, ok := w.configs[id]; ok {
		return sc, nil
	}
	rel, err := release.Named(emulated)
	if err != nil {
		return nil, err
	}
	sc, err := decode.NewStorageConfigFor(decode.StorageOptions{Release: rel, MediaType: media})
	if err != nil {
		return nil, err
	}
	w.configs[id] = sc
	return sc, nil
}

// how an object is written.
type how struct {
	emulated string // --emulated-version of the apiserver that wrote it; "" = the linked one
	// version, when set, overrides the storage version (same media type): what an
	// older release stored where emulation does not reproduce it.
	version   schema.GroupVersion
	media     string // --storage-media-type; "" = protobuf
	plaintext bool   // written before encryption was enabled (identity)
	event     bool   // attach the shared event lease
}

// key returns the etcd key of a built-in object.
func (w *writer) key(gr schema.GroupResource, ns, name string) (string, error) {
	sc, err := w.storage("", "")
	if err != nil {
		return "", err
	}
	k := w.prefix + "/" + sc.ResourcePrefix(gr) + "/"
	if ns != "" {
		k += ns + "/"
	}
	return k + name, nil
}

// builtin encodes obj (an internal object) with the storage codec of gr, as the
// apiserver configured by h would store it, encrypts it with the old configuration
// and queues the put.
func (w *writer) builtin(gr schema.GroupResource, ns, name string, obj runtime.Object, h how) (string, error) {
	key, err := w.key(gr, ns, name)
	if err != nil {
		return "", err
	}
	sc, err := w.storage(h.emulated, h.media)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	rc, err := sc.Codec(gr)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	codec := rc.Codec
	if !h.version.Empty() {
		codec, err = versionCodec(rc, h.version)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key, err)
		}
	}
	value, err := normalize(codec, obj)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	return key, w.put(gr, key, value, h)
}

// versionCodec is rc's storage codec with another storage version: the serializer of
// rc's media type, encoding to gv, decoding (with defaulting) to the internal version,
// as serverstorage.NewStorageCodec builds it.
func versionCodec(rc *decode.ResourceCodec, gv schema.GroupVersion) (runtime.Codec, error) {
	info, ok := runtime.SerializerInfoForMediaType(rc.Codecs.SupportedMediaTypes(), rc.MediaType)
	if !ok {
		return nil, fmt.Errorf("no serializer for %s", rc.MediaType)
	}
	return rc.Codecs.CodecForVersions(info.Serializer, rc.Codecs.UniversalDeserializer(), gv, runtime.InternalGroupVersioner), nil
}

// normalize is what the apiserver stores for obj: its write path defaults the object
// before it reaches storage, so encode, decode (which defaults) and encode again.
func normalize(codec runtime.Codec, obj runtime.Object) ([]byte, error) {
	first, err := runtime.Encode(codec, obj)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	defaulted, err := runtime.Decode(codec, first)
	if err != nil {
		return nil, fmt.Errorf("decode what was encoded: %w", err)
	}
	out, err := runtime.Encode(codec, defaulted)
	if err != nil {
		return nil, fmt.Errorf("encode defaulted object: %w", err)
	}
	return out, nil
}

func (w *writer) put(gr schema.GroupResource, key string, plaintext []byte, h how) error {
	value := plaintext
	if !h.plaintext {
		var err error
		value, err = w.enc.Encrypt(w.ctx, gr, key, plaintext)
		if err != nil {
			return fmt.Errorf("%s: encrypt: %w", key, err)
		}
	}
	var opts []clientv3.OpOption
	if h.event {
		// kube-apiserver shares one lease among up to 1000 events (leaseManager).
		if w.eventLease == 0 || w.eventsOnIt >= 1000 {
			lease, err := w.cli.Grant(w.ctx, EventLeaseTTL)
			if err != nil {
				return fmt.Errorf("%s: grant event lease: %w", key, err)
			}
			w.eventLease, w.eventsOnIt = lease.ID, 0
		}
		w.eventsOnIt++
		opts = append(opts, clientv3.WithLease(w.eventLease))
	}
	if len(w.ops) >= maxTxnOps || w.opsBytes+len(key)+len(value) > maxTxnBytes {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.ops = append(w.ops, clientv3.OpPut(key, string(value), opts...))
	w.opsBytes += len(key) + len(value)
	w.objects++
	w.counts[gr.String()]++
	return nil
}

func (w *writer) flush() error {
	if len(w.ops) == 0 {
		return nil
	}
	resp, err := w.cli.Txn(w.ctx).Then(w.ops...).Commit()
	if err != nil {
		return fmt.Errorf("put %d keys (first %s): %w", len(w.ops), string(w.ops[0].KeyBytes()), err)
	}
	w.rev = resp.Header.Revision
	w.ops, w.opsBytes = w.ops[:0], 0
	return nil
}

// crd stores the CRD object as the apiextensions server does: apiextensions.k8s.io
// v1beta1 JSON (LegacyCodec(v1beta1, v1)).
func (w *writer) crd(crd *apiextensionsv1.CustomResourceDefinition) error {
	sc, err := w.storage("", "")
	if err != nil {
		return err
	}
	rc, err := sc.Codec(decode.CRDGroupResource)
	if err != nil {
		return err
	}
	key := w.prefix + "/" + sc.ResourcePrefix(decode.CRDGroupResource) + "/" + crd.Name
	internal := &apiextensionsinternal.CustomResourceDefinition{}
	if err := decode.ExtensionsScheme.Convert(crd, internal, nil); err != nil {
		return fmt.Errorf("%s: convert to internal: %w", key, err)
	}
	value, err := normalize(rc.Codec, internal)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return w.put(decode.CRDGroupResource, key, value, how{})
}

// customResource stores obj through codec (the CRD as it was when obj was written):
// converted to that CRD's storage version, JSON.
func (w *writer) customResource(codec *customresource.Codec, gr schema.GroupResource, obj customObject) error {
	key := w.prefix + "/" + gr.Group + "/" + gr.Resource + "/" + obj.u.GetNamespace() + "/" + obj.u.GetName()
	first, err := codec.Encode(w.ctx, obj.u)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	// As for built-ins: what is stored is the defaulted, pruned object.
	decoded, _, err := codec.Decode(first)
	if err != nil {
		return fmt.Errorf("%s: decode what was encoded: %w", key, err)
	}
	value, err := codec.Encode(w.ctx, decoded)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return w.put(gr, key, value, how{})
}

// uid is a deterministic UUID-shaped UID for an object.
func uid(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	s := hex.EncodeToString(h.Sum(nil))
	return s[0:8] + "-" + s[8:12] + "-4" + s[13:16] + "-a" + s[17:20] + "-" + s[20:32]
}

// suffix is a deterministic lowercase alphanumeric suffix of n characters, like the
// ones controllers generate.
func suffix(n int, parts ...string) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789" // the rand.String alphabet
	h := sha256.Sum256([]byte(fmt.Sprint(parts)))
	out := make([]byte, n)
	for i := range out {
		out[i] = alphabet[int(h[i])%len(alphabet)]
	}
	return string(out)
}
