package encryption

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	apiserverinstall "k8s.io/apiserver/pkg/apis/apiserver/install"
	apiserverconfigv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/envelope"
	envelopekmsv2 "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	kmsservice "k8s.io/kms/pkg/service"
	"kube-etcd-migrate/internal/textfmt"
)

// apiServerID is what the KMS v2 transformer records as the writer of new DEKs.
const apiServerID = "kube-etcd-migrate"

var configCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	apiserverinstall.Install(s)
	return serializer.NewCodecFactory(s)
}()

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

	mu    sync.Mutex
	write map[schema.GroupResource]Info
}

// Load loads an EncryptionConfiguration file in kube-apiserver's format
// (path "" means no encryption: identity for every resource). KMS plugins are dialled
// here; their connections live until Close. A KMS v1 provider in the file turns on
// the deprecated KMSv1 feature gate, as the kube-apiserver that wrote those values
// must have had it.
func Load(ctx context.Context, path string) (*Transformers, error) {
	return LoadWith(ctx, path, Options{})
}

// Options tune LoadWith.
type Options struct {
	// MapKMSEndpoint, when set, gives the endpoint to dial for each KMS provider's
	// endpoint as the file writes it (kube-apiserver's socket path is not always
	// the tool's: see apiserverconfig). Returning it unchanged keeps it; an error
	// stops the load. When an endpoint changes, the configuration is loaded from
	// a private copy with the new endpoints, decoded and re-encoded through the
	// apiserver's own EncryptionConfiguration v1 types (every other field as
	// written): a 0600 file in a 0700 temporary directory, removed as soon as the
	// apiserver's loader has read it.
	MapKMSEndpoint func(endpoint string) (string, error)
}

// LoadWith is Load with options.
func LoadWith(ctx context.Context, path string, opts Options) (*Transformers, error) {
	e := &Transformers{Path: path, write: map[schema.GroupResource]Info{}}
	if path == "" {
		e.config = &apiserverconfig.EncryptionConfiguration{}
		e.transformers = encryptionconfig.StaticTransformers{}
		e.cancel = func() {}
		return e, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	mapped := false
	if opts.MapKMSEndpoint != nil {
		if data, mapped, err = mapKMSEndpoints(path, data, opts.MapKMSEndpoint); err != nil {
			return nil, err
		}
	}
	obj, gvk, err := configCodecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, configError(path, fmt.Errorf("not an EncryptionConfiguration: %s", redactConfigError(err)))
	}
	cfg, ok := obj.(*apiserverconfig.EncryptionConfiguration)
	if !ok {
		return nil, configError(path, fmt.Errorf("got %s, want EncryptionConfiguration", gvk))
	}
	if usesKMSv1(cfg) && !utilfeature.DefaultFeatureGate.Enabled(features.KMSv1) {
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.KMSv1): true}); err != nil {
			return nil, configError(path, fmt.Errorf("enabling the KMSv1 feature gate for its KMS v1 provider: %w", err))
		}
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var loaded *encryptionconfig.EncryptionConfiguration
	if mapped {
		loaded, err = loadPrivateCopy(kctx, path, data)
	} else {
		loaded, err = encryptionconfig.LoadEncryptionConfig(kctx, path, false, apiServerID)
	}
	if err != nil {
		cancel()
		return nil, configError(path, errors.New(redactConfigError(err)))
	}
	e.config = cfg
	e.transformers = encryptionconfig.StaticTransformers(loaded.Transformers)
	e.cancel = cancel
	return e, nil
}

