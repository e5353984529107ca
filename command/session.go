package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/snapshotfile"
	"kube-etcd-migrate/snapshotout"
	"kube-etcd-migrate/target"
)

// session is what every command opens: etcd (or a snapshot file's private
// copy), profiling, the pipeline.
type session struct {
	cli      *clientv3.Client
	snap     *snapshotfile.Snapshot // a --snapshot-file restored (commands that write)
	file     *snapshotdb.File       // a --snapshot-file read in place (read-only commands, migrate)
	out      *snapshotout.Writer    // migrate's --output-snapshot, written from file
	env      *pipeline.Env
	stopProf func()
}

func (s *session) close() {
	if s.env != nil {
		s.env.Close()
	}
	if s.cli != nil {
		s.cli.Close()
	}
	if s.snap != nil {
		s.snap.Close()
	}
	if s.out != nil {
		s.out.Close()
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
	env := &envReport{}
	cfg, err := etcdConfig(c, api, env)
	if err != nil {
		return nil, err
	}
	env.print(c)
	cli, err := etcdscan.Connect(ctx, cfg)
	return cli, etcdError(err)
}

func open(ctx context.Context, c *cli.Context, use targetUse) (*session, error) {
	return openFile(ctx, c, use, c.String("snapshot-file"), true)
}

// openFile is open with the snapshot file to read ("" for etcd) given: verify
// of several files opens each in turn (profiles started once, by the caller).
func openFile(ctx context.Context, c *cli.Context, use targetUse, snapshotFile string, profile bool) (*session, error) {
	s := &session{}
	if profile {
		stop, err := startProfiles(c)
		if err != nil {
			return nil, err
		}
		s.stopProf = stop
	}
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
	var ecfg etcdscan.Config
	envRep := &envReport{}
	if snapshotFile == "" {
		if ecfg, err = etcdConfig(c, api, envRep); err != nil {
			s.close()
			return nil, err
		}
	}
	api.EtcdPrefix = fromAPIServer(c, api, envRep, "prefix", "etcd-prefix", api.EtcdPrefix)
	api.EncryptionConfig = fromAPIServer(c, api, envRep, "encryption-provider-config", "encryption-provider-config", api.EncryptionConfig)
	if use != targetNone {
		api.StorageMediaType = fromAPIServer(c, api, envRep, "storage-media-type", "storage-media-type", api.StorageMediaType)
	}
	// Before connecting: a connection that fails says where its values came from.
	envRep.print(c)
	var cli *clientv3.Client
	if snapshotFile != "" && readsInPlace(c) {
		if s.file, err = openSnapshotFile(c, snapshotFile); err != nil {
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
			return nil, etcdError(err)
		}
		s.cli = cli
	}
	cfg := pipeline.Config{
		Prefix:       api.EtcdPrefix,
		Resources:    c.StringSlice("resource"),
		Namespace:    c.String("namespace"),
		PageSize:     c.Int64("page-size"),
		WebhookURLs:  webhooks,
		WebhookHint:  webhookHint,
		Revision:     c.Int64("revision"),
		SnapshotFile: snapshotFile,
		Target:       targetInput(c, api, use),
	}
	if use != targetNone {
		cfg.Concurrency = c.Int("concurrency")
	}
	if s.snap != nil && cfg.Revision == 0 && hasFlag(c, "revision") {
		// Read-only: exactly the snapshot's revision, whatever the private etcd does.
		cfg.Revision = s.snap.Info.Revision
	}
	if s.file != nil && cfg.Revision == 0 && hasFlag(c, "revision") {
		cfg.Revision = s.file.Info.Revision
	}
	var env *pipeline.Env
	if s.file != nil {
		env, err = pipeline.SetupSource(ctx, s.file, cfg)
	} else {
		env, err = pipeline.Setup(ctx, cli, cfg)
	}
	// After Setup, success or not: the line names the KMS endpoints mapped
	// while the encryption configuration was loaded.
	var tgt *target.Target
	if env != nil {
		tgt = env.Target
	}
	reportAPIServer(c, api, tgt)
	if err != nil {
		s.close()
		return nil, targetError(err)
	}
	for _, note := range env.Target.Notes() {
		fmt.Fprintln(c.App.ErrWriter, note)
	}
	for _, w := range env.Warnings {
		fmt.Fprintln(c.App.ErrWriter, "warning: "+w)
	}
	if api.Contradiction != nil && use != targetWrite {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s; judging for %s (a check before an upgrade)\n", cliMessage(api.Contradiction), env.Target.Release())
	}
	s.env = env
	return s, nil
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
			snapshotout.RemoveTempFiles()
			encryption.RemoveTempDirs()
			os.Exit(exitSignal)
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

// endpoints are the etcd endpoints the session writes to (none for a snapshot file).
func (s *session) endpoints() []string {
	if s.cli == nil {
		return nil
	}
	return s.cli.Endpoints()
}
