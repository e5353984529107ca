// Package apiserverconfig reads the configuration of the cluster's own
// kube-apiserver: its command line, taken from its static-pod manifest (as
// kubeadm writes /etc/kubernetes/manifests/kube-apiserver.yaml), from a flags
// file (a command line or one flag per line, as in a systemd unit) or from the
// tool's own --runtime-config and --feature-gates. The command line is parsed by
// the linked kube-apiserver's own flag set (cmd/kube-apiserver/app/options), so every
// flag it accepts is accepted and every value it rejects is an error naming the
// flag. From it come what decides what is stored and where: the etcd
// connection, --etcd-prefix, --encryption-provider-config, --storage-media-type,
// --emulated-version, the API enablement (--runtime-config merged by the
// apiserver's own resourceconfig code) and the feature gates, which Apply sets
// process-wide exactly as kube-apiserver does at start-up. Paths in a manifest
// are container paths and are mapped to host paths through the pod's hostPath
// volumes, as the kubelet mounts them; so are the KMS plugin sockets named in
// the manifest's encryption configuration (KMSEndpointMapper).
package apiserverconfig

import (
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mattn/go-shellwords"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	genericapiserver "k8s.io/apiserver/pkg/server"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	kmsutil "k8s.io/kms/pkg/util"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/controlplane"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
	"kube-etcd-migrate/internal/textfmt"
)

func init() {
	// kube-apiserver's gate also has the logging gates (LoggingAlphaOptions,
	// LoggingBetaOptions, ...): cmd/kube-apiserver/app registers them at init,
	// and a command line that sets one must parse here too.
	utilruntime.Must(logsapi.AddFeatureGates(utilfeature.DefaultMutableFeatureGate))
}

// Source names where a setting came from, for the one line the commands print.
type Source string

const (
	FromDefault  Source = "default"
	FromManifest Source = "manifest"
	FromFlags    Source = "flags-file"
	FromTool     Source = "command line"
	// FromImage: the release, from the manifest container's image tag.
	FromImage Source = "manifest image"
	// FromKubeadm: the release, from kubeadm's ClusterConfiguration in etcd.
	FromKubeadm Source = "kubeadm-config in etcd"
)

// Config is what the tool takes from kube-apiserver's command line. Paths are
// host paths.
type Config struct {
	EtcdServers      []string
	EtcdCAFile       string
	EtcdCertFile     string
	EtcdKeyFile      string
	EtcdPrefix       string
	EncryptionConfig string
	StorageMediaType string
	// EmulatedVersion is the file's --emulated-version ("" = none: the
	// release's own), for reports; Release has it as a version.
	EmulatedVersion string
	// Image is the manifest container's image, "" without a manifest.
	Image string
	// Contradiction says how the manifest's image contradicts the tool's
	// target release (which wins), nil when it does not: migrate refuses to
	// write, a read-only command warns (a check before an upgrade).
	Contradiction error
	// RuntimeConfig and FeatureGates are the raw flag values, for reports.
	RuntimeConfig string
	FeatureGates  string
	// From records where each of the settings above came from, by flag name.
	From map[string]Source
	// File is the manifest or flags file read, "" when none.
	File string
	// Manifest is File when it is a static-pod manifest (--apiserver-manifest).
	Manifest string

	// release is what the command line says of the release (Release).
	release  release.Release
	opts     *options.ServerRunOptions
	registry basecompatibility.ComponentGlobalsRegistry
	// mounts are the manifest's hostPath mounts (nil without a manifest).
	mounts *hostMounts
	// kmsMapped lists the KMS endpoints mapped to host paths, for Describe.
	kmsMapped []mappedEndpoint
	// applied are the gates Apply set on the process's gate.
	applied []string
}

type mappedEndpoint struct{ container, host string }

