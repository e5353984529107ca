package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/writerun"
)

func rollbackCommand() *cli.Command {
	return &cli.Command{
		Name:  "rollback",
		Usage: "undo run ID and every later run, newest first (--run), or put back the values one journal replaced (--journal); keys changed since are skipped",
		Flags: append(append(append(append(etcdFlags(), apiServerFlags()...), livenessFlags()...), spaceFlags()...),
			&cli.StringFlag{Name: "run", Usage: "undo this run (an ID from 'kube-etcd-migrate runs') and every later one, newest first"},
			&cli.StringFlag{Name: "journal", Usage: "undo the writes this journal records (a run directory's journal, or one written with 'migrate --journal')"},
			&cli.StringFlag{Name: "encryption-provider-config", Usage: "the EncryptionConfiguration kube-apiserver will run with (else the one --apiserver-manifest names): every value put back is decrypted with it first, and a value it cannot decrypt refuses the rollback; without either, a rollback that would put back an encrypted value is refused"},
			&cli.BoolFlag{Name: "allow-unverified-journal", Usage: "put back the values of a journal written before journal records were checksummed (unverifiable: a damaged record cannot be told from a good one)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "say what would be restored, skipped or left, write nothing"},
			stateDirFlag(),
			&cli.StringFlag{Name: "undo-dir", Usage: "keep the rollback's own undo (its journal and the snapshot before its first write) in DIR/ID (mode 0700) instead of its run directory, e.g. on another filesystem when the state directory's has no room: the runs undone are still read from --state-dir, and the rollback is recorded there (runs lists it, 'rollback --run ID' of it finds its undo)"},
			&cli.BoolFlag{Name: "no-undo", Usage: "DANGEROUS: keep no journal and no snapshot of what the rollback overwrites"},
			outputFlag("table", "table", "json")),
		Action:       cmdRollback,
		OnUsageError: commandUsageError,
	}
}

// rollbackOptions are rollback's flags.
type rollbackOptions struct {
	io    streams
	prov  provenance
	etcd  etcdOptions
	api   apiServerOptions
	live  livenessOptions
	space spaceOptions
	// undo is the rollback's own undo (--state-dir, --no-undo); the runs it
	// undoes are in the same state directory.
	undo   undoOptions
	output string
	// runID and journal are --run and --journal: what to undo.
	runID, journal string
	dryRun         bool
	// encryptionConfig is --encryption-provider-config (else the
	// manifest's); allowUnverified is --allow-unverified-journal.
	encryptionConfig string
	allowUnverified  bool
}

func newRollbackOptions(c *cli.Context) *rollbackOptions {
	dryRun := c.Bool("dry-run")
	return &rollbackOptions{
		io:      streamsOf(c),
		prov:    newProvenance(c),
		etcd:    newEtcdOptions(c),
		api:     newAPIServerOptions(c),
		live:    newLivenessOptions(c),
		space:   newSpaceOptions(c),
		undo:    undoOptions{stateDir: writerun.StateDir(c.String("state-dir")), noUndo: c.Bool("no-undo"), undoDir: c.String("undo-dir")},
		output:  c.String("output"),
		runID:   c.String("run"),
		journal: c.String("journal"),
		dryRun:  dryRun,

		encryptionConfig: c.String("encryption-provider-config"),
		allowUnverified:  c.Bool("allow-unverified-journal"),
	}
}

// validate refuses, before anything is opened, what rollback's flags alone
// refuse, then a --journal that is not there.
func (o *rollbackOptions) validate() error {
	if (o.runID == "") == (o.journal == "") {
		return usageErr("rollback: give --run ID (see 'kube-etcd-migrate runs') or --journal FILE")
	}
	if o.undo.noUndo && o.undo.undoDir != "" {
		return usageErr("--no-undo keeps no undo: leave out --undo-dir, or --no-undo")
	}
	if o.undo.stateDir == "" && (o.runID != "" || !o.undo.noUndo) {
		return usageErr("--state-dir: empty; give the state directory of the runs (default %s)", writerun.DefaultStateDir)
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	if err := o.api.validate(); err != nil {
		return err
	}
	if err := o.etcd.validate(); err != nil {
		return err
	}
	if o.journal != "" {
		if _, err := os.Stat(o.journal); err != nil {
			return usageErr("--journal: %v", err)
		}
	}
	return nil
}

func cmdRollback(c *cli.Context) error {
	o := newRollbackOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.io.errOut)
	defer stop()
	defer outliveTerminal(o.io.errOut, o.dryRun)()
	return o.runRollback(ctx)
}

// runRollback is the rollback command, its options validated.
func (o *rollbackOptions) runRollback(ctx context.Context) error {
	// The runs to undo, read from the state directory before etcd is
	// connected to: a --run that is not there is refused first.
	if err := o.otherJournalRefusal(); err != nil {
		return err
	}
	choice, err := o.choose()
	if err != nil {
		return err
	}
	// The runs' journals in the cluster's other etcds
	// (--etcd-servers-overrides): each read whole and checked, and each
	// etcd's liveness verdict in, before the first write on any etcd.
	var others []*etcdRollback
	for _, e := range choice.Others {
		others = append(others, &etcdRollback{EtcdJournals: e})
	}
	defer func() {
		for _, r := range others {
			r.close()
		}
	}()
	cli, kine, err := connectToWrite(ctx, o.io.errOut, o.etcd, o.prov, o.api, !o.dryRun)
	if err != nil {
		return err
	}
	defer kine.close()
	defer cli.Close()
	if err := kineFlags(kine, false, false, o.space.compactHistory); err != nil {
		return err
	}
	rb := &rollbackStage{o: o, cli: cli, kine: kine != nil, prefix: choice.Main.Prefix(), main: &choice.Main, undoes: choice.Undoes, others: others}
	cfg, err := kine.onKine(o.undo.runConfig(o.io.errOut, "rollback", cli, rb.prefix, o.dryRun, false, o.live))
	if err != nil {
		return err
	}
	if o.runID != "" {
		cfg.Since = choice.Main.WayBack // the oldest run undone
	}
	return doWrite(ctx, cfg, writerun.Stage{Check: rb.checkRollback, Write: rb.writeRollback})
}

// rollbackStage is rollback's work in a writing run: its checks, read-only
// and before the run directory exists (check), then the rollback (write).
type rollbackStage struct {
	o   *rollbackOptions
	cli *clientv3.Client
	// kine: cli is a SQLite datastore served through kine (the node's
	// file, or its copy for a dry run).
	kine   bool
	prefix string
	main   *rollback.EtcdJournals
	undoes []string
	others []*etcdRollback

	opts      rollback.RollbackOptions
	preflight []string
	refused   error
}

// checkRollback reads every journal whole and checks what the rollback needs in
// every etcd, before anything is written anywhere.
func (rb *rollbackStage) checkRollback(ctx context.Context, wr *writerun.Run) error {
	o := rb.o
	for _, r := range rb.others {
		if err := o.prepare(ctx, wr, r); err != nil {
			return prefixErr(r.label(), err)
		}
	}
	// The liveness window (the run's watch) runs while the journals are
	// checked and the preflight goes on; the first write waits for its
	// verdict, and another writer stops the rollback.
	rb.opts = rollback.RollbackOptions{DryRun: o.dryRun, CompactHistory: o.space.compactHistory, AllowUnverified: o.allowUnverified, Watch: wr.MainWatch()}
	cfg, closeEnc, err := o.checkConfig(ctx, rb.main, rb.prefix)
	if err != nil {
		return err
	}
	defer closeEnc()
	cfg.Manifest = o.api.manifestFile()
	if rb.kine {
		if cfg.Kine, err = o.api.load(); err != nil {
			return err
		}
	}
	if !o.undo.noUndo {
		room := rollback.UndoRoom{Dir: string(o.undo.stateDir), DirInput: input.StateDir}
		room.EtcdDataDir, room.EtcdDataFrom = o.api.foundEtcdData()
		if o.undo.undoDir != "" {
			room.Dir, room.DirInput = o.undo.undoDir, input.UndoDir
		}
		cfg.Room = &room
	}
	checked, err := o.checkEtcd(ctx, rb.cli, cfg)
	if err != nil {
		if errors.As(err, new(*writerun.PluginStopError)) {
			return fmt.Errorf("rollback stopped before its first write: %w; nothing was written: once the plugin answers again, run the same rollback again", err)
		}
		return err
	}
	rb.opts.Check, rb.preflight, rb.refused = checked.Undo, checked.Preflight, checked.Refused
	rb.opts.Quota = &checked.Quota
	return nil
}

// checkConfig is what the rollback checks in an etcd before its first write,
// of the journals of js, from the flags: the encryption configuration loaded
// (closeEnc releases it once the journals are read).
func (o *rollbackOptions) checkConfig(ctx context.Context, js *rollback.EtcdJournals, prefix string) (cfg rollback.CheckConfig, closeEnc func(), err error) {
	cfg = rollback.CheckConfig{Journals: js.Specs, WayBack: js.WayBack, Prefix: prefix, AllowUnverified: o.allowUnverified, DryRun: o.dryRun, CompactHistory: o.space.compactHistory, QuotaBackendBytes: o.space.quotaBackendBytes, Spell: flagOf}
	enc, configured, _, err := loadEncryption(ctx, o.api, o.prov, o.encryptionConfig)
	if err != nil {
		return cfg, nil, err
	}
	if configured {
		cfg.Encryption = enc
	}
	return cfg, func() { enc.Close() }, nil
}

// checkEtcd runs the rollback's checks in one etcd (rollback.Check), says
// the journals' warning, and gives a refusal its exit code: 2 when no
// encryption configuration was given and values put back are encrypted (a
// flag is missing), else 1.
func (o *rollbackOptions) checkEtcd(ctx context.Context, cli *clientv3.Client, cfg rollback.CheckConfig) (*rollback.Checked, error) {
	checked, err := rollback.Check(ctx, cli, cfg)
	if checked != nil {
		if w := checked.Undo.Warning(flagOf); w != "" {
			fmt.Fprintln(o.io.errOut, "warning: "+w)
		}
		checked.Refused = usageIfNoConfig(checked.Refused)
	}
	return checked, usageIfNoConfig(err)
}

// usageIfNoConfig gives exit 2 to a refusal for want of the encryption
// configuration.
func usageIfNoConfig(err error) error {
	if errors.As(err, new(*writerun.NoEncryptionConfigError)) {
		return &codeError{code: exitUsage, err: err}
	}
	return err
}

// writeRollback undoes the journals, the main etcd's then the others', with the
// rollback's own undo in its run directory.
func (rb *rollbackStage) writeRollback(ctx context.Context, wr *writerun.Run) (writerun.Result, error) {
	o, opts := rb.o, rb.opts
	var res rollback.RollbackResult
	opts.Lock = wr.Lock
	opts.SaveSnapshot = wr.SaveSnapshot()
	if u := wr.Dir(); u != nil {
		if err := u.SetUndoes(rb.undoes); err != nil {
			return writerun.Result{}, err
		}
		opts.OnPreflight = func(line string) error {
			if line == "" {
				return wr.Record("", rb.preflight)
			}
			return wr.Record("", append(slices.Clip(rb.preflight), line))
		}
		mainEtcd, err := wr.AddEtcd(ctx, writerun.EtcdSpec{Endpoints: rb.cli.Endpoints(), Client: rb.cli, Prefix: rb.prefix})
		if err != nil {
			return writerun.Result{}, err
		}
		j, err := mainEtcd.OpenJournal(ctx, "rollback", rb.prefix)
		if err != nil {
			return writerun.Result{}, err
		}
		if j != nil {
			defer j.Close()
			opts.Journal, opts.Snapshot = j, mainEtcd.Snapshot
		}
	}
	res, err := rollback.RollbackJournals(ctx, rb.cli, &etcdscan.Writer{Client: rb.cli, Kine: rb.kine}, rb.main.Paths(), opts)
	res.Preflight = append(rb.preflight, res.Preflight...)
	if len(rb.others) > 0 {
		err = o.finishEtcds(ctx, wr, rb.others, rb.cli.Endpoints(), &res, err, rb.refused)
		return writerun.Result{Written: res.Written(), Summary: res}, err
	}
	done := writerun.Result{Written: res.Written(), Summary: res}
	if werr := printReport(o.io.out, o.output, rollbackReport{res}); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return done, stoppedByWriter(err)
	}
	if rb.refused != nil {
		return done, rb.refused // a dry run: the rollback would be refused
	}
	if res.Failed > 0 {
		return done, &codeError{code: exitError, err: fmt.Errorf("%d key(s) could not be restored", res.Failed)}
	}
	return done, nil
}

