package decode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	apiserverinstall "k8s.io/apiserver/pkg/apis/apiserver/install"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// apiServerID is what the KMS v2 transformer records as the writer of new DEKs.
const apiServerID = "kube-etcd-migrate"

var configCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	apiserverinstall.Install(s)
	return serializer.NewCodecFactory(s)
}()

// Encryption decrypts and encrypts values with the transformers kube-apiserver
// builds from an EncryptionConfiguration file (encryptionconfig.LoadEncryptionConfig),
// with the full etcd key as authenticated data, as kube-apiserver does. With no file
// every resource uses identity. It never logs or returns key material or plaintext
// in errors.
type Encryption struct {
	// Path is the configuration file ("" for identity everywhere).
	Path string

	config       *apiserverconfig.EncryptionConfiguration
	transformers encryptionconfig.StaticTransformers
	cancel       context.CancelFunc

	mu    sync.Mutex
	write map[schema.GroupResource]EncryptionInfo
}

// LoadEncryption loads an EncryptionConfiguration file in kube-apiserver's format
// (path "" means no encryption: identity for every resource). KMS plugins are dialled
// here; their connections live until Close. A KMS v1 provider in the file turns on
// the deprecated KMSv1 feature gate, as the kube-apiserver that wrote those values
// must have had it.
func LoadEncryption(ctx context.Context, path string) (*Encryption, error) {
	e := &Encryption{Path: path, write: map[schema.GroupResource]EncryptionInfo{}}
	if path == "" {
		e.config = &apiserverconfig.EncryptionConfiguration{}
		e.transformers = encryptionconfig.StaticTransformers{}
		e.cancel = func() {}
		return e, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config: %w", err)
	}
	obj, gvk, err := configCodecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("--encryption-provider-config %s: not an EncryptionConfiguration: %s", path, redactConfigError(err))
	}
	cfg, ok := obj.(*apiserverconfig.EncryptionConfiguration)
	if !ok {
		return nil, fmt.Errorf("--encryption-provider-config %s: got %s, want EncryptionConfiguration", path, gvk)
	}
	if usesKMSv1(cfg) && !utilfeature.DefaultFeatureGate.Enabled(features.KMSv1) {
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.KMSv1): true}); err != nil {
			return nil, fmt.Errorf("--encryption-provider-config %s: enabling the KMSv1 feature gate for its KMS v1 provider: %w", path, err)
		}
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	loaded, err := encryptionconfig.LoadEncryptionConfig(kctx, path, false, apiServerID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--encryption-provider-config %s: %s", path, redactConfigError(err))
	}
	e.config = cfg
	e.transformers = encryptionconfig.StaticTransformers(loaded.Transformers)
	e.cancel = cancel
	return e, nil
}

// redactConfigError keeps configuration errors short; the apiserver's validation
// messages name fields, never secret values, but a decode error could quote input.
func redactConfigError(err error) string {
	msg := err.Error()
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return msg
}

func usesKMSv1(cfg *apiserverconfig.EncryptionConfiguration) bool {
	for _, r := range cfg.Resources {
		for _, p := range r.Providers {
			if p.KMS != nil && p.KMS.APIVersion != "v2" {
				return true
			}
		}
	}
	return false
}

// Close stops the KMS plugin connections and probes.
func (e *Encryption) Close() {
	if e != nil && e.cancel != nil {
		e.cancel()
	}
}

func (e *Encryption) transformer(gr schema.GroupResource) value.Transformer {
	return e.transformers.TransformerForResource(gr)
}

// resourceConfig returns the configuration entry kube-apiserver uses for gr: the
// first that names it exactly, by "*.group" or by "*.*" (the apiserver rejects files
// where a wildcard masks a later exact entry, so file order decides).
func (e *Encryption) resourceConfig(gr schema.GroupResource) *apiserverconfig.ResourceConfiguration {
	for i := range e.config.Resources {
		rc := &e.config.Resources[i]
		for _, r := range rc.Resources {
			g := schema.ParseGroupResource(r)
			if g == gr || (g.Resource == "*" && (g.Group == gr.Group || g.Group == "*")) {
				return rc
			}
		}
	}
	return nil
}

// providerInfo gives the provider and the name it writes into its prefix.
func providerInfo(p apiserverconfig.ProviderConfiguration) EncryptionInfo {
	switch {
	case p.AESCBC != nil && len(p.AESCBC.Keys) > 0:
		return EncryptionInfo{Provider: ProviderAESCBC, KeyName: p.AESCBC.Keys[0].Name}
	case p.AESGCM != nil && len(p.AESGCM.Keys) > 0:
		return EncryptionInfo{Provider: ProviderAESGCM, KeyName: p.AESGCM.Keys[0].Name}
	case p.Secretbox != nil && len(p.Secretbox.Keys) > 0:
		return EncryptionInfo{Provider: ProviderSecretbox, KeyName: p.Secretbox.Keys[0].Name}
	case p.KMS != nil && p.KMS.APIVersion == "v2":
		return EncryptionInfo{Provider: ProviderKMSv2, KeyName: p.KMS.Name}
	case p.KMS != nil:
		return EncryptionInfo{Provider: ProviderKMSv1, KeyName: p.KMS.Name}
	}
	return EncryptionInfo{Provider: ProviderIdentity}
}

// readable lists every provider:name the configuration can read for gr.
func (e *Encryption) readable(gr schema.GroupResource) []EncryptionInfo {
	rc := e.resourceConfig(gr)
	if rc == nil {
		return []EncryptionInfo{{Provider: ProviderIdentity}}
	}
	var out []EncryptionInfo
	for _, p := range rc.Providers {
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
			out = append(out, EncryptionInfo{Provider: base, KeyName: k.Name})
		}
	}
	return out
}

