package command

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/version"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/installer"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/target"
)

// apiServerFlags configure the tool from the cluster's own kube-apiserver.
func apiServerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "apiserver-manifest", Usage: "kube-apiserver static-pod manifest (kubeadm: /etc/kubernetes/manifests/kube-apiserver.yaml): take etcd, prefix, encryption, media type, runtime config, feature gates and emulated version from its command line; container paths are mapped through its hostPath volumes; the tool's own flags override it; without it (or --apiserver-flags-file, --endpoints), the node's installer's is found (--distribution)"},
		&cli.StringFlag{Name: "apiserver-flags-file", Usage: "kube-apiserver's command line in a file (one line, one flag per line, or a systemd unit's ExecStart), read like --apiserver-manifest"},
		&cli.StringSliceFlag{Name: "runtime-config", Usage: "kube-apiserver --runtime-config (e.g. resource.k8s.io/v1beta2=true): which API versions are served, hence the storage versions and the managedFields a no-op update keeps; applied after the manifest's, key by key"},
		&cli.StringSliceFlag{Name: "feature-gates", Usage: "kube-apiserver --feature-gates (e.g. DRAAdminAccess=false); applied after the manifest's, key by key"},
		&cli.StringFlag{Name: "distribution", Usage: "the installer that laid out this control-plane node: " + distributionNames() + "; without --apiserver-manifest, --apiserver-flags-file or --endpoints, the node's installer is found from its files (refused when none or several are there): this picks one"},
		&cli.StringFlag{Name: "node-root", Usage: "the node's root directory, where the installer's files are looked for and every host path their configuration names is read (a node's disk mounted elsewhere, or / mounted into the tool's container)", Value: "/"},
	}
}

func distributionNames() string {
	names := make([]string, len(installer.Names))
	for i, n := range installer.Names {
		names[i] = string(n)
	}
	return strings.Join(names, "|")
}

// apiServerOptions are apiServerFlags as given, and --target-version
// (targetFlags), parsed once: the release the tool writes as.
type apiServerOptions struct {
	manifest, flagsFile         string
	runtimeConfig, featureGates []string
	targetVersion               string
	target                      *version.Version // --target-version parsed (validate)
	// distribution is --distribution (installer, parsed by validate), nodeRoot
	// --node-root.
	distribution string
	installer    installer.Name
	nodeRoot     string
	nodeRootSet  bool
	// discover: the node's installer is looked for (discovery), because
	// nothing on the command line names the cluster (--apiserver-manifest,
	// --apiserver-flags-file, --endpoints) or --distribution or --node-root
	// asks for it (with --endpoints, etcd is reached there);
	// never for a --snapshot-file. envEndpoints is the variable that gave
	// --endpoints, if one did: it names the cluster when no installer's
	// files are on the node.
	discover     bool
	snapshotFile bool
	// named: kube-apiserver's configuration or etcd is named by a flag.
	named        bool
	envEndpoints string
	// found is shared by the copies of the options: the node is looked at
	// once per command.
	found *discovery
	// command is the command's name (kineRefusal).
	command string
}

// discovery is what was found on the node (once).
type discovery struct {
	done  bool
	found *installer.Found
	// fromEnv: nothing found, the cluster is the environment's (envEndpoints).
	fromEnv bool
	err     error
}

func newAPIServerOptions(c *cli.Context) apiServerOptions {
	o := apiServerOptions{
		manifest:      c.String("apiserver-manifest"),
		flagsFile:     c.String("apiserver-flags-file"),
		runtimeConfig: c.StringSlice("runtime-config"),
		featureGates:  c.StringSlice("feature-gates"),
		targetVersion: c.String("target-version"),
		distribution:  c.String("distribution"),
		nodeRoot:      c.String("node-root"),
		nodeRootSet:   c.IsSet("node-root"),
		snapshotFile:  c.String("snapshot-file") != "",
		envEndpoints:  fromEnvironment(c, "endpoints"),
		found:         &discovery{},
		command:       c.Command.Name,
	}
	o.named = o.manifest != "" || o.flagsFile != "" || onCommandLine(c, "endpoints")
	o.discover = !o.snapshotFile && (!o.named || o.distribution != "" || o.nodeRootSet)
	return o
}

// liveCluster is for a command whose --snapshot-file is not what it reads
// as the cluster (restore's backup): the cluster is found on the node as
// without one.
func (o *apiServerOptions) liveCluster() {
	o.snapshotFile = false
	o.discover = !o.named || o.distribution != "" || o.nodeRootSet
}

