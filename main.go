// Command kube-etcd-migrate rewrites Kubernetes objects directly in etcd, offline,
// to the storage version and encryption key kube-apiserver would use, and audits
// which objects are stale or unreadable. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/snapshotfile"
)

// Exit codes, documented in the README and in --help.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitStale       = 3
	exitUnreadable  = 4
	exitCodesHelpTx = `EXIT CODES:
   0  success (verify: every object current)
   1  failed, nothing lost (etcd unreachable, preflight refusal, write failures,
      stopped before etcd's quota or at its first NOSPACE or permission refusal:
      one line names the cause and the remedy; the journal is intact)
   2  usage error (bad flag or argument; a manifest path or KMS plugin socket
      under no hostPath mount)
   3  verify: something is stale, everything is readable
   4  verify/migrate: something is unreadable (no key for it, corrupt, unknown kind,
      fields these types would lose); migrate left those objects untouched`
)

// exitError carries an exit code through urfave/cli.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &codeError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func main() {
	// k8s.io/apiserver's etcd3 package sends gRPC's logs to klog, which would print
	// every connection retry on stderr; the commands report errors once, on one line.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
	// kube-apiserver's transformers log each failed decryption through klog; the
	// reports already name those keys, and logs must not grow with the keyspace.
	silenceKlog()
	limitMemory()
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// defaultMemoryLimit is the Go runtime's soft memory limit unless GOMEMLIMIT is
// set. A run holds a few pages of objects at a time (tens of MB), but allocates
// about its keyspace's size in short-lived garbage; without a limit the collector
// lets that garbage, and so the RSS, grow with the allocation rate.
const defaultMemoryLimit = 64 << 20

// gRPC's buffer pool with the tiers its default lacks (etcdscan.BufferPool
// says why). gRPC reads its default pool for marshalling (a dial option does
// not reach it), and it may be replaced only before any gRPC use: hence an
// init of the command, not of a package.
func init() {
	experimental.SetDefaultBufferPool(etcdscan.BufferPool())
}

// defaultGCPercent is the collector's GOGC unless GOGC is set. The live heap of
// a run is small (12-20 MB: the scheme, the field manager's type converters and
// the pages in flight), so at Go's default of 100 the collector ran every 13 MB
// of garbage, some 250 times in a 50,000-secret key rotation; at 200 it runs
// half as often and the memory limit above still bounds the heap (measured
// side by side: 0.82x the CPU per object for verify, 0.90x for migrate, peak
// RSS 124 -> 139 MB and 137 -> 142 MB).
const defaultGCPercent = 200

func limitMemory() {
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
}

func silenceKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	err := app.Run(interspersed(app, args))
	if err == nil {
		return exitOK
	}
	var ce *codeError
	if errors.As(err, &ce) {
		if ce.err != nil && ce.code != exitStale && ce.code != exitUnreadable {
			fmt.Fprintf(stderr, "error: %v\n", ce.err)
		}
		return ce.code
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	if isUsage(err) {
		return exitUsage
	}
	return exitError
}

