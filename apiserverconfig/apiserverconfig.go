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
//
// apiserverconfig.go is the configuration (Load, Config, Apply), flags.go
// kube-apiserver's flag set and its validation, manifest.go the readers of a
// static-pod manifest and a flags file, hostpath.go the hostPath volumes
// that map a container's paths (and KMS sockets) to the host's,
// targetrelease.go the release the configuration names, featuregates.go an
// older release's gate dependencies, etcds.go the etcds of the cluster
// (--etcd-servers-overrides) and which resources each holds,
// etcdmanifest.go etcd's own manifest.
package apiserverconfig

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	genericapiserver "k8s.io/apiserver/pkg/server"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/controlplane"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/release"
)

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
	// EtcdDataDir and EtcdDataDirFrom are Input's: etcd's data directory on
	// this node as the installer's layout names it ("" when not known that
	// way: then through etcd's manifest beside Manifest).
	EtcdDataDir, EtcdDataDirFrom string
	// KineDatabase is Input's: the SQLite file kube-apiserver's etcd is,
	// served through kine ("" for etcd).
	KineDatabase string
	// KineServer is Input's: the database server kube-apiserver's etcd is,
	// served through kine (k3s's PostgreSQL or MySQL), named without
	// credentials ("the PostgreSQL database k3s on db:5432", "the MySQL
	// database k3s on db"; "" for etcd or SQLite).
	KineServer string

	// release is what the command line says of the release (Release).
	release  release.Release
	opts     *options.ServerRunOptions
	registry basecompatibility.ComponentGlobalsRegistry
	// mounts are the manifest's hostPath mounts, or a command line's node
	// root (nil for neither).
	mounts *hostMounts
	// fileSource is what File is (FromManifest, FromFlags or an installer's
	// command line's Source).
	fileSource Source
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
	// CommandLine, instead of a manifest or flags file, is kube-apiserver's
	// command line as an installer that runs it without a file of its own
	// builds it (k3s: its defaults and its configuration's
	// kube-apiserver-arg; package installer).
	CommandLine *CommandLine
	// Root is the node's root directory: the host paths the manifest's
	// hostPath volumes or the CommandLine name are read under it ("" or "/":
	// this machine's own). Manifest and FlagsFile are read where they are.
	Root string
	// EtcdDataDir is this node's etcd data directory when the installer's
	// layout names it (package installer), EtcdDataDirFrom where it was
	// read; both are carried to Config as they are.
	EtcdDataDir, EtcdDataDirFrom string
	// KineDatabase is the SQLite file kube-apiserver's datastore is, served
	// through kine (k3s's or RKE2's), "" for etcd; carried to Config.
	KineDatabase string
	// KineServer is the database server kube-apiserver's datastore is,
	// served through kine (PostgreSQL or MySQL), named without credentials
	// and beginning "the PostgreSQL " or "the MySQL ", "" for etcd or
	// SQLite; carried to Config.
	KineServer string
}

// CommandLine is kube-apiserver's command line built from an installer's
// configuration.
type CommandLine struct {
	// Name names where it comes from (the configuration files), for
	// messages and the one-line report.
	Name string
	Args []string
	// Source is what each flag it sets is reported as coming from.
	Source Source
}

// Load parses kube-apiserver's command line from in and returns what the tool
// takes from it. Nothing process-wide changes until Apply.
func Load(in Input) (*Config, error) {
	if in.Manifest != "" && in.FlagsFile != "" {
		return nil, input.Errorf("%s and %s: give one of them", input.APIServerManifest, input.APIServerFlagsFile)
	}
	var args []string
	var mounts *hostMounts
	cfg := &Config{EtcdDataDir: in.EtcdDataDir, EtcdDataDirFrom: in.EtcdDataDirFrom, KineDatabase: in.KineDatabase, KineServer: in.KineServer}
	fileSource := FromManifest
	switch {
	case in.Manifest != "":
		var err error
		args, mounts, cfg.Image, err = readManifest(in.Manifest, in.Container, in.Root)
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
		cfg.File, fileSource = in.FlagsFile, FromFlags
	case in.CommandLine != nil:
		args = append([]string(nil), in.CommandLine.Args...)
		cfg.File, fileSource = in.CommandLine.Name, in.CommandLine.Source
		if in.Root != "" && in.Root != "/" {
			mounts = rootMounts(in.Root)
		}
	}
	cfg.fileSource = fileSource

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
	if _, err := cfg.Etcds(); err != nil {
		return nil, err
	}
	return cfg, nil
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
		{"etcd-servers-overrides", strings.Join(c.ServersOverrides(), ",")},
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
			if f.flag == "encryption-provider-config" && src == c.fileSource && c.mounts != nil {
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

// SetFrom records that the tool's own flag overrode a setting.
func (c *Config) SetFrom(flag string, src Source) { c.From[flag] = src }

// OnKine says whether kube-apiserver's datastore is served through kine: a
// SQLite file (KineDatabase) or a database server (KineServer); false for a
// nil Config.
func (c *Config) OnKine() bool { return c != nil && (c.KineDatabase != "" || c.KineServer != "") }

// KineServerKind is the database server's kind of KineServer: "MySQL" or
// "PostgreSQL" ("" when there is none).
func (c *Config) KineServerKind() string {
	switch {
	case c == nil || c.KineServer == "":
		return ""
	case strings.HasPrefix(c.KineServer, "the MySQL "):
		return "MySQL"
	}
	return "PostgreSQL"
}

// KineServerDump is the dump a run's operator takes of the database server
// of KineServer before a writing run (its undo beyond the run's journal):
// pg_dump's or mysqldump's command, "" when there is none.
func (c *Config) KineServerDump() string {
	switch c.KineServerKind() {
	case "MySQL":
		return "mysqldump --single-transaction"
	case "PostgreSQL":
		return "pg_dump --format=custom"
	}
	return ""
}