// Input is what the operator gave.
type Input struct {
	// Manifest is --apiserver-manifest, FlagsFile --apiserver-flags-file (at most one).
	Manifest  string
	FlagsFile string
	// Container names the manifest's container ("" = the one named kube-apiserver,
	// or the only one).
	Container string
	// RuntimeConfig and FeatureGates are the tool's own --runtime-config and
	// --feature-gates, applied after the file's (as kube-apiserver applies a
	// repeated flag: key by key, the later wins).
	RuntimeConfig []string
	FeatureGates  []string
	// TargetVersion is the tool's --target-version (release.ParseTarget): the
	// release of the cluster's kube-apiserver (the file's image must agree);
	// nil = not given.
	TargetVersion *version.Version
}

// Load parses kube-apiserver's command line from in and returns what the tool
// takes from it. Nothing process-wide changes until Apply.
func Load(in Input) (*Config, error) {
	if in.Manifest != "" && in.FlagsFile != "" {
		return nil, input.Errorf("%s and %s: give one of them", input.APIServerManifest, input.APIServerFlagsFile)
	}
	var args []string
	var mounts *hostMounts
	cfg := &Config{}
	switch {
	case in.Manifest != "":
		var err error
		args, mounts, cfg.Image, err = readManifest(in.Manifest, in.Container)
		if err != nil {
			return nil, err
		}
		cfg.File, cfg.Manifest = in.Manifest, in.Manifest
	case in.FlagsFile != "":
		var err error
		args, err = readFlagsFile(in.FlagsFile)
		if err != nil {
			return nil, err
		}
		cfg.File = in.FlagsFile
	}
	fileSource := FromManifest
	if in.FlagsFile != "" {
		fileSource = FromFlags
	}

	// The release decides the dependencies among the feature gates that
	// --feature-gates is checked against (releaseFeatureGate): a first parse
	// finds it, and an older release's command line is parsed again with
	// its gate.
	name := cfg.File
	p, err := parseCommandLine(args, in, name, fileSource, utilfeature.DefaultMutableFeatureGate.DeepCopy())
	if err != nil {
		return nil, err
	}
	rel, releaseFrom, contradiction, err := targetRelease(in.TargetVersion, cfg.Image, p.emulated, name)
	if err != nil {
		return nil, err
	}
	if rel != nil {
		if cfg.release, err = p.releaseOf(rel); err != nil {
			if releaseFrom == FromImage {
				return nil, fmt.Errorf("%s: kube-apiserver image %s: %w", name, cfg.Image, err)
			}
			return nil, err
		}
		gate, own, err := releaseFeatureGate(cfg.release)
		if err != nil {
			return nil, err
		}
		if own {
			if p, err = parseCommandLine(args, in, name, fileSource, gate); err != nil {
				return nil, err
			}
		}
		if err := p.emulate(cfg.release, releaseFrom); err != nil {
			return nil, err
		}
	}
	opts, reg, fs, from := p.opts, p.reg, p.fs, p.from
	cfg.From = from
	// The private registry takes --emulated-version and --feature-gates as
	// kube-apiserver's does (emulation first, then gates) and so rejects what
	// kube-apiserver would reject; nothing process-wide changes here.
	if err := reg.Set(); err != nil {
		return nil, fmt.Errorf("%s: --feature-gates/--emulated-version: %w", orDefault(name, "kube-apiserver flags"), err)
	}
	if err := validate(opts, name); err != nil {
		return nil, err
	}
	if len(opts.Etcd.EtcdServersOverrides) > 0 {
		return nil, input.Errorf("%s: --etcd-servers-overrides %s: resources kept in another etcd are not supported; run the tool once per etcd with %s", name, strings.Join(opts.Etcd.EtcdServersOverrides, ","), input.Resource)
	}
	if rel == nil {
		// Nothing names the release: the linked one, emulating what the
		// command line says.
		if cfg.release, err = release.New(nil, p.emulated); err != nil {
			return nil, err
		}
	}

	sc := opts.Etcd.StorageConfig
	cfg.EtcdServers = sc.Transport.ServerList
	cfg.EtcdCAFile = sc.Transport.TrustedCAFile
	cfg.EtcdCertFile = sc.Transport.CertFile
	cfg.EtcdKeyFile = sc.Transport.KeyFile
	cfg.EtcdPrefix = sc.Prefix
	cfg.EncryptionConfig = opts.Etcd.EncryptionProviderConfigFilepath
	cfg.StorageMediaType = opts.Etcd.DefaultStorageMediaType
	cfg.RuntimeConfig = fs.Lookup("runtime-config").Value.String()
	cfg.FeatureGates = stripKubePrefix(fs.Lookup("feature-gates").Value.String())
	if v := cfg.release.Emulated(); v != nil {
		cfg.EmulatedVersion = v.String()
	}
	cfg.Contradiction = contradiction
	if mounts != nil {
		for flag, p := range map[string]*string{"etcd-cafile": &cfg.EtcdCAFile, "etcd-certfile": &cfg.EtcdCertFile, "etcd-keyfile": &cfg.EtcdKeyFile, "encryption-provider-config": &cfg.EncryptionConfig} {
			if *p == "" {
				continue
			}
			host, err := mounts.hostPath(*p)
			if err != nil {
				return nil, fmt.Errorf("%s: --%s %s: %w", name, flag, *p, err)
			}
			*p = host
		}
	}
	cfg.opts = opts
	cfg.registry = reg
	cfg.mounts = mounts
	return cfg, nil
}