// isUsage recognises urfave/cli's own flag errors.
func isUsage(err error) bool {
	msg := err.Error()
	for _, s := range []string{"flag provided but not defined", "Required flag", "invalid value", "flag needs an argument", "No help topic", "invalid boolean"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func commonFlags() []cli.Flag {
	flags := append(append(etcdscan.Flags(), snapshotFlags()...), apiServerFlags()...)
	return append(flags,
		&cli.StringFlag{Name: "prefix", Value: "/registry", Usage: "etcd key prefix kube-apiserver uses (--etcd-prefix)", EnvVars: []string{"KEM_PREFIX"}},
		&cli.StringFlag{Name: "encryption-provider-config", Usage: "kube-apiserver EncryptionConfiguration file (unchanged format); none = identity"},
		&cli.Int64Flag{Name: "page-size", Value: etcdscan.DefaultPageSize, Usage: "keys per etcd range request"},
		&cli.StringSliceFlag{Name: "resource", Usage: "only this resource (repeatable): secrets, deployments.apps, widgets.example.com"},
		&cli.StringFlag{Name: "namespace", Usage: "only this namespace (needs --resource)"},
		&cli.StringSliceFlag{Name: "conversion-webhook", Usage: "NAMESPACE/SERVICE=URL: where to reach a CRD conversion webhook service offline (repeatable)"},
		&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile to this file"},
		&cli.StringFlag{Name: "memprofile", Usage: "write a heap profile to this file at exit"},
	)
}

func targetFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "target-version", Usage: "the Kubernetes release (MAJOR.MINOR) the cluster's kube-apiserver runs or is being upgraded to: store as that release's own kube-apiserver does (" + decode.TargetRange() + "); else from --apiserver-manifest's image, else kubeadm-config in etcd; migrate refuses when none says it"},
		&cli.StringFlag{Name: "storage-media-type", Value: decode.MediaTypeProtobuf, Usage: "kube-apiserver --storage-media-type for built-in resources"},
		&cli.IntFlag{Name: "concurrency", Value: 0, Usage: "decode/encode workers (0 = twice the number of CPUs)"},
	}
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

func newApp(stdout, stderr io.Writer) *cli.App {
	cli.HelpFlag = &cli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help"}
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version (see the version command)"}
	cli.VersionPrinter = func(c *cli.Context) {
		if err := writeVersion(c.App.Writer, "text"); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "error: %v\n", err)
		}
	}
	return &cli.App{
		Name:                  "kube-etcd-migrate",
		Version:               buildinfo.Get().Version,
		EnableBashCompletion:  true,
		Usage:                 "rewrite Kubernetes objects in etcd to the current storage version and encryption key, offline",
		Writer:                stdout,
		ErrWriter:             stderr,
		ExitErrHandler:        func(*cli.Context, error) {},
		CustomAppHelpTemplate: cli.AppHelpTemplate + "\n" + exitCodesHelpTx + "\n",
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageErr("%v", err)
		},
		Commands: []*cli.Command{
			inventoryCommand(),
			inspectCommand(),
			verifyCommand(),
			migrateCommand(),
			rollbackCommand(),
			quarantineCommand(),
			versionCommand(),
			completionCommand(),
		},
	}
}

func commandUsageError(c *cli.Context, err error, _ bool) error {
	return usageErr("%s: %v", c.Command.Name, err)
}

// session is what every command opens: etcd (or a snapshot file's private
// copy), profiling, the pipeline.
type session struct {
	cli      *clientv3.Client
	snap     *snapshotfile.Snapshot // a --snapshot-file restored (commands that write)
	file     *snapshotdb.File       // a --snapshot-file read in place (read-only commands)
	env      *pipeline.Env
	enc      *decode.Encryption // loaded before Setup (to read kubeadm-config), handed to it
	stopProf func()
}

func (s *session) close() {
	if s.env != nil {
		s.env.Close()
	}
	if s.enc != nil {
		s.enc.Close()
	}
	if s.cli != nil {
		s.cli.Close()
	}
	if s.snap != nil {
		s.snap.Close()
	}
	if s.file != nil {
		s.file.Close()
	}
	if s.stopProf != nil {
		s.stopProf()
	}
}

func connect(ctx context.Context, c *cli.Context) (*clientv3.Client, error) {
	api, err := apiServerConfig(c)
	if err != nil {
		return nil, err
	}
	cfg, err := etcdConfig(c, api)
	if err != nil {
		return nil, err
	}
	return etcdscan.Connect(ctx, cfg)
}