// choose is what the rollback undoes (--run or --journal), read from the
// state directory, its refusals named by the flags.
func (o *rollbackOptions) choose() (*rollback.Choice, error) {
	if o.journal != "" {
		return rollback.ChooseJournal(o.undo.stateDir, o.journal), nil // there (validate)
	}
	runID := o.runID
	c, err := rollback.ChooseRun(o.undo.stateDir, runID)
	var nf *writerun.NotFoundError
	if errors.As(err, &nf) {
		return nil, usageErr("--run: %v", err)
	}
	var gap *writerun.GapError
	if errors.As(err, &gap) {
		// Refused as a run with its journal gone is: nothing written.
		way := fmt.Sprintf("run %s's snapshot %s is the way back to the state before it", gap.From.ID, gap.From.Snapshot)
		if gap.Next != "" {
			way = fmt.Sprintf("undo only the runs after the gap (--run %s), or %s", gap.Next, way)
		}
		return nil, fmt.Errorf("--run %s: %w; %s (if the missing runs wrote nothing, undo the runs that are left one journal at a time, newest first, with --journal)", runID, err, way)
	}
	if err != nil {
		return nil, fmt.Errorf("--run %s: %w", runID, err)
	}
	return c, nil
}

// loadEncryption loads the encryption configuration kube-apiserver runs
// with, as the commands that read values take it: --encryption-provider-config
// (flag, when given on the command line), else the one --apiserver-manifest
// or --apiserver-flags-file names (its KMS sockets mapped through the
// manifest's hostPath volumes); configured says whether either was given
// (else: identity for every resource, nothing said).
func loadEncryption(ctx context.Context, apiOpts apiServerOptions, prov provenance, flag string) (*encryption.Transformers, bool, *apiserverconfig.Config, error) {
	api, err := apiOpts.load()
	if err != nil {
		return nil, false, nil, err
	}
	path := api.EncryptionConfig
	if prov.onCommandLine("encryption-provider-config") {
		path = flag
	}
	configured := prov.onCommandLine("encryption-provider-config") || api.File != ""
	enc, err := encryption.LoadWith(ctx, path, encryption.Options{MapKMSEndpoint: api.KMSEndpointMapper(path)})
	if err != nil {
		return nil, false, nil, targetError(err)
	}
	return enc, configured, api, nil
}