// parsed is a command line parsed by kube-apiserver's own flag set.
type parsed struct {
	opts *options.ServerRunOptions
	reg  basecompatibility.ComponentGlobalsRegistry
	fs   *pflag.FlagSet
	from map[string]Source
	// emulated is its --emulated-version (emulatedVersion), nil when none;
	// badEmulated the value when kube-apiserver's registry refuses it.
	emulated    *version.Version
	badEmulated string
}

// parseCommandLine parses args (the command line of file name) then the
// tool's own --runtime-config and --feature-gates, with gate as
// kube-apiserver's feature gate. The gates are not applied yet (the
// registry's Set).
func parseCommandLine(args []string, in Input, name string, fileSource Source, gate featuregate.MutableVersionedFeatureGate) (*parsed, error) {
	opts, reg := newOptions(gate)
	fs := flagSet(opts)
	from := map[string]Source{}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%s: kube-apiserver would reject its command line: %w", name, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: kube-apiserver takes no arguments, found %q", name, fs.Arg(0))
	}
	fs.Visit(func(f *pflag.Flag) { from[f.Name] = fileSource })
	// The tool's own values come last, as a repeated flag would.
	for _, v := range in.RuntimeConfig {
		if err := fs.Set("runtime-config", v); err != nil {
			return nil, input.Errorf("%s %q: %w", input.RuntimeConfig, v, err)
		}
		from["runtime-config"] = FromTool
	}
	for _, v := range in.FeatureGates {
		if err := fs.Set("feature-gates", v); err != nil {
			return nil, input.Errorf("%s %q: %w", input.FeatureGates, v, err)
		}
		from["feature-gates"] = FromTool
	}
	p := &parsed{opts: opts, reg: reg, fs: fs, from: from}
	if from["emulated-version"] != "" {
		// A value the registry refuses is refused by its Set, or by
		// releaseOf for a release named.
		p.emulated, p.badEmulated, _ = emulatedVersion(fs.Lookup("emulated-version").Value)
	}
	return p, nil
}

// releaseOf is release rel run with the command line's --emulated-version.
func (p *parsed) releaseOf(rel *version.Version) (release.Release, error) {
	if p.badEmulated != "" {
		return release.Release{}, badEmulatedVersion(p.badEmulated)
	}
	return release.New(rel, p.emulated)
}

// emulate records where the release written for came from and, without
// an --emulated-version on the command line, makes the registry emulate it
// (its feature gates at that version; the min compatibility version is
// the release's own, rel.Effective).
func (p *parsed) emulate(rel release.Release, from Source) error {
	p.from["release"] = from
	if rel.Emulated() != nil {
		return nil
	}
	if err := p.fs.Set("emulated-version", rel.String()); err != nil {
		return release.Errorf(rel.String(), "%s %q: %w", input.TargetVersion, rel, err)
	}
	return nil
}