func open(ctx context.Context, c *cli.Context, withTarget bool) (*session, error) {
	s := &session{}
	stop, err := startProfiles(c)
	if err != nil {
		return nil, err
	}
	s.stopProf = stop
	if c.String("namespace") != "" && len(c.StringSlice("resource")) == 0 {
		s.close()
		return nil, usageErr("--namespace needs --resource (the keyspace is laid out by resource first)")
	}
	if c.Int64("page-size") <= 0 {
		s.close()
		return nil, usageErr("--page-size must be positive")
	}
	webhooks, err := parseWebhooks(c.StringSlice("conversion-webhook"))
	if err != nil {
		s.close()
		return nil, err
	}
	api, err := apiServerConfig(c)
	if err != nil {
		s.close()
		return nil, err
	}
	snapshotFile := c.String("snapshot-file")
	var ecfg etcdscan.Config
	if snapshotFile == "" {
		if ecfg, err = etcdConfig(c, api); err != nil {
			s.close()
			return nil, err
		}
	}
	// kube-apiserver's feature gates and emulated version are process-wide:
	// its strategies and defaulting read them, as in kube-apiserver itself.
	if err := api.Apply(); err != nil {
		s.close()
		return nil, usageErr("%v", err)
	}
	var cli *clientv3.Client
	if snapshotFile != "" && readsInPlace(c) {
		if s.file, err = openSnapshotFile(c); err != nil {
			s.close()
			return nil, err
		}
	} else if snapshotFile != "" {
		if s.snap, err = openSnapshot(ctx, c); err != nil {
			s.close()
			return nil, err
		}
		cli = s.snap.Client
	} else {
		if cli, err = etcdscan.Connect(ctx, ecfg); err != nil {
			s.close()
			return nil, err
		}
		s.cli = cli
	}
	api.EtcdPrefix = fromAPIServer(c, api, "prefix", "etcd-prefix", api.EtcdPrefix)
	api.EncryptionConfig = fromAPIServer(c, api, "encryption-provider-config", "encryption-provider-config", api.EncryptionConfig)
	cfg := pipeline.Config{
		APIServer:        api,
		Prefix:           api.EtcdPrefix,
		EncryptionConfig: api.EncryptionConfig,
		Resources:        c.StringSlice("resource"),
		Namespace:        c.String("namespace"),
		PageSize:         c.Int64("page-size"),
		WebhookURLs:      webhooks,
		Revision:         c.Int64("revision"),
		SnapshotFile:     snapshotFile,
	}
	if s.snap != nil && cfg.Revision == 0 && hasFlag(c, "revision") {
		// Read-only: exactly the snapshot's revision, whatever the private etcd does.
		cfg.Revision = s.snap.Info.Revision
	}
	if s.file != nil && cfg.Revision == 0 && hasFlag(c, "revision") {
		cfg.Revision = s.file.Info.Revision
	}
	if withTarget && api.Release == "" {
		// Nothing said which release the cluster runs: kubeadm says it in etcd.
		var src etcdscan.Source = etcdscan.ClientSource{Client: cli}
		if s.file != nil {
			src = s.file
		}
		if err := releaseFromCluster(ctx, c, s, src, api, &cfg); err != nil {
			s.close()
			return nil, err
		}
	}
	if withTarget {
		cfg.TargetVersion = api.Release
		api.StorageMediaType = fromAPIServer(c, api, "storage-media-type", "storage-media-type", api.StorageMediaType)
		cfg.StorageMediaType = api.StorageMediaType
		cfg.Concurrency = c.Int("concurrency")
	}
	var env *pipeline.Env
	if s.file != nil {
		env, err = pipeline.SetupSource(ctx, s.file, cfg)
	} else {
		env, err = pipeline.Setup(ctx, cli, cfg)
	}
	// After Setup, success or not: the line names the KMS endpoints mapped
	// while the encryption configuration was loaded.
	reportAPIServer(c, api)
	if err != nil {
		s.close()
		// A path of the manifest the tool cannot reach: the configuration
		// given is wrong, as for the manifest's own paths (apiServerConfig).
		var unmapped *apiserverconfig.UnmappedKMSEndpointError
		if errors.As(err, &unmapped) {
			return nil, usageErr("%v", err)
		}
		if strings.Contains(err.Error(), "--target-version") || strings.Contains(err.Error(), "--resource") || strings.Contains(err.Error(), "--storage-media-type") {
			return nil, usageErr("%v", err)
		}
		return nil, err
	}
	for _, w := range env.Warnings {
		fmt.Fprintln(c.App.ErrWriter, "warning: "+w)
	}
	if api.Contradiction != "" && c.Command.Name != "migrate" {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s; judging for %s (a check before an upgrade)\n", api.Contradiction, api.Release)
	}
	s.env = env
	return s, nil
}

