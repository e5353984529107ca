package command

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

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

// apiServerConfig reads kube-apiserver's configuration from the flags above
// (and --target-version, the release the tool writes as, parsed here once).
// Errors are usage errors naming the flag or file.
func apiServerConfig(c *cli.Context) (*apiserverconfig.Config, error) {
	targetVersion, err := release.ParseTarget(c.String("target-version"))
	if err != nil {
		return nil, usageErr("%v", err)
	}
	api, err := apiserverconfig.Load(apiserverconfig.Input{
		Manifest:      c.String("apiserver-manifest"),
		FlagsFile:     c.String("apiserver-flags-file"),
		RuntimeConfig: c.StringSlice("runtime-config"),
		FeatureGates:  c.StringSlice("feature-gates"),
		TargetVersion: targetVersion,
	})
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return api, nil
}

// etcdConfig is the etcd connection: the tool's flags on the command line,
// else kube-apiserver's --etcd-servers and --etcd-{ca,cert,key}file, else the
// ETCDCTL_* environment, else etcdctl's defaults. What came from the
// environment, or was left for the manifest, is noted in env.
func etcdConfig(c *cli.Context, api *apiserverconfig.Config, env *envReport) (etcdscan.Config, error) {
	cfg, err := parseEtcdFlags(c)
	if err != nil {
		return cfg, usageErr("%v", err)
	}
	override := func(toolFlag, apiFlag string, dst *string, v string) {
		switch {
		case onCommandLine(c, toolFlag):
			if api.From[apiFlag] != "" {
				api.SetFrom(apiFlag, apiserverconfig.FromTool)
			}
		case api.From[apiFlag] != "":
			env.ignored(c, toolFlag, api, apiFlag, *dst, v)
			*dst = v
		default:
			env.used(c, toolFlag, *dst)
		}
	}
	override("cacert", "etcd-cafile", &cfg.CACert, api.EtcdCAFile)
	override("cert", "etcd-certfile", &cfg.Cert, api.EtcdCertFile)
	override("key", "etcd-keyfile", &cfg.Key, api.EtcdKeyFile)
	switch {
	case onCommandLine(c, "endpoints"):
		if api.From["etcd-servers"] != "" {
			api.SetFrom("etcd-servers", apiserverconfig.FromTool)
		}
		api.EtcdServers = cfg.Endpoints
	case api.From["etcd-servers"] != "":
		env.ignored(c, "endpoints", api, "etcd-servers", strings.Join(cfg.Endpoints, ","), strings.Join(api.EtcdServers, ","))
		cfg.Endpoints = api.EtcdServers
	default:
		env.used(c, "endpoints", strings.Join(cfg.Endpoints, ","))
		api.EtcdServers = cfg.Endpoints
	}
	// kube-apiserver has no etcd user, password or these timeouts.
	env.used(c, "user", cfg.Username)
	env.used(c, "password", "")
	env.used(c, "dial-timeout", cfg.DialTimeout.String())
	env.used(c, "command-timeout", cfg.CommandTimeout.String())
	api.EtcdCAFile, api.EtcdCertFile, api.EtcdKeyFile = cfg.CACert, cfg.Cert, cfg.Key
	if err := cfg.Validate(); err != nil {
		env.print(c) // which of the values came from the environment
		if api.File != "" {
			return cfg, usageErr("%v (from %s)", etcdError(err), api.File)
		}
		return cfg, usageErr("%v", etcdError(err))
	}
	return cfg, nil
}

// fromAPIServer returns the tool's flag value if it was given on the command
// line, else kube-apiserver's (apiFlag) when its command line set it, else the
// flag's environment variable, else the tool's default; the source is recorded
// for the one-line reports.
func fromAPIServer(c *cli.Context, api *apiserverconfig.Config, env *envReport, toolFlag, apiFlag, apiValue string) string {
	switch {
	case onCommandLine(c, toolFlag):
		if api.From[apiFlag] != "" {
			api.SetFrom(apiFlag, apiserverconfig.FromTool)
		}
		return c.String(toolFlag)
	case api.From[apiFlag] != "":
		env.ignored(c, toolFlag, api, apiFlag, c.String(toolFlag), apiValue)
		return apiValue
	}
	env.used(c, toolFlag, c.String(toolFlag))
	return c.String(toolFlag)
}

// reportAPIServer prints the one line saying what was taken from where, when
// anything came from kube-apiserver's configuration, with the release tgt
// settled (nil: the one the command line names). It names files and flags,
// never key material.
func reportAPIServer(c *cli.Context, api *apiserverconfig.Config, tgt *target.Target) {
	if api.File == "" && len(c.StringSlice("runtime-config")) == 0 && len(c.StringSlice("feature-gates")) == 0 {
		return
	}
	rel, from := api.Release(), api.From["release"]
	if tgt != nil {
		rel, from = tgt.Release(), tgt.ReleaseFrom()
	}
	fmt.Fprintln(c.App.ErrWriter, "using "+api.Describe(rel, from))
}