// newOptions returns kube-apiserver's options with private component globals
// (an effective version, and gate: a copy of the process's feature gate, or
// releaseFeatureGate's), so that parsing and validating a command line
// changes nothing process-wide.
func newOptions(gate featuregate.MutableVersionedFeatureGate) (*options.ServerRunOptions, basecompatibility.ComponentGlobalsRegistry) {
	opts := options.NewServerRunOptions()
	reg := basecompatibility.NewComponentGlobalsRegistry()
	ev := compatibility.DefaultBuildEffectiveVersion()
	if err := reg.Register(basecompatibility.DefaultKubeComponent, ev, gate); err != nil {
		panic(err) // a fresh registry has no component yet
	}
	opts.GenericServerRunOptions.ComponentGlobalsRegistry = reg
	return opts, reg
}

// flagSet is kube-apiserver's whole flag set, global flags included.
func flagSet(opts *options.ServerRunOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	fs.SetOutput(discard{})
	for _, f := range opts.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	// kube-apiserver's global flags (cmd/kube-apiserver/app: verflag and
	// globalflag): --version and --help take no part in storage.
	fs.String("version", "false", "")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.BoolP("help", "h", false, "")
	return fs
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// validate runs kube-apiserver's validation of the options the tool uses.
func validate(opts *options.ServerRunOptions, name string) error {
	if name == "" {
		name = "kube-apiserver flags"
	}
	var errs []error
	if name != "kube-apiserver flags" {
		// A whole command line from a file must be one kube-apiserver accepts;
		// without one, the tool's own etcd flags say where etcd is.
		errs = append(errs, opts.Etcd.Validate()...)
	}
	errs = append(errs, opts.APIEnablement.Validate(legacyscheme.Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme)...)
	errs = append(errs, opts.GenericServerRunOptions.ComponentGlobalsRegistry.Validate()...)
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s: kube-apiserver would reject it: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

// Release is the release the command line names, with its
// --emulated-version and effective version: the tool's --target-version,
// else the manifest's image tag; From["release"] says which, and is unset
// when nothing names it (the linked release, emulating what the command line
// says). The target (package target) may settle another (kubeadm's
// ClusterConfiguration in etcd).
func (c *Config) Release() release.Release { return c.release }

// Apply sets the process's feature gate as kube-apiserver of release rel
// sets its own at start-up (emulation and min-compatibility versions first,
// then --feature-gates): the strategies, defaulting and storage decisions the
// tool runs read it. It is meant to be called once per process, before any
// object is decoded.
//
// For an older release, --feature-gates is checked against that release's
// own gate dependencies (releaseFeatureGate), and the gates the linked code
// cannot have on at that release are left off and returned (linkedOff,
// LinkedOffNote). Apply may be called again (for a release found later):
// the values it set before are replaced.
func (c *Config) Apply(rel release.Release) (linkedOff []string, err error) {
	ev := rel.Effective()
	off, err := c.linkedOff(rel)
	if err != nil {
		return nil, err
	}
	gate := utilfeature.DefaultMutableFeatureGate
	for _, f := range c.applied {
		if err := gate.ResetFeatureValueToDefault(featuregate.Feature(f)); err != nil {
			return nil, input.Errorf("%s: %w", input.FeatureGates, err)
		}
	}
	c.applied = nil
	if err := gate.SetEmulationVersionAndMinCompatibilityVersion(ev.EmulationVersion(), ev.MinCompatibilityVersion()); err != nil {
		return nil, fmt.Errorf("--emulated-version: %w", err)
	}
	values := c.FeatureGates
	for _, f := range off {
		// After the flag's own value: the later wins, as in kube-apiserver's flag.
		values = strings.TrimPrefix(values+","+f+"=false", ",")
	}
	if values != "" {
		if err := gate.Set(values); err != nil {
			return nil, input.Errorf("%s: %w", input.FeatureGates, err)
		}
		for _, kv := range strings.Split(values, ",") {
			k, _, _ := strings.Cut(kv, "=")
			c.applied = append(c.applied, strings.TrimSpace(k))
		}
	}
	return off, nil
}

// stripKubePrefix turns the registry's "kube:A=true,kube:B=false" (or the
// unprefixed form) into the gate's own "A=true,B=false".
func stripKubePrefix(v string) string {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		p = strings.TrimPrefix(p, basecompatibility.DefaultKubeComponent+":")
		parts[i] = strings.TrimPrefix(p, ":")
	}
	return strings.Join(parts, ",")
}

// ResourceConfig merges kube-apiserver's default API enablement with
// --runtime-config through the apiserver's own APIEnablementOptions.ApplyTo,
// for the given effective version.
func (c *Config) ResourceConfig(ev basecompatibility.EffectiveVersion) (*serverstorage.ResourceConfig, error) {
	gc := &genericapiserver.Config{
		EffectiveVersion:                        ev,
		EmulationForwardCompatible:              c.opts.GenericServerRunOptions.EmulationForwardCompatible,
		RuntimeConfigEmulationForwardCompatible: c.opts.GenericServerRunOptions.RuntimeConfigEmulationForwardCompatible,
	}
	if err := c.opts.APIEnablement.ApplyTo(gc, controlplane.DefaultAPIResourceConfigSource(), legacyscheme.Scheme); err != nil {
		return nil, input.Errorf("%s %q: %w", input.RuntimeConfig, c.RuntimeConfig, err)
	}
	return gc.MergedResourceConfig, nil
}

// FeatureGate is the feature gate as the flags set it (a private copy: Apply
// sets the process's own).
func (c *Config) FeatureGate() featuregate.FeatureGate {
	return c.registry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
}

// EmulationForwardCompatible reports kube-apiserver's flag of that name.
func (c *Config) EmulationForwardCompatible() (emulation, runtimeConfig bool) {
	return c.opts.GenericServerRunOptions.EmulationForwardCompatible, c.opts.GenericServerRunOptions.RuntimeConfigEmulationForwardCompatible
}

// Describe is the one line the commands print: what was taken from where,
// with rel the release settled, from where ("" = nothing said it). It names
// files, never their contents.
func (c *Config) Describe(rel release.Release, relFrom Source) string {
	var parts []string
	for _, f := range []struct{ flag, value string }{
		{"etcd-servers", strings.Join(c.EtcdServers, ",")},
		{"etcd-cafile", c.EtcdCAFile},
		{"etcd-certfile", c.EtcdCertFile},
		{"etcd-keyfile", c.EtcdKeyFile},
		{"etcd-prefix", c.EtcdPrefix},
		{"encryption-provider-config", c.EncryptionConfig},
		{"storage-media-type", c.StorageMediaType},
		{"runtime-config", c.RuntimeConfig},
		{"feature-gates", c.FeatureGates},
		{"emulated-version", c.EmulatedVersion},
		{"release", rel.String()},
	} {
		src := c.From[f.flag]
		if f.flag == "release" {
			src = relFrom
		}
		if src != "" {
			note := string(src)
			if f.flag == "encryption-provider-config" && src == FromManifest {
				for _, m := range c.kmsMapped {
					note += fmt.Sprintf("; kms endpoint %s -> %s", m.container, m.host)
				}
			}
			if f.flag == "release" {
				parts = append(parts, fmt.Sprintf("release %s (%s)", f.value, note))
				continue
			}
			parts = append(parts, fmt.Sprintf("--%s=%s (%s)", f.flag, f.value, note))
		}
	}
	if len(parts) == 0 {
		return "kube-apiserver defaults"
	}
	head := "kube-apiserver"
	if c.File != "" {
		head += " " + c.File
	}
	return head + ": " + strings.Join(parts, " ")
}

// KMSEndpointMapper returns the function that maps the KMS plugin endpoints
// written in the encryption configuration at path to the endpoints the tool
// dials (for encryption.Options.MapKMSEndpoint), or nil when there is
// nothing to map: path is not the manifest's --encryption-provider-config (the
// tool's own flag overrode it, or it came from a flags file: host paths). In a
// manifest's encryption configuration, a KMS endpoint is a socket path inside
// kube-apiserver's container; the function maps it through the pod's hostPath
// volumes as it maps the manifest's own paths, so the tool reaches the plugin
// where kube-apiserver does. Mapped endpoints are named by Describe.
func (c *Config) KMSEndpointMapper(path string) func(endpoint string) (string, error) {
	if c == nil || c.mounts == nil || path == "" || path != c.EncryptionConfig || c.From["encryption-provider-config"] != FromManifest {
		return nil
	}
	return c.hostKMSEndpoint
}

// hostKMSEndpoint maps one KMS endpoint, as kube-apiserver reads it
// (k8s.io/kms's ParseEndpoint: the path of a unix:// URL, "@name" for an
// abstract socket).
func (c *Config) hostKMSEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint, nil // kube-apiserver's validation refuses it, naming the field
	}
	sock, err := kmsutil.ParseEndpoint(endpoint)
	if err != nil || sock == "" {
		return endpoint, nil // not unix://: refused by the validation too
	}
	if strings.HasPrefix(sock, "@") {
		// An abstract socket is a name in the network namespace, not a file:
		// nothing to map (a static pod with hostNetwork shares the host's).
		return endpoint, nil
	}
	host, err := c.mounts.hostPath(sock)
	if err != nil {
		// Not under a hostPath mount, the socket is in the container's own
		// filesystem (e.g. an emptyDir shared with a plugin sidecar): dialling
		// the path as written would reach whatever is at that path on the
		// host, not kube-apiserver's plugin, and the failure would show up
		// only as values that do not decrypt. An operator expects the tool to
		// stop here, as it does for the manifest's own paths, saying how to
		// point it at the plugin.
		return "", &UnmappedKMSEndpointError{Endpoint: endpoint, Manifest: c.File, Dir: path.Dir(sock)}
	}
	if host == sock {
		return endpoint, nil
	}
	u.Path, u.RawPath = filepath.ToSlash(host), ""
	mapped := u.String()
	seen := false
	for _, m := range c.kmsMapped {
		seen = seen || m.container == endpoint
	}
	if !seen {
		c.kmsMapped = append(c.kmsMapped, mappedEndpoint{container: endpoint, host: mapped})
	}
	return mapped, nil
}