// validate parses --target-version and --distribution, and refuses what
// does not go together with them.
func (o *apiServerOptions) validate() error {
	v, err := release.ParseTarget(o.targetVersion)
	if err != nil {
		return usageErr("%v", err)
	}
	o.target = v
	if o.installer, err = installer.Parse(o.distribution); err != nil {
		return usageErr("--distribution %v", err)
	}
	for _, f := range []struct {
		set  bool
		name string
	}{{o.distribution != "", "--distribution"}, {o.nodeRootSet, "--node-root"}} {
		switch {
		case !f.set:
		case o.manifest != "" || o.flagsFile != "":
			return usageErr("%s and %s: %s looks for the node's installer's files, %s names kube-apiserver's configuration itself; give one of them", f.name, orFlag(o.manifest != "", "--apiserver-manifest", "--apiserver-flags-file"), f.name, orFlag(o.manifest != "", "--apiserver-manifest", "--apiserver-flags-file"))
		case o.snapshotFile:
			return usageErr("%s with --snapshot-file: a snapshot file is read with the configuration the flags give (--encryption-provider-config, --apiserver-manifest), not the node's", f.name)
		}
	}
	if o.nodeRootSet {
		if o.nodeRoot == "" {
			return usageErr("--node-root: empty; give a directory (default /)")
		}
		abs, err := filepath.Abs(o.nodeRoot)
		if err != nil {
			return usageErr("--node-root %s: %v", o.nodeRoot, err)
		}
		fi, err := os.Stat(abs)
		if err != nil {
			return usageErr("--node-root: %v", err)
		}
		if !fi.IsDir() {
			return usageErr("--node-root %s: not a directory", o.nodeRoot)
		}
		o.nodeRoot = abs
	}
	return nil
}

func orFlag(first bool, a, b string) string {
	if first {
		return a
	}
	return b
}

// load reads kube-apiserver's configuration from the files and flags the
// options name, or, when nothing names the cluster, from what the node's
// installer laid out (discover). Errors are usage errors naming the flag or
// file.
func (o *apiServerOptions) load() (*apiserverconfig.Config, error) {
	in := apiserverconfig.Input{
		Manifest:      o.manifest,
		FlagsFile:     o.flagsFile,
		RuntimeConfig: o.runtimeConfig,
		FeatureGates:  o.featureGates,
		TargetVersion: o.target,
	}
	found, err := o.discovered()
	if err != nil {
		// The tool's own flags first: a value of theirs kube-apiserver
		// would refuse is refused whatever the node has.
		if _, ferr := apiserverconfig.Load(in); ferr != nil {
			return nil, usageErr("%v", ferr)
		}
		return nil, err
	}
	if found != nil {
		in.Root = found.Root
		in.EtcdDataDir, in.EtcdDataDirFrom = o.foundEtcdData()
		in.KineDatabase = found.KineDatabase
		if found.KineDSN != "" {
			in.KineServer = "the " + found.KineKind() + " " + installer.ServerDatabase(found.KineDSN)
		}
		if found.Manifest != "" {
			in.Manifest = found.Manifest
		} else {
			in.CommandLine = &apiserverconfig.CommandLine{
				Name:   fmt.Sprintf("%s's configuration (%s)", found.Installer, strings.Join(found.Files, ", ")),
				Args:   found.CommandLine,
				Source: apiserverconfig.Source(found.Installer),
			}
		}
	}
	api, err := apiserverconfig.Load(in)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return api, nil
}

// discovered is the node's installer's control plane, looked for once when
// discover; nil when not looked for, or when nothing was found and the
// environment's etcd endpoints name the cluster. Nothing found otherwise,
// several found, or an unsupported one, is a usage error listing where it
// looked and the flags that would name the cluster.
func (o *apiServerOptions) discovered() (*installer.Found, error) {
	d := o.found
	if d == nil || !o.discover {
		return nil, nil
	}
	if !d.done {
		d.done = true
		d.found, d.err = installer.Find(o.nodeRoot, o.installer)
		var nf *installer.NotFoundError
		if errors.As(d.err, &nf) && o.installer == "" && o.envEndpoints != "" {
			d.fromEnv, d.err = true, nil
		}
	}
	if d.err != nil {
		return nil, usageErr("%v", d.err)
	}
	return d.found, nil
}

// manifestFile is kube-apiserver's static-pod manifest the configuration
// was read from: --apiserver-manifest, or the one found on the node ("" for
// neither).
func (o *apiServerOptions) manifestFile() string {
	if o.manifest != "" {
		return o.manifest
	}
	if d := o.found; d != nil && d.found != nil {
		return d.found.Manifest
	}
	return ""
}

// foundEtcdData is etcd's data directory as the installer found on the node
// names it, and where it was found ("" when none was looked for or it names
// none).
func (o *apiServerOptions) foundEtcdData() (dir, from string) {
	if d := o.found; d != nil && d.found != nil {
		switch f := d.found; {
		case f.EtcdDataDir != "":
			return f.EtcdDataDir, f.EtcdDataDirFrom
		case f.KineDatabase != "":
			// The datastore grows on its file's filesystem.
			return filepath.Dir(f.KineDatabase), fmt.Sprintf("the directory of %s's SQLite datastore", f.Installer)
		case f.KineDSN != "":
			return "", fmt.Sprintf("none: %s's %s datastore grows on its server", f.Installer, f.KineKind())
		}
	}
	return "", ""
}