// releaseFromCluster reads the release kubeadm recorded in etcd
// (pipeline.ClusterRelease) and, when there is one, makes it the target and
// applies its feature gates and emulation again. The encryption providers
// loaded for it are handed to Setup.
func releaseFromCluster(ctx context.Context, c *cli.Context, s *session, etcd etcdscan.Source, api *apiserverconfig.Config, cfg *pipeline.Config) error {
	enc, err := pipeline.LoadEncryption(ctx, *cfg)
	if err != nil {
		return err
	}
	s.enc = enc
	cfg.Encryption = enc
	rel, err := pipeline.ClusterRelease(ctx, etcd, cfg.Prefix, enc)
	if err != nil {
		// Not fatal: the release is then unknown, which migrate refuses and
		// verify states.
		fmt.Fprintf(c.App.ErrWriter, "warning: the release in kubeadm's ClusterConfiguration cannot be read: %v\n", err)
		return nil
	}
	if rel == "" {
		return nil
	}
	if err := api.SetRelease(rel, apiserverconfig.FromKubeadm); err != nil {
		return usageErr("%v; give --target-version", err)
	}
	if err := api.Apply(); err != nil {
		return usageErr("%v", err)
	}
	return nil
}

// knowTheRelease refuses to write when nothing said which Kubernetes release
// the cluster's kube-apiserver runs (or is being upgraded to): the storage
// versions, served versions and field managers differ by release, and bytes
// written for the wrong one are rewritten, or misread, by the right one. A dry
// run writes nothing and goes on, stating the release it assumed.
func knowTheRelease(c *cli.Context, env *pipeline.Env) error {
	api := env.Config.APIServer
	if api != nil && api.Contradiction != "" {
		return usageErr("%s; give the release the cluster's kube-apiserver will run, or the manifest it will run with; nothing was written", api.Contradiction)
	}
	if api != nil && api.Release != "" {
		return nil
	}
	if c.Bool("dry-run") {
		fmt.Fprintf(c.App.ErrWriter, "warning: dry run for kube-apiserver %s, assumed: nothing said which release the cluster runs (--target-version, --apiserver-manifest, kubeadm-config in etcd)\n", decode.LinkedRelease())
		return nil
	}
	return usageErr("which Kubernetes release does the cluster's kube-apiserver run? nothing said it (no --target-version, no --apiserver-manifest image, no kubeadm-config in etcd): give --target-version (one of %s) or --apiserver-manifest; nothing was written", strings.Join(decode.TargetVersions(), ", "))
}

func parseWebhooks(vals []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vals {
		name, url, ok := strings.Cut(v, "=")
		if !ok || !strings.Contains(name, "/") || !strings.HasPrefix(url, "https://") {
			return nil, usageErr("--conversion-webhook %q: want NAMESPACE/SERVICE=https://HOST:PORT[/PATH]", v)
		}
		out[name] = url
	}
	return out, nil
}

func startProfiles(c *cli.Context) (func(), error) {
	var stops []func()
	if p := c.String("cpuprofile"); p != "" {
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
	if p := c.String("memprofile"); p != "" {
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

// signalContext is cancelled on SIGINT/SIGTERM; a second signal exits at once.
func signalContext(stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		n := 0
		for range ch {
			n++
			if n == 1 {
				fmt.Fprintln(stderr, "\nstopping: finishing in-flight writes (signal again to abort now)")
				cancel()
				continue
			}
			snapshotfile.RemoveTempDirs()
			decode.RemoveTempDirs()
			os.Exit(130)
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

// countKeys counts the selected keys (count-only range requests are cheap) for the
// progress bar; 0 when unknown.
func countKeys(ctx context.Context, env *pipeline.Env) int64 {
	var n int64
	for _, p := range env.Prefixes {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		count, err := env.Source.Count(ctx, p)
		cancel()
		if err != nil {
			return 0
		}
		n += count
	}
	return n
}