// UnmappedKMSEndpointError is a KMS plugin endpoint of the manifest's
// encryption configuration under none of its hostPath volumes: a
// configuration error, as a manifest path under none is (Load), found only
// once the encryption configuration is read.
type UnmappedKMSEndpointError struct {
	Endpoint string // as the configuration writes it
	Manifest string
	Dir      string // the socket's directory in the container
}

func (e *UnmappedKMSEndpointError) Error() string { return e.Render(input.Words) }

// Render is the message with the encryption configuration's input spelled by spell.
func (e *UnmappedKMSEndpointError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("endpoint %s: no hostPath volume of %s is mounted at or above %s in the container, so the tool cannot reach the KMS plugin where kube-apiserver does; give the tool %s with a copy of the file whose endpoint is the plugin's socket on this host", e.Endpoint, e.Manifest, e.Dir, spell(input.EncryptionProviderConfig))
}

// SetFrom records that the tool's own flag overrode a setting.
func (c *Config) SetFrom(flag string, src Source) { c.From[flag] = src }

// manifestCodecs decode a static pod as the kubelet does (any version of the
// core scheme, YAML or JSON).
var manifestCodecs = serializer.NewCodecFactory(legacyscheme.Scheme)

func readManifest(file, container string) ([]string, *hostMounts, string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, "", input.Errorf("%s: %w", input.APIServerManifest, err)
	}
	obj, _, err := manifestCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: not a Pod manifest: %s", input.APIServerManifest, file, textfmt.OneLine(err.Error()))
	}
	pod := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(obj, pod, nil); err != nil {
		return nil, nil, "", input.Errorf("%s %s: not a Pod manifest (%s)", input.APIServerManifest, file, obj.GetObjectKind().GroupVersionKind().Kind)
	}
	c, err := pickContainer(pod, container)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: %w", input.APIServerManifest, file, err)
	}
	// The kubelet expands $(VAR) in command and args from the container's env.
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expansion.Expand(e.Value, expansion.MappingFuncFor(env))
		}
	}
	mapping := expansion.MappingFuncFor(env)
	var line []string
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		line = append(line, expansion.Expand(a, mapping))
	}
	args := dropProgram(line)
	mounts, err := newHostMounts(pod, c)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: %w", input.APIServerManifest, file, err)
	}
	return args, mounts, c.Image, nil
}