// strictConfigCodecs decode as kube-apiserver's encryptionconfig loader does:
// strictly (an unknown or duplicate field is an error), so that the private
// copy never drops a field kube-apiserver would have refused.
var strictConfigCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	apiserverinstall.Install(s)
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// ConfigError is an encryption configuration file that cannot be loaded as
// kube-apiserver would load it.
type ConfigError struct {
	Path string // "" when Err names it (a file that cannot be read)
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Path == "" {
		return "encryption configuration: " + e.Err.Error()
	}
	return "encryption configuration " + e.Path + ": " + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

func configError(path string, err error) error { return &ConfigError{Path: path, Err: err} }

// mapKMSEndpoints returns data with each KMS provider's endpoint replaced by
// what mapEndpoint gives, and whether any changed (data is returned as it is
// when none did). The file is decoded into the apiserver's
// EncryptionConfiguration v1 type without defaulting or conversion and encoded
// back through the same scheme: resources, providers, their order, key names
// and secrets are kept as written. Errors never quote the file's content.
func mapKMSEndpoints(path string, data []byte, mapEndpoint func(string) (string, error)) ([]byte, bool, error) {
	obj, gvk, err := strictConfigCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, false, configError(path, fmt.Errorf("not an EncryptionConfiguration kube-apiserver would load: %s", redactConfigError(err)))
	}
	cfg, ok := obj.(*apiserverconfigv1.EncryptionConfiguration)
	if !ok {
		return nil, false, configError(path, fmt.Errorf("got %s, want EncryptionConfiguration", gvk))
	}
	changed := false
	for i := range cfg.Resources {
		for j := range cfg.Resources[i].Providers {
			kms := cfg.Resources[i].Providers[j].KMS
			if kms == nil {
				continue
			}
			ep, err := mapEndpoint(kms.Endpoint)
			if err != nil {
				return nil, false, configError(path, fmt.Errorf("kms provider %q: %w", kms.Name, err))
			}
			if ep != kms.Endpoint {
				kms.Endpoint = ep
				changed = true
			}
		}
	}
	if !changed {
		return data, false, nil
	}
	info, ok := runtime.SerializerInfoForMediaType(configCodecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		return nil, false, configError(path, errors.New("no YAML encoder"))
	}
	out, err := runtime.Encode(configCodecs.EncoderForVersion(info.Serializer, apiserverconfigv1.SchemeGroupVersion), cfg)
	if err != nil {
		return nil, false, configError(path, fmt.Errorf("encoding it with the mapped KMS endpoints: %w", err))
	}
	return out, true, nil
}

// Private copies of encryption configurations being loaded, removed by
// RemoveTempDirs when the process must exit at once.
var (
	tempMu   sync.Mutex
	tempDirs = map[string]bool{}
	exiting  bool // RemoveTempDirs ran: no new copy is made
)

// RemoveTempDirs removes the private copies of encryption configurations
// still on disk (each is removed as soon as it is loaded; this is for a
// process about to exit without running its deferred calls, a second SIGINT).
func RemoveTempDirs() {
	tempMu.Lock()
	defer tempMu.Unlock()
	exiting = true
	for d := range tempDirs {
		_ = os.RemoveAll(d)
		delete(tempDirs, d)
	}
}

// privateCopyHook, set by tests, sees each private copy before it is loaded.
var privateCopyHook func(file string)

// loadPrivateCopy loads data, the configuration of the file path with mapped
// KMS endpoints, through the apiserver's loader (which only reads a file): it
// holds the secrets of every provider, so it is written to a file only its
// owner can read, in a directory only its owner can enter, and removed before
// returning. Errors name path, never the copy.
func loadPrivateCopy(ctx context.Context, path string, data []byte) (*encryptionconfig.EncryptionConfiguration, error) {
	tempMu.Lock()
	if exiting {
		tempMu.Unlock()
		return nil, errors.New("interrupted")
	}
	dir, err := os.MkdirTemp("", "kube-etcd-migrate-encryption-") // 0700
	if err != nil {
		tempMu.Unlock()
		return nil, fmt.Errorf("private copy with the mapped KMS endpoints: %w", err)
	}
	tempDirs[dir] = true
	tempMu.Unlock()
	defer func() {
		tempMu.Lock()
		defer tempMu.Unlock()
		_ = os.RemoveAll(dir)
		delete(tempDirs, dir)
	}()
	copyPath := filepath.Join(dir, "encryption-config.yaml")
	if err := writePrivate(copyPath, data); err != nil {
		return nil, fmt.Errorf("private copy with the mapped KMS endpoints: %w", err)
	}
	if privateCopyHook != nil {
		privateCopyHook(copyPath)
	}
	loaded, err := encryptionconfig.LoadEncryptionConfig(ctx, copyPath, false, apiServerID)
	if err != nil {
		return nil, errors.New(strings.ReplaceAll(err.Error(), copyPath, path+" (with the mapped KMS endpoints)"))
	}
	return loaded, nil
}

// writePrivate creates file (it must not exist) readable by its owner only.
func writePrivate(file string, data []byte) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
func (e *Transformers) Close() {
	if e != nil && e.cancel != nil {
		e.cancel()
	}
}

func (e *Transformers) transformer(gr schema.GroupResource) value.Transformer {
	if NeverEncrypted(gr) {
		return identity.NewEncryptCheckTransformer()
	}
	return e.transformers.TransformerForResource(gr)
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
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.write[gr]; ok {
		return w
	}
	w := Info{Provider: ProviderIdentity}
	if providers := e.resourceProviders(gr); len(providers) > 0 {
		w = providerInfo(providers[0])
	}
	e.write[gr] = w
	return w
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
	for _, p := range e.resourceProviders(gr) {
		if p.KMS != nil && p.KMS.Name == info.KeyName && providerInfo(p).Provider == info.Provider {
			return kmsPlugin(info.Provider, p.KMS.Name, p.KMS.Endpoint)
		}
	}
	return "KMS plugin"
}

