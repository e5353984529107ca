package command

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/version"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/target"
)

// apiServerFlags configure the tool from the cluster's own kube-apiserver.
func apiServerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "apiserver-manifest", Usage: "kube-apiserver static-pod manifest (kubeadm: /etc/kubernetes/manifests/kube-apiserver.yaml): take etcd, prefix, encryption, media type, runtime config, feature gates and emulated version from its command line; container paths are mapped through its hostPath volumes; the tool's own flags override it"},
		&cli.StringFlag{Name: "apiserver-flags-file", Usage: "kube-apiserver's command line in a file (one line, one flag per line, or a systemd unit's ExecStart), read like --apiserver-manifest"},
		&cli.StringSliceFlag{Name: "runtime-config", Usage: "kube-apiserver --runtime-config (e.g. resource.k8s.io/v1beta2=true): which API versions are served, hence the storage versions and the managedFields a no-op update keeps; applied after the manifest's, key by key"},
		&cli.StringSliceFlag{Name: "feature-gates", Usage: "kube-apiserver --feature-gates (e.g. DRAAdminAccess=false); applied after the manifest's, key by key"},
	}
}

// apiServerOptions are apiServerFlags as given, and --target-version
// (targetFlags), parsed once: the release the tool writes as.
type apiServerOptions struct {
	manifest, flagsFile         string
	runtimeConfig, featureGates []string
	targetVersion               string
	target                      *version.Version // --target-version parsed (validate)
}

func newAPIServerOptions(c *cli.Context) apiServerOptions {
	return apiServerOptions{
		manifest:      c.String("apiserver-manifest"),
		flagsFile:     c.String("apiserver-flags-file"),
		runtimeConfig: c.StringSlice("runtime-config"),
		featureGates:  c.StringSlice("feature-gates"),
		targetVersion: c.String("target-version"),
	}
}

// validate parses --target-version.
func (o *apiServerOptions) validate() error {
	v, err := release.ParseTarget(o.targetVersion)
	if err != nil {
		return usageErr("%v", err)
	}
	o.target = v
	return nil
}

// load reads kube-apiserver's configuration from the files and flags the
// options name. Errors are usage errors naming the flag or file.
func (o *apiServerOptions) load() (*apiserverconfig.Config, error) {
	api, err := apiserverconfig.Load(apiserverconfig.Input{
		Manifest:      o.manifest,
		FlagsFile:     o.flagsFile,
		RuntimeConfig: o.runtimeConfig,
		FeatureGates:  o.featureGates,
		TargetVersion: o.target,
	})
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return api, nil
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