func pickContainer(pod *corev1.Pod, name string) (*corev1.Container, error) {
	var names []string
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		names = append(names, c.Name)
		if name != "" && c.Name == name {
			return c, nil
		}
	}
	if name == "" {
		if len(pod.Spec.Containers) == 1 {
			return &pod.Spec.Containers[0], nil
		}
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == "kube-apiserver" {
				return &pod.Spec.Containers[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no container named %q (containers: %s)", orDefault(name, "kube-apiserver"), strings.Join(names, ", "))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// dropProgram drops the program (and anything before the first flag), e.g.
// "kube-apiserver" or "/usr/local/bin/kube-apiserver".
func dropProgram(words []string) []string {
	for i, w := range words {
		if strings.HasPrefix(w, "-") {
			return words[i:]
		}
	}
	return nil
}

func readFlagsFile(file string) ([]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, input.Errorf("%s: %w", input.APIServerFlagsFile, err)
	}
	var words []string
	var cont strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, " \t\r")
		trimmed := strings.TrimSpace(line)
		if cont.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\"))
			cont.WriteString(" ")
			continue
		}
		cont.WriteString(line)
		full := strings.TrimSpace(cont.String())
		cont.Reset()
		// A systemd unit: only ExecStart holds the command line.
		if k, v, ok := strings.Cut(full, "="); ok && isUnitKey(k) {
			if k != "ExecStart" {
				continue
			}
			full = v
		}
		if strings.HasPrefix(full, "[") {
			continue
		}
		w, err := shellwords.Parse(full)
		if err != nil {
			return nil, input.Errorf("%s %s: %w", input.APIServerFlagsFile, file, err)
		}
		words = append(words, w...)
	}
	for _, w := range words {
		if strings.Contains(w, "${") || (strings.HasPrefix(w, "$") && len(w) > 1) {
			return nil, input.Errorf("%s %s: %q refers to an environment variable; write its value instead", input.APIServerFlagsFile, file, w)
		}
	}
	return dropProgram(words), nil
}