// kmsPlugin is how messages name a KMS plugin: KMS v2 plugin "vault" at unix:///... .
func kmsPlugin(provider, name, endpoint string) string {
	v := "v2"
	if provider == ProviderKMSv1 {
		v = "v1"
	}
	return fmt.Sprintf("KMS %s plugin %q at %s", v, name, endpoint)
}

// oneLine keeps a message from a plugin or gRPC to one line of at most n bytes.

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

// Encrypt transforms plaintext for storage under key with gr's write provider.
func (e *Transformers) Encrypt(ctx context.Context, gr schema.GroupResource, key string, plain []byte) ([]byte, error) {
	out, err := e.transformer(gr).TransformToStorage(ctx, plain, value.DefaultContext(key))
	if err != nil {
		return nil, fmt.Errorf("%s: encrypt with %s: %w", key, e.WriteProvider(gr), err)
	}
	return out, nil
}

// Preflight checks that each resource's write provider works before anything is
// written: it encrypts a probe value under a key that is never stored and reads it
// back, and for a KMS provider it also asks the plugin itself (KMS v2: Status must
// be healthy with a key ID, then a wrap/unwrap; KMS v1: a wrap/unwrap, as
// kube-apiserver's healthz does). The transformer alone is not enough: a KMS v2
// transformer keeps writing with its cached DEK for minutes after the plugin went
// down or unhealthy. Errors name the provider and the resources it is written for.
func (e *Transformers) Preflight(ctx context.Context, grs []schema.GroupResource) error {
	type target struct {
		gr       schema.GroupResource
		provider apiserverconfig.ProviderConfiguration
		grs      []string
	}
	var order []string
	targets := map[string]*target{}
	for _, gr := range grs {
		w := e.WriteProvider(gr)
		if w.Provider == ProviderIdentity {
			continue
		}
		t := targets[w.String()]
		if t == nil {
			t = &target{gr: gr, provider: e.resourceProviders(gr)[0]}
			targets[w.String()] = t
			order = append(order, w.String())
		}
		t.grs = append(t.grs, gr.String())
	}
	var errs []error
	probe := []byte("kube-etcd-migrate preflight")
	for _, name := range order {
		t := targets[name]
		var err error
		if t.provider.KMS != nil {
			err = probeKMS(ctx, t.provider.KMS)
		}
		if err == nil {
			key := "/kube-etcd-migrate/preflight/" + t.gr.String()
			var ct []byte
			ct, err = e.transformer(t.gr).TransformToStorage(ctx, probe, value.DefaultContext(key))
			if err == nil {
				var pt []byte
				pt, _, err = e.transformer(t.gr).TransformFromStorage(ctx, ct, value.DefaultContext(key))
				if err == nil && !bytes.Equal(pt, probe) {
					err = errors.New("probe value did not read back")
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("write provider %s for %s does not work: %w", name, strings.Join(t.grs, ", "), err))
		}
	}
	return errors.Join(errs...)
}

// KMSPluginError is a KMS plugin of the configuration that does not work, as
// probeKMS found: unreachable, or answering unhealthy or with an error.
type KMSPluginError struct {
	Provider string // ProviderKMSv2 or ProviderKMSv1
	Name     string // the provider's name in the configuration
	Endpoint string // the endpoint dialled (after any mapping)
	Err      error
}

func (e *KMSPluginError) Error() string {
	return kmsPlugin(e.Provider, e.Name, e.Endpoint) + ": " + truncate(textfmt.OneLine(e.Err.Error()), 300)
}

func (e *KMSPluginError) Unwrap() error { return e.Err }

// Unreachable reports whether the plugin did not answer at all (no socket, no
// server, or no answer within the provider's timeout), as opposed to answering
// unhealthy or with an error.
func (e *KMSPluginError) Unreachable() bool {
	switch status.Code(e.Err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(e.Err, context.DeadlineExceeded)
}

// ReadWarning is the one line for an operator of a read-only run: which plugin,
// where, what it said, and that nothing it encrypted can be read.
func (e *KMSPluginError) ReadWarning() string {
	state := "does not work"
	if e.Unreachable() {
		state = "is unreachable"
	}
	return fmt.Sprintf("%s %s (%s): nothing it encrypted can be decrypted, those objects are reported undecryptable", kmsPlugin(e.Provider, e.Name, e.Endpoint), state, truncate(textfmt.OneLine(e.Err.Error()), 300))
}

// CheckKMSPlugins asks every KMS plugin that the providers of grs read with
// (grs nil: of every resource in the configuration) whether it works, as
// Preflight asks the write provider's (probeKMS: KMS v2 Status, then a
// wrap/unwrap; KMS v1 a wrap/unwrap), each plugin once, at the same time,
// on connections of their own. kube-apiserver's KMS v2 transformer has
// nothing to decrypt with until its plugin has answered a healthy Status,
// and then fails each value with a message that names no plugin: this names
// it once. The result is in configuration order, nil when all work.
func (e *Transformers) CheckKMSPlugins(ctx context.Context, grs []schema.GroupResource) []*KMSPluginError {
	var providers []apiserverconfig.ProviderConfiguration
	if grs == nil {
		for _, rc := range e.config.Resources {
			providers = append(providers, rc.Providers...)
		}
	} else {
		for _, gr := range grs {
			providers = append(providers, e.resourceProviders(gr)...)
		}
	}
	var plugins []*apiserverconfig.KMSConfiguration
	seen := map[string]bool{}
	for _, p := range providers {
		if p.KMS == nil {
			continue
		}
		id := p.KMS.APIVersion + "\x00" + p.KMS.Name + "\x00" + p.KMS.Endpoint
		if !seen[id] {
			seen[id] = true
			plugins = append(plugins, p.KMS)
		}
	}
	errs := make([]error, len(plugins))
	var wg sync.WaitGroup
	for i, cfg := range plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = probeKMS(ctx, cfg)
		}()
	}
	wg.Wait()
	var out []*KMSPluginError
	for _, err := range errs {
		var perr *KMSPluginError
		if errors.As(err, &perr) {
			out = append(out, perr)
		}
	}
	return out
}

