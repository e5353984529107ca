package encryption

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"

	"kube-etcd-migrate/internal/textfmt"
)

// Transformers decrypts and encrypts values with the transformers kube-apiserver
// builds from an EncryptionConfiguration file (encryptionconfig.LoadEncryptionConfig),
// with the full etcd key as authenticated data, as kube-apiserver does. With no file
// every resource uses identity. It never logs or returns key material or plaintext
// in errors.
type Transformers struct {
	// Path is the configuration file ("" for identity everywhere).
	Path string

	config       *apiserverconfig.EncryptionConfiguration
	transformers encryptionconfig.StaticTransformers
	cancel       context.CancelFunc

	// encrypted: the write providers (Info.String) that encrypted a value
	// or the preflight's probe in this run.
	encrypted sync.Map
	// byResource: each resource's transformer, readable providers and
	// write provider, found once (forResource).
	byResource sync.Map // schema.GroupResource -> *resourceCrypto
}

// Close stops the KMS plugin connections and probes.
func (e *Transformers) Close() {
	if e != nil && e.cancel != nil {
		e.cancel()
	}
}

func (e *Transformers) transformer(gr schema.GroupResource) value.Transformer {
	return e.forResource(gr).transformer
}

// resourceCrypto is what a resource's values are read and written with,
// found once: the configuration does not change after Load.
type resourceCrypto struct {
	// transformer is made once, as kube-apiserver makes it once for the
	// resource's storage (TransformerForResource wraps the configured one
	// in a new value at each call).
	transformer value.Transformer
	readable    []Info // never changed: its users only read it
	write       Info   // WriteProvider
}

// forResource is gr's resourceCrypto.
func (e *Transformers) forResource(gr schema.GroupResource) *resourceCrypto {
	if c, ok := e.byResource.Load(gr); ok {
		return c.(*resourceCrypto)
	}
	c := &resourceCrypto{readable: e.findReadable(gr), write: Info{Provider: ProviderIdentity}}
	if providers := e.resourceProviders(gr); len(providers) > 0 {
		c.write = providerInfo(providers[0])
	}
	if NeverEncrypted(gr) {
		c.transformer = identity.NewEncryptCheckTransformer()
	} else {
		c.transformer = e.transformers.TransformerForResource(gr)
	}
	actual, _ := e.byResource.LoadOrStore(gr, c)
	return actual.(*resourceCrypto)
}

// The raw-storage objects (masterleases, the service range allocations) are
// never encrypted, whatever the configuration says, even for "*.*":
// kube-apiserver builds their storage from its storage factory's NewConfig
// (pkg/registry/core/rest/storage_core.go, pkg/controlplane/instance.go),
// which carries no transformer (only the REST options getter adds the
// encryption configuration's), so etcd3's storage falls back to the
// identity transformer that refuses encrypted data. The tool reads and
// writes them the same way.

// neverEncrypted are the group/resources of the objects kube-apiserver writes
// outside a resource's REST storage (masterleases, peer server leases, the
// service IP and node port allocations; package decode's raw-storage keys).
var neverEncrypted = map[schema.GroupResource]bool{
	{Resource: "apiServerIPInfo"}:            true,
	{Resource: "apiServerPeerIPInfo"}:        true,
	{Resource: "serviceipallocations"}:       true,
	{Resource: "servicenodeportallocations"}: true,
}

// NeverEncrypted reports whether kube-apiserver stores gr unencrypted whatever
// its encryption configuration says: the raw-storage objects it writes outside
// a resource's REST storage, whose storage carries no encryption transformer
// (its identity transformer refuses encrypted values). Transformers reads and
// writes them the same way.
func NeverEncrypted(gr schema.GroupResource) bool { return neverEncrypted[gr] }