// WriteProvider is the provider and key new writes of gr use: the first provider
// (and its first key) of the resource's configuration entry, identity without one.
func (e *Encryption) WriteProvider(gr schema.GroupResource) EncryptionInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.write[gr]; ok {
		return w
	}
	w := EncryptionInfo{Provider: ProviderIdentity}
	if rc := e.resourceConfig(gr); rc != nil && len(rc.Providers) > 0 {
		w = providerInfo(rc.Providers[0])
	}
	e.write[gr] = w
	return w
}

// envelopeOf reads the provider and name from value's prefix, resolving names that
// contain ':' against the names configured for gr.
func (e *Encryption) envelopeOf(gr schema.GroupResource, value []byte) (EncryptionInfo, int) {
	info, off := splitEnvelope(value)
	if info.Provider == ProviderIdentity || info.Provider == ProviderUnknown {
		return info, off
	}
	pfx := providerPrefix(info.Provider)
	best := -1
	for _, r := range e.readable(gr) {
		if r.Provider != info.Provider {
			continue
		}
		full := pfx + r.KeyName + ":"
		if bytes.HasPrefix(value, []byte(full)) && len(full) > best {
			info.KeyName, best = r.KeyName, len(full)
		}
	}
	if best > 0 {
		off = best
	}
	return info, off
}

// Decrypt reads value (stored under key, of resource gr) the way kube-apiserver
// would with this configuration. It reports the provider and key name from the
// value's prefix and whether the transformer found it stale (not written by the
// first provider and key, or under an old KMS v2 key ID). Errors are *Error with
// reason undecryptable or corrupt-envelope and name the provider and key.
func (e *Encryption) Decrypt(ctx context.Context, gr schema.GroupResource, key string, val []byte) ([]byte, EncryptionInfo, error) {
	info, off := e.envelopeOf(gr, val)
	switch info.Provider {
	case ProviderUnknown:
		return nil, info, Errorf(key, ReasonCorruptEnvelope, nil, "value starts with %q but with no prefix a kube-apiserver encryption provider writes", encryptedPrefix)
	case ProviderIdentity:
	default:
		if off < 0 {
			return nil, info, Errorf(key, ReasonCorruptEnvelope, nil, "%s envelope with no key name terminated by ':'", info.Provider)
		}
	}
	if !e.canRead(gr, info) {
		return nil, info, Errorf(key, ReasonUndecryptable, nil, "stored as %s, which %s", info, e.describeReadable(gr))
	}
	if info.Provider != ProviderIdentity {
		if err := checkBody(info.Provider, val[off:]); err != nil {
			return nil, info, Errorf(key, ReasonCorruptEnvelope, nil, "%s: %s", info, err)
		}
	}
	out, stale, err := e.transformer(gr).TransformFromStorage(ctx, val, value.DefaultContext(key))
	if err != nil {
		if ctx.Err() != nil {
			return nil, info, ctx.Err()
		}
		return nil, info, Errorf(key, ReasonUndecryptable, nil, "%s: %s", info, transformError(info, err))
	}
	info.Stale = stale
	return out, info, nil
}

// transformError explains a transformer failure without quoting anything of the
// value: a wrong key, a value moved from another key (authenticated data), or a KMS
// plugin that refused.
func transformError(info EncryptionInfo, err error) string {
	msg := err.Error()
	switch info.Provider {
	case ProviderAESCBC, ProviderAESGCM, ProviderSecretbox:
		return "the configured key of that name does not decrypt it (different key material, or a value copied from another key)"
	case ProviderKMSv1, ProviderKMSv2:
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		return "KMS plugin could not decrypt it: " + msg
	}
	return msg
}

func (e *Encryption) canRead(gr schema.GroupResource, info EncryptionInfo) bool {
	for _, r := range e.readable(gr) {
		if r.Provider == info.Provider && (r.KeyName == info.KeyName || r.Provider == ProviderIdentity) {
			return true
		}
	}
	return false
}

func (e *Encryption) describeReadable(gr schema.GroupResource) string {
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

// Encrypt transforms plaintext for storage under key with gr's write provider.
func (e *Encryption) Encrypt(ctx context.Context, gr schema.GroupResource, key string, plain []byte) ([]byte, error) {
	out, err := e.transformer(gr).TransformToStorage(ctx, plain, value.DefaultContext(key))
	if err != nil {
		return nil, fmt.Errorf("%s: encrypt with %s: %w", key, e.WriteProvider(gr), err)
	}
	return out, nil
}

// Preflight checks that each resource's write provider works before anything is
// written: it encrypts a probe value under a key that is never stored and reads it
// back (a KMS plugin that is down or refuses fails here, naming the resource).
func (e *Encryption) Preflight(ctx context.Context, grs []schema.GroupResource) error {
	seen := map[string]bool{}
	var errs []error
	probe := []byte("kube-etcd-migrate preflight")
	for _, gr := range grs {
		w := e.WriteProvider(gr)
		if w.Provider == ProviderIdentity || seen[w.String()] {
			continue
		}
		seen[w.String()] = true
		key := "/kube-etcd-migrate/preflight/" + gr.String()
		ct, err := e.transformer(gr).TransformToStorage(ctx, probe, value.DefaultContext(key))
		if err == nil {
			var pt []byte
			pt, _, err = e.transformer(gr).TransformFromStorage(ctx, ct, value.DefaultContext(key))
			if err == nil && !bytes.Equal(pt, probe) {
				err = errors.New("probe value did not read back")
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("write provider %s for %s does not work: %w", w, gr, err))
		}
	}
	return errors.Join(errs...)
}