func isUnitKey(k string) bool {
	if k == "" || strings.ContainsAny(k, " -") {
		return false
	}
	return k[0] >= 'A' && k[0] <= 'Z'
}

// hostMounts maps container paths to host paths through hostPath volumes.
type hostMounts struct {
	mounts []mount // longest mount path first
}

type mount struct {
	container string
	host      string
}

func newHostMounts(pod *corev1.Pod, c *corev1.Container) (*hostMounts, error) {
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	m := &hostMounts{}
	for _, vm := range c.VolumeMounts {
		host, ok := hostPaths[vm.Name]
		if !ok {
			continue // not a hostPath volume: nothing on the host to read
		}
		if vm.SubPath != "" {
			host = filepath.Join(host, vm.SubPath)
		}
		m.mounts = append(m.mounts, mount{container: path.Clean(vm.MountPath), host: host})
	}
	sort.SliceStable(m.mounts, func(i, j int) bool { return len(m.mounts[i].container) > len(m.mounts[j].container) })
	return m, nil
}

func (m *hostMounts) hostPath(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("a relative path in a static pod is relative to the container's working directory; give an absolute path")
	}
	clean := path.Clean(p)
	for _, mt := range m.mounts {
		if clean == mt.container {
			return mt.host, nil
		}
		if rel, ok := strings.CutPrefix(clean, strings.TrimSuffix(mt.container, "/")+"/"); ok {
			return filepath.Join(mt.host, filepath.FromSlash(rel)), nil
		}
	}
	return "", fmt.Errorf("no hostPath volume is mounted at or above it in the container, so the file is not on the host")
}

var _ runtime.Decoder = manifestCodecs.UniversalDeserializer()
