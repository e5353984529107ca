package command

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/etcdscan"
)

func commonFlags() []cli.Flag {
	flags := append(append(etcdFlags(), snapshotFlags()...), apiServerFlags()...)
	return append(flags,
		&cli.StringFlag{Name: "prefix", Value: "/registry", Usage: "etcd key prefix kube-apiserver uses (--etcd-prefix); kube-apiserver's own --etcd-prefix (--apiserver-manifest) wins over $KEM_PREFIX", EnvVars: []string{"KEM_PREFIX"}},
		&cli.StringFlag{Name: "encryption-provider-config", Usage: "kube-apiserver EncryptionConfiguration file (unchanged format); none = identity"},
		&cli.Int64Flag{Name: "page-size", Value: etcdscan.DefaultPageSize, Usage: "keys per etcd range request"},
		&cli.StringSliceFlag{Name: "resource", Usage: "only this resource (repeatable): secrets, deployments.apps, widgets.example.com"},
		&cli.StringFlag{Name: "namespace", Usage: "only this namespace (needs --resource)"},
		&cli.StringSliceFlag{Name: "conversion-webhook", Usage: "NAMESPACE/SERVICE=HOST:PORT[/PATH] (or https://HOST:PORT[/PATH]): where to reach a CRD conversion webhook's Service, instead of its ready endpoints read from etcd (repeatable)"},
		&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile to this file"},
		&cli.StringFlag{Name: "memprofile", Usage: "write a heap profile to this file at exit"},
	)
}

// scanOptions are what every command that reads the keyspace takes
// (commonFlags; targetFlags for those that judge or write), read from the
// flags once (newScanOptions), refused before anything is opened
// (validate), then handed to open.
type scanOptions struct {
	io   streams
	prov provenance
	etcd etcdOptions
	api  apiServerOptions
	// command is the command's name, for messages.
	command string
	// writes: the command writes the cluster's datastore (not a dry run):
	// a SQLite one is served itself, not a copy (serveKine).
	writes bool

	snapshotFile  string
	skipHashCheck bool

	prefix, encryptionConfig string
	pageSize                 int64
	resources                []string
	// only is which of the cluster's etcds a session reads, set per etcd
	// by the commands that handle every etcd of a cluster that keeps
	// resources in several (--etcd-servers-overrides: migrate, verify);
	// nil: the cluster must keep them in one.
	only *apiserverconfig.Etcd
	// etcds are the cluster's etcds (clusterEtcds), with only.
	etcds apiserverconfig.Etcds
	// kubeadmFrom, for another etcd than the main one, is the main etcd's
	// session's source: where kubeadm-config is (target.Input.KubeadmSource).
	kubeadmFrom            etcdscan.Source
	namespace              string
	conversionWebhooks     []string
	webhooks               map[string]string // conversionWebhooks parsed (validate)
	cpuprofile, memprofile string
	// revision is --revision (0: the current one); revisionFlag says the
	// command has the flag, revisionSet that it was given.
	revision                  int64
	revisionFlag, revisionSet bool

	target targetOptions
}

// newScanOptions reads commonFlags, and targetFlags for use, from c.
func newScanOptions(c *cli.Context, use targetUse) *scanOptions {
	return &scanOptions{
		io:                 streamsOf(c),
		command:            commandNameOf(c),
		prov:               newProvenance(c),
		etcd:               newEtcdOptions(c),
		api:                newAPIServerOptions(c),
		snapshotFile:       c.String("snapshot-file"),
		skipHashCheck:      c.Bool("skip-hash-check"),
		prefix:             c.String("prefix"),
		encryptionConfig:   c.String("encryption-provider-config"),
		pageSize:           c.Int64("page-size"),
		resources:          c.StringSlice("resource"),
		namespace:          c.String("namespace"),
		conversionWebhooks: c.StringSlice("conversion-webhook"),
		cpuprofile:         c.String("cpuprofile"),
		memprofile:         c.String("memprofile"),
		revision:           c.Int64("revision"),
		revisionFlag:       hasFlag(c, "revision"),
		revisionSet:        c.IsSet("revision"),
		target:             newTargetOptions(c, use),
	}
}

// validate refuses what the flags alone refuse, before anything is opened.
func (o *scanOptions) validate() error {
	if o.namespace != "" && len(o.resources) == 0 {
		return usageErr("--namespace needs --resource (the keyspace is laid out by resource first)")
	}
	if o.pageSize <= 0 {
		return usageErr("--page-size must be positive")
	}
	webhooks, err := parseWebhooks(o.conversionWebhooks)
	if err != nil {
		return err
	}
	o.webhooks = webhooks
	if err := o.api.validate(); err != nil {
		return err
	}
	if o.snapshotFile == "" {
		return o.etcd.validate()
	}
	return nil
}

func outputFlag(def string, allowed ...string) *cli.StringFlag {
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: def, Usage: "output format: " + strings.Join(allowed, "|"),
		Action: func(c *cli.Context, v string) error {
			for _, a := range allowed {
				if v == a {
					return nil
				}
			}
			return usageErr("--output %q: want one of %s", v, strings.Join(allowed, ", "))
		}}
}

func parseWebhooks(vals []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vals {
		name, addr, ok := strings.Cut(v, "=")
		ns, svc, _ := strings.Cut(name, "/")
		if !ok || ns == "" || svc == "" || strings.Contains(svc, "/") {
			return nil, usageErr("--conversion-webhook %q: want NAMESPACE/SERVICE=HOST:PORT[/PATH] or NAMESPACE/SERVICE=https://HOST:PORT[/PATH]", v)
		}
		if _, _, err := customresource.ParseWebhookAddress(addr); err != nil {
			return nil, usageErr("--conversion-webhook %s: %v", name, err)
		}
		if prev, dup := out[name]; dup && prev != addr {
			return nil, usageErr("--conversion-webhook %s given twice (%s and %s)", name, prev, addr)
		}
		out[name] = addr
	}
	return out, nil
}

// webhookHint ends the error of a conversion webhook Service that cannot be
// reached.
func webhookHint(service string) string {
	return fmt.Sprintf("give an address that reaches the webhook from here with --conversion-webhook %s=HOST:PORT (a webhook pod's IP and container port; the CRD's path and caBundle are used, the certificate checked for the service's DNS name)", service)
}

// startProfiles starts --cpuprofile and --memprofile (the returned function
// stops them).
func startProfiles(cpuprofile, memprofile string) (func(), error) {
	var stops []func()
	if p := cpuprofile; p != "" {
		f, err := os.Create(p)
		if err != nil {
			return nil, usageErr("--cpuprofile: %v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if p := memprofile; p != "" {
		stops = append(stops, func() {
			f, err := os.Create(p)
			if err != nil {
				fmt.Fprintf(os.Stderr, "--memprofile: %v\n", err)
				return
			}
			defer f.Close()
			if err := pprof.WriteHeapProfile(f); err != nil {
				fmt.Fprintf(os.Stderr, "--memprofile: %v\n", err)
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}, nil
}

// revisionFlag is for the read-only commands.
func revisionFlag() cli.Flag {
	return &cli.Int64Flag{Name: "revision", Usage: "read at this etcd revision (it must not be compacted); default the current one, a --snapshot-file's own"}
}

// hasFlag reports whether the running command defines the flag.
func hasFlag(c *cli.Context, name string) bool {
	if c.Command == nil {
		return false
	}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// commandNameOf is the name of c's command ("" outside one).
func commandNameOf(c *cli.Context) string {
	if c.Command == nil {
		return ""
	}
	return c.Command.Name
}