// resourceProviders returns the providers kube-apiserver uses for gr, in the order its
// transformer tries them: those of every entry naming gr exactly (the apiserver
// concatenates entries that repeat a resource), else those of the "*.group" entry,
// else those of the "*.*" entry (transformerFromOverrides). The apiserver rejects
// files where a wildcard masks a later entry, so there is at most one wildcard match.
func (e *Transformers) resourceProviders(gr schema.GroupResource) []apiserverconfig.ProviderConfiguration {
	if NeverEncrypted(gr) {
		return nil // raw storage: identity, see transformer
	}
	for _, want := range []schema.GroupResource{gr, {Group: gr.Group, Resource: "*"}, {Group: "*", Resource: "*"}} {
		var out []apiserverconfig.ProviderConfiguration
		for _, rc := range e.config.Resources {
			for _, r := range rc.Resources {
				if schema.ParseGroupResource(r) == want {
					out = append(out, rc.Providers...)
					break
				}
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// providerInfo gives the provider and the name it writes into its prefix.
func providerInfo(p apiserverconfig.ProviderConfiguration) Info {
	switch {
	case p.AESCBC != nil && len(p.AESCBC.Keys) > 0:
		return Info{Provider: ProviderAESCBC, KeyName: p.AESCBC.Keys[0].Name}
	case p.AESGCM != nil && len(p.AESGCM.Keys) > 0:
		return Info{Provider: ProviderAESGCM, KeyName: p.AESGCM.Keys[0].Name}
	case p.Secretbox != nil && len(p.Secretbox.Keys) > 0:
		return Info{Provider: ProviderSecretbox, KeyName: p.Secretbox.Keys[0].Name}
	case p.KMS != nil && p.KMS.APIVersion == "v2":
		return Info{Provider: ProviderKMSv2, KeyName: p.KMS.Name}
	case p.KMS != nil:
		return Info{Provider: ProviderKMSv1, KeyName: p.KMS.Name}
	}
	return Info{Provider: ProviderIdentity}
}

// readable lists every provider:name the configuration can read for gr.
func (e *Transformers) readable(gr schema.GroupResource) []Info {
	return e.forResource(gr).readable
}

// findReadable is readable, found in the configuration.
func (e *Transformers) findReadable(gr schema.GroupResource) []Info {
	providers := e.resourceProviders(gr)
	if len(providers) == 0 {
		return []Info{{Provider: ProviderIdentity}}
	}
	var out []Info
	for _, p := range providers {
		var keys []apiserverconfig.Key
		switch {
		case p.AESCBC != nil:
			keys = p.AESCBC.Keys
		case p.AESGCM != nil:
			keys = p.AESGCM.Keys
		case p.Secretbox != nil:
			keys = p.Secretbox.Keys
		default:
			out = append(out, providerInfo(p))
			continue
		}
		base := providerInfo(p).Provider
		for _, k := range keys {
			out = append(out, Info{Provider: base, KeyName: k.Name})
		}
	}
	return out
}

// WriteProvider is the provider and key new writes of gr use: the first provider
// (and its first key) of the resource's configuration entry, identity without one.
func (e *Transformers) WriteProvider(gr schema.GroupResource) Info {
	return e.forResource(gr).write
}

// Decrypt reads value (stored under key, of resource gr) the way kube-apiserver
// would with this configuration. It reports the provider and key name from the
// value's prefix and whether the transformer found it stale (not written by the
// first provider and key, or under an old KMS v2 key ID). Errors are *DecryptError
// (undecryptable, or a corrupt envelope) and name the provider and key.
//
// One path, in this order: the provider:key names the configuration reads for gr
// (readable); the value's envelope, its key name resolved against those names
// (readEnvelope, envelope.go); a refusal when the envelope is not one a provider
// writes, names a key the configuration does not have, or cannot hold what its
// provider writes (checkBody); else kube-apiserver's transformer.
func (e *Transformers) Decrypt(ctx context.Context, gr schema.GroupResource, key string, val []byte) ([]byte, Info, error) {
	readable := e.readable(gr)
	info, off := readEnvelope(val, readable)
	switch info.Provider {
	case ProviderUnknown:
		return nil, info, decryptErrorf(key, true, "value starts with %q but with no prefix a kube-apiserver encryption provider writes", EncryptedPrefix)
	case ProviderIdentity:
	default:
		if off < 0 {
			return nil, info, decryptErrorf(key, true, "%s envelope with no key name terminated by ':'", info.Provider)
		}
	}
	if !readsWith(readable, info) {
		return nil, info, decryptErrorf(key, false, "stored as %s, which %s", shown(info), e.describeReadable(gr))
	}
	if info.Provider != ProviderIdentity {
		if err := checkBody(info.Provider, val[off:]); err != nil {
			return nil, info, decryptErrorf(key, true, "%s: %s", shown(info), err)
		}
	}
	out, stale, err := e.transformer(gr).TransformFromStorage(ctx, val, value.DefaultContext(key))
	if err != nil {
		if ctx.Err() != nil {
			return nil, info, ctx.Err()
		}
		if p := e.unanswered(gr, info, "decrypting the value's data key", err); p != nil {
			return nil, info, &DecryptError{Key: key, Detail: shown(info), Plugin: p}
		}
		return nil, info, decryptErrorf(key, false, "%s: %s", shown(info), e.transformError(gr, info, err))
	}
	info.Stale = stale
	return out, info, nil
}

// shown is info for messages: the key name comes from the value itself, so it is
// quoted unless it is short printable ASCII.
func shown(info Info) string {
	if info.KeyName == "" {
		return info.Provider
	}
	return info.Provider + ":" + displayName(info.KeyName)
}

// transformError explains a transformer failure without quoting anything of the
// value: a wrong key, a value moved from another key (authenticated data), or a KMS
// plugin that refused, named with its endpoint.
func (e *Transformers) transformError(gr schema.GroupResource, info Info, err error) string {
	msg := err.Error()
	switch info.Provider {
	case ProviderAESCBC, ProviderAESGCM, ProviderSecretbox:
		return "the configured key of that name does not decrypt it (different key material, or a value copied from another key)"
	case ProviderKMSv1, ProviderKMSv2:
		if strings.Contains(msg, kmsv2NoState) {
			// The apiserver's KMS v2 transformer has no state (no DEK, no key
			// ID) until the plugin has answered a healthy Status: it says only
			// this, for every value, while the plugin is down.
			msg = "the plugin has not answered a healthy status since the tool started (unreachable or unhealthy), so kube-apiserver's KMS v2 transformer cannot decrypt anything with it"
		}
		return e.kmsPluginFor(gr, info) + " could not decrypt it: " + truncate(textfmt.OneLine(msg), 300)
	}
	return msg
}

// kmsv2NoState is what the apiserver's KMS v2 transformer returns for every
// value before its plugin's first healthy Status
// (encryptionconfig.kmsv2PluginProbe.getCurrentState).
const kmsv2NoState = "got unexpected nil transformer"

// kmsPluginFor names the KMS plugin of gr's configuration that info's prefix
// names, with the endpoint dialled.
func (e *Transformers) kmsPluginFor(gr schema.GroupResource, info Info) string {
	if cfg := e.kmsConfigFor(gr, info); cfg != nil {
		return kmsPlugin(info.Provider, cfg.Name, cfg.Endpoint)
	}
	return "KMS plugin"
}

// kmsConfigFor is the KMS provider of gr's configuration that info names
// (nil for none).
func (e *Transformers) kmsConfigFor(gr schema.GroupResource, info Info) *apiserverconfig.KMSConfiguration {
	for _, p := range e.resourceProviders(gr) {
		if p.KMS != nil && p.KMS.Name == info.KeyName && providerInfo(p).Provider == info.Provider {
			return p.KMS
		}
	}
	return nil
}

// unanswered is the KMS plugin of info that did not answer the call err
// failed (no connection, or no answer within the provider's timeout: gRPC's
// Unavailable or DeadlineExceeded, kube-apiserver's client waiting for the
// plugin to be ready until then), nil for any other failure: one the
// plugin answered, or a provider that is not KMS. kube-apiserver's KMS v2
// transformer calls its plugin for each data key it has not decrypted yet
// (one per kube-apiserver start and key ID: the seed) and when it encrypts
// with a data key older than its last healthy status allows.
func (e *Transformers) unanswered(gr schema.GroupResource, info Info, op string, err error) *KMSPluginError {
	if info.Provider != ProviderKMSv1 && info.Provider != ProviderKMSv2 {
		return nil
	}
	cfg := e.kmsConfigFor(gr, info)
	if cfg == nil {
		return nil
	}
	p := &KMSPluginError{Provider: info.Provider, Name: cfg.Name, Endpoint: cfg.Endpoint, Op: op, Err: err}
	if cfg.Timeout != nil {
		p.Timeout = cfg.Timeout.Duration
	}
	if !p.Unreachable() {
		return nil
	}
	return p
}

// CanRead reports whether the configuration has, for gr, the provider and key
// named in a value's prefix (info as Decrypt reports it). An undecryptable value
// it can read was refused by a configured key or KMS plugin (wrong key
// material, a plugin error); one it cannot read is under a key the
// configuration does not have.
func (e *Transformers) CanRead(gr schema.GroupResource, info Info) bool {
	return readsWith(e.readable(gr), info)
}

// readsWith reports whether readable (Transformers.readable) has the provider
// and key info names.
func readsWith(readable []Info, info Info) bool {
	for _, r := range readable {
		if r.Provider == info.Provider && (r.KeyName == info.KeyName || r.Provider == ProviderIdentity) {
			return true
		}
	}
	return false
}

func (e *Transformers) describeReadable(gr schema.GroupResource) string {
	if NeverEncrypted(gr) {
		return fmt.Sprintf("kube-apiserver cannot read: it stores %s unencrypted whatever its encryption configuration says (the raw storage of its leases and service allocators has no encryption transformer), and refuses an encrypted value", gr)
	}
	if e.Path == "" {
		return "needs --encryption-provider-config (none given: only unencrypted values can be read)"
	}
	var names []string
	for _, r := range e.readable(gr) {
		names = append(names, r.String())
	}
	sort.Strings(names)
	return fmt.Sprintf("the configuration for %s cannot read (it has %s)", gr, strings.Join(names, ", "))
}

// wrote says whether the write provider named s encrypted a value (or the
// preflight's probe) in this run.
func (e *Transformers) wrote(s string) bool {
	_, ok := e.encrypted.Load(s)
	return ok
}

// Encrypt transforms plaintext for storage under key with gr's write
// provider. An error is an *EncryptError (the provider, and for a KMS
// provider its plugin and endpoint), or ctx's.
func (e *Transformers) Encrypt(ctx context.Context, gr schema.GroupResource, key string, plain []byte) ([]byte, error) {
	out, err := e.transformer(gr).TransformToStorage(ctx, plain, value.DefaultContext(key))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		w := e.WriteProvider(gr)
		_, worked := e.encrypted.Load(w.String())
		ee := &EncryptError{Key: key, Provider: w, Stopped: worked, Err: err}
		if cfg := e.kmsConfigFor(gr, w); cfg != nil {
			ee.Plugin = &KMSPluginError{Provider: w.Provider, Name: cfg.Name, Endpoint: cfg.Endpoint, Op: "encrypting", Err: err}
			if cfg.Timeout != nil {
				ee.Plugin.Timeout = cfg.Timeout.Duration
			}
		}
		return nil, ee
	}
	if w := e.WriteProvider(gr); w.Provider != ProviderIdentity {
		if s := w.String(); !e.wrote(s) {
			e.encrypted.Store(s, true)
		}
	}
	return out, nil
}