// probeKMS asks a KMS plugin directly whether it works, on a connection of its
// own; a failure is a *KMSPluginError.
func probeKMS(ctx context.Context, cfg *apiserverconfig.KMSConfiguration) error {
	if err := askKMS(ctx, cfg); err != nil {
		return &KMSPluginError{Provider: providerInfo(apiserverconfig.ProviderConfiguration{KMS: cfg}).Provider, Name: cfg.Name, Endpoint: cfg.Endpoint, Err: err}
	}
	return nil
}

// askKMS is probeKMS's conversation with the plugin.
func askKMS(ctx context.Context, cfg *apiserverconfig.KMSConfiguration) error {
	timeout := 3 * time.Second
	if cfg.Timeout != nil && cfg.Timeout.Duration > 0 {
		timeout = cfg.Timeout.Duration
	}
	pctx, cancel := context.WithCancel(ctx) // closes the connection
	defer cancel()
	dek := []byte("kube-etcd-migrate-preflight-dek!")
	if cfg.APIVersion != "v2" {
		svc, err := envelope.NewGRPCService(pctx, cfg.Endpoint, timeout)
		if err != nil {
			return err
		}
		ct, err := svc.Encrypt(dek)
		if err != nil {
			return fmt.Errorf("encrypt: %w", err)
		}
		pt, err := svc.Decrypt(ct)
		if err != nil {
			return fmt.Errorf("decrypt: %w", err)
		}
		if !bytes.Equal(pt, dek) {
			return errors.New("decrypt did not return what was encrypted")
		}
		return nil
	}
	svc, err := envelopekmsv2.NewGRPCService(pctx, cfg.Endpoint, cfg.Name, timeout)
	if err != nil {
		return err
	}
	st, err := svc.Status(pctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if st.Healthz != "ok" {
		return fmt.Errorf("status is %q, not ok", truncate(st.Healthz, 200))
	}
	if st.Version != envelopekmsv2.KMSAPIVersionv2 && st.Version != envelopekmsv2.KMSAPIVersionv2beta1 {
		return fmt.Errorf("API version %q, want %s", truncate(st.Version, 50), envelopekmsv2.KMSAPIVersionv2)
	}
	if _, err := envelopekmsv2.ValidateKeyID(st.KeyID); err != nil {
		return fmt.Errorf("status key ID: %w", err)
	}
	uid := "kube-etcd-migrate-preflight"
	enc, err := svc.Encrypt(pctx, uid, dek)
	if err != nil {
		return fmt.Errorf("encrypt: %w", err)
	}
	pt, err := svc.Decrypt(pctx, uid, &kmsservice.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: enc.KeyID, Annotations: enc.Annotations})
	if err != nil {
		return fmt.Errorf("decrypt: %w", err)
	}
	if !bytes.Equal(pt, dek) {
		return errors.New("decrypt did not return what was encrypted")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
