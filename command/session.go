package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/target"
)

// session is what every command opens: etcd (or a snapshot file's private
// copy), profiling, the pipeline.
type session struct {
	cli      *clientv3.Client
	file     *snapshotdb.File   // a --snapshot-file, read in place
	out      *snapshotdb.Writer // migrate's or quarantine's --output-snapshot, written from file
	env      *pipeline.Env
	kine     *kineServed // k3s's or RKE2's datastore (SQLite, PostgreSQL, MySQL), served through kine
	stopProf func()
}

func (s *session) close() {
	if s.env != nil {
		s.env.Close()
	}
	if s.cli != nil {
		s.cli.Close()
	}
	s.kine.close()
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

// connect connects to etcd as etcdConfig says (rollback: no pipeline).
func connect(ctx context.Context, w io.Writer, o etcdOptions, prov provenance, apiOpts apiServerOptions) (*clientv3.Client, error) {
	return connectTo(ctx, w, o, prov, apiOpts, nil)
}

// connectTo is connect to the given endpoints (nil: the main etcd's), with
// the TLS files the flags or kube-apiserver's configuration name: another
// etcd of the cluster (--etcd-servers-overrides), as kube-apiserver reaches
// it.
func connectTo(ctx context.Context, w io.Writer, o etcdOptions, prov provenance, apiOpts apiServerOptions, endpoints []string) (*clientv3.Client, error) {
	cli, _, err := dial(ctx, w, o, prov, apiOpts, endpoints, false, false)
	return cli, err
}

// connectToWrite is connect for a command that writes the cluster
// (rollback): a SQLite datastore found on the node is served through kine
// (closed with the returned kineServed, nil for etcd) instead of refused:
// the node's file itself when write, a copy otherwise (a dry run).
func connectToWrite(ctx context.Context, w io.Writer, o etcdOptions, prov provenance, apiOpts apiServerOptions, write bool) (*clientv3.Client, *kineServed, error) {
	return dial(ctx, w, o, prov, apiOpts, nil, true, write)
}

// dial is connectTo (serve false: a SQLite datastore refused), and
// connectToWrite.
func dial(ctx context.Context, w io.Writer, o etcdOptions, prov provenance, apiOpts apiServerOptions, endpoints []string, serve, write bool) (*clientv3.Client, *kineServed, error) {
	api, err := apiOpts.load()
	apiOpts.reportFound(w) // what was found, even when its configuration is refused
	if err != nil {
		return nil, nil, err
	}
	env := &envReport{}
	cfg, err := etcdConfig(o, prov, api, env, w)
	if err != nil {
		return nil, nil, err
	}
	env.print(w)
	var k *kineServed
	if st := apiOpts.kineStore(prov); st != nil {
		switch {
		case apiOpts.command == "runs":
			return nil, nil, fmt.Errorf("%s's %s datastore (%s) keeps no record of the tool's runs (a run on it is recorded in the state directory of the host it ran on only)", st.installer, st.kind(), st.name)
		case !serve || endpoints != nil:
			return nil, nil, kineRefusal(apiOpts.command, st)
		}
		if k, err = serveKine(ctx, w, apiOpts.command, st, write, &cfg); err != nil {
			return nil, nil, err
		}
	}
	if endpoints != nil {
		cfg.Endpoints = endpoints
	}
	cli, err := etcdscan.Connect(ctx, cfg)
	if err != nil {
		k.close()
		return nil, nil, etcdError(err)
	}
	return cli, k, nil
}

// open opens what o reads (etcd, or its --snapshot-file) and sets up the
// pipeline.
func open(ctx context.Context, o *scanOptions) (*session, error) {
	return openFile(ctx, o, o.snapshotFile, true)
}

// openFile is open with the snapshot file to read ("" for etcd) given: verify
// of several files opens each in turn (profiles started once, by the caller).
// o has been validated: what is refused here needs a file or etcd read.
func openFile(ctx context.Context, o *scanOptions, snapshotFile string, profile bool) (*session, error) {
	s := &session{}
	if profile {
		stop, err := startProfiles(o.cpuprofile, o.memprofile)
		if err != nil {
			return nil, err
		}
		s.stopProf = stop
	}
	api, err := o.api.load()
	w := o.io.errOut
	o.api.reportFound(w) // what was found, even when its configuration is refused
	if err != nil {
		s.close()
		return nil, err
	}
	var ecfg etcdscan.Config
	envRep := &envReport{}
	part := etcdPart{resources: o.resources}
	if snapshotFile == "" {
		if ecfg, err = etcdConfig(o.etcd, o.prov, api, envRep, w); err != nil {
			s.close()
			return nil, err
		}
	}
	es, err := api.Etcds()
	if err == nil {
		part, err = o.part(es, o.command)
	} else {
		err = usageErr("%v", err)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	ecfg = etcdConfigFor(ecfg, part)
	api.EtcdPrefix = fromAPIServer(o.prov, api, envRep, "prefix", o.prefix, "etcd-prefix", api.EtcdPrefix)
	api.EncryptionConfig = fromAPIServer(o.prov, api, envRep, "encryption-provider-config", o.encryptionConfig, "encryption-provider-config", api.EncryptionConfig)
	if o.target.use != targetNone {
		api.StorageMediaType = fromAPIServer(o.prov, api, envRep, "storage-media-type", o.target.storageMediaType, "storage-media-type", api.StorageMediaType)
	}
	// Before connecting: a connection that fails says where its values came from.
	envRep.print(w)
	var cli *clientv3.Client
	// The SQLite datastore of k3s or RKE2, on the node or a backup of it
	// given as the snapshot file, is served through kine and read as etcd.
	var store *kineStore
	switch {
	case kinedb.IsSQLite(snapshotFile):
		store = &kineStore{db: snapshotFile, name: snapshotFile}
		if ecfg, err = o.etcd.config(); err != nil {
			s.close()
			return nil, usageErr("%v", err)
		}
	case snapshotFile == "":
		store = o.api.kineStore(o.prov)
	}
	if snapshotFile != "" && store == nil {
		if s.file, err = openSnapshotFile(o, snapshotFile); err != nil {
			s.close()
			return nil, err
		}
	} else {
		if store != nil {
			if s.kine, err = serveKine(ctx, w, o.command, store, o.writes, &ecfg); err != nil {
				s.close()
				return nil, err
			}
		}
		if cli, err = etcdscan.Connect(ctx, ecfg); err != nil {
			s.close()
			return nil, etcdError(err)
		}
		s.cli = cli
	}
	cfg := pipeline.Config{
		Prefix:       api.EtcdPrefix,
		Resources:    part.resources,
		Exclude:      part.exclude,
		Namespace:    o.namespace,
		PageSize:     o.pageSize,
		WebhookURLs:  o.webhooks,
		WebhookHint:  webhookHint,
		Revision:     o.revision,
		SnapshotFile: snapshotFile,
		Target:       targetInput(o.target, api),
	}
	if o.target.use != targetNone {
		cfg.Concurrency = o.target.concurrency
	}
	cfg.Target.KubeadmSource = o.kubeadmFrom
	if s.file != nil && cfg.Revision == 0 && o.revisionFlag {
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
	reportAPIServer(w, o.api, api, tgt)
	if err != nil {
		s.close()
		return nil, targetError(err)
	}
	for _, note := range env.Target.Notes() {
		fmt.Fprintln(w, note)
	}
	for _, warning := range env.Warnings {
		fmt.Fprintln(w, "warning: "+warning)
	}
	if api.Contradiction != nil && o.target.use != targetWrite {
		fmt.Fprintf(w, "warning: %s; judging for %s (a check before an upgrade)\n", cliMessage(api.Contradiction), env.Target.Release())
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
			snapshotdb.RemoveWriterFiles()
			encryption.RemoveTempDirs()
			removeKineDirs()
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