// reportFound prints, once the configuration is loaded, what was found on
// the node and the notes about it (nothing when not looked for).
func (o *apiServerOptions) reportFound(w io.Writer) {
	d := o.found
	if d == nil || !d.done {
		return
	}
	if d.fromEnv {
		fmt.Fprintf(w, "note: no kubeadm, kops, RKE2 or k3s control plane found on this node: the cluster is the one $%s names\n", o.envEndpoints)
		return
	}
	if d.found == nil {
		return
	}
	fmt.Fprintln(w, d.found.What())
	for _, n := range d.found.Notes {
		fmt.Fprintln(w, n)
	}
}

// etcdConfig is the etcd connection: the tool's flags on the command line,
// else kube-apiserver's --etcd-servers and --etcd-{ca,cert,key}file, else the
// ETCDCTL_* environment, else etcdctl's defaults. What came from the
// environment, or was left for the manifest, is noted in env (and printed
// to w when the result is refused).
func etcdConfig(o etcdOptions, prov provenance, api *apiserverconfig.Config, env *envReport, w io.Writer) (etcdscan.Config, error) {
	cfg, err := o.config()
	if err != nil {
		return cfg, usageErr("%v", err)
	}
	override := func(toolFlag, apiFlag string, dst *string, v string) {
		switch {
		case prov.onCommandLine(toolFlag):
			if api.From[apiFlag] != "" {
				api.SetFrom(apiFlag, apiserverconfig.FromTool)
			}
		case api.From[apiFlag] != "":
			env.ignored(prov, toolFlag, api, apiFlag, *dst, v)
			*dst = v
		default:
			env.used(prov, toolFlag, *dst)
		}
	}
	override("cacert", "etcd-cafile", &cfg.CACert, api.EtcdCAFile)
	override("cert", "etcd-certfile", &cfg.Cert, api.EtcdCertFile)
	override("key", "etcd-keyfile", &cfg.Key, api.EtcdKeyFile)
	switch {
	case prov.onCommandLine("endpoints"):
		if api.From["etcd-servers"] != "" {
			api.SetFrom("etcd-servers", apiserverconfig.FromTool)
		}
		api.EtcdServers = cfg.Endpoints
	case api.From["etcd-servers"] != "":
		env.ignored(prov, "endpoints", api, "etcd-servers", strings.Join(cfg.Endpoints, ","), strings.Join(api.EtcdServers, ","))
		cfg.Endpoints = api.EtcdServers
	default:
		env.used(prov, "endpoints", strings.Join(cfg.Endpoints, ","))
		api.EtcdServers = cfg.Endpoints
	}
	// kube-apiserver has no etcd user, password or these timeouts.
	env.used(prov, "user", cfg.Username)
	env.used(prov, "password", "")
	env.used(prov, "dial-timeout", cfg.DialTimeout.String())
	env.used(prov, "command-timeout", cfg.CommandTimeout.String())
	api.EtcdCAFile, api.EtcdCertFile, api.EtcdKeyFile = cfg.CACert, cfg.Cert, cfg.Key
	if err := cfg.Validate(); err != nil {
		env.print(w) // which of the values came from the environment
		if api.File != "" {
			return cfg, usageErr("%v (from %s)", etcdError(err), api.File)
		}
		return cfg, usageErr("%v", etcdError(err))
	}
	return cfg, nil
}

// fromAPIServer returns the tool's flag value (toolValue) if it was given on
// the command line, else kube-apiserver's (apiFlag) when its command line set
// it, else the flag's environment variable, else the tool's default; the
// source is recorded for the one-line reports.
func fromAPIServer(prov provenance, api *apiserverconfig.Config, env *envReport, toolFlag, toolValue, apiFlag, apiValue string) string {
	switch {
	case prov.onCommandLine(toolFlag):
		if api.From[apiFlag] != "" {
			api.SetFrom(apiFlag, apiserverconfig.FromTool)
		}
		return toolValue
	case api.From[apiFlag] != "":
		env.ignored(prov, toolFlag, api, apiFlag, toolValue, apiValue)
		return apiValue
	}
	env.used(prov, toolFlag, toolValue)
	return toolValue
}

// reportAPIServer prints to w the one line saying what was taken from
// where, when anything came from kube-apiserver's configuration (o's files,
// --runtime-config, --feature-gates), with the release tgt settled (nil: the
// one the command line names). It names files and flags, never key material.
func reportAPIServer(w io.Writer, o apiServerOptions, api *apiserverconfig.Config, tgt *target.Target) {
	if api.File == "" && len(o.runtimeConfig) == 0 && len(o.featureGates) == 0 {
		return
	}
	rel, from := api.Release(), api.From["release"]
	if tgt != nil {
		rel, from = tgt.Release(), tgt.ReleaseFrom()
	}
	fmt.Fprintln(w, "using "+api.Describe(rel, from))
}
