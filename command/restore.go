package command

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/restore"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/writerun"
)

func restoreCommand() *cli.Command {
	flags := slices.DeleteFunc(append(commonFlags(), targetFlags()...), func(f cli.Flag) bool {
		switch f.Names()[0] {
		case "snapshot-file", "namespace", "encryption-only":
			return true
		}
		return false
	})
	return &cli.Command{
		Name:  "restore",
		Usage: "put chosen objects of an etcd backup (--snapshot-file) back into the live etcd, as today's kube-apiserver stores them (uids, owners, status kept; create-only unless --overwrite; journaled for rollback)",
		Flags: append(append(flags,
			outputFlag("table", "table", "json"),
			&cli.StringFlag{Name: "snapshot-file", Usage: "the etcd backup to restore from (etcdctl snapshot save, or a member's member/snap/db with --skip-hash-check); read in place, never modified (required)"},
			&cli.StringFlag{Name: "backup-encryption-provider-config", Usage: "the EncryptionConfiguration the backup was written under (its keys, KMS plugins included); default: today's (--encryption-provider-config, or the manifest's)"},
			&cli.StringSliceFlag{Name: "namespace", Usage: "restore this namespace's objects (repeatable); its Namespace object comes too when the live etcd lacks it"},
			&cli.StringSliceFlag{Name: "name", Usage: "restore only objects of this name (repeatable)"},
			&cli.StringSliceFlag{Name: "key-prefix", Usage: "restore only keys under this raw etcd key prefix, under kube-apiserver's prefix (repeatable; --key is etcd's TLS client key)"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace an object the live etcd holds with another value (compare-and-swap on its mod revision); by default it is left and reported \"exists\""},
			&cli.BoolFlag{Name: "allow-dangling-owners", Usage: "restore objects whose ownerReferences name an owner neither in the live etcd nor in the selection (the garbage collector deletes them once kube-controller-manager runs)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "say what would be created, overwritten, left or skipped; write nothing"},
			&cli.StringFlag{Name: "to-manifests", Usage: "write the selection to this directory instead of etcd, one YAML file per object for kubectl create -f (mode 0600; server-set fields, ownerReferences and status left out: new uids, controllers adopt by selector); etcd is only read, kube-apiserver may run"},
			&cli.IntFlag{Name: "batch-ops", Value: 16, Usage: "writes per CAS transaction"},
		), append(undoFlags(), livenessFlags()...)...),
		Action:       cmdRestore,
		OnUsageError: commandUsageError,
	}
}

// restoreOptions are restore's flags.
type restoreOptions struct {
	scan *scanOptions
	undo undoOptions
	live livenessOptions

	output              string
	backup, backupConf  string
	sel                 restore.Selector
	overwrite, dangling bool
	dryRun              bool
	batchOps            int
	toManifests         string
}

func newRestoreOptions(c *cli.Context) *restoreOptions {
	scan := newScanOptions(c, targetWrite)
	o := &restoreOptions{
		scan:       scan,
		undo:       newUndoOptions(c),
		live:       newLivenessOptions(c),
		output:     c.String("output"),
		backup:     scan.snapshotFile,
		backupConf: c.String("backup-encryption-provider-config"),
		sel: restore.Selector{
			Namespaces: c.StringSlice("namespace"),
			Resources:  scan.resources,
			Names:      c.StringSlice("name"),
			Keys:       c.StringSlice("key-prefix"),
		},
		overwrite: c.Bool("overwrite"),
		dangling:  c.Bool("allow-dangling-owners"),
		dryRun:    c.Bool("dry-run"),
		batchOps:  c.Int("batch-ops"),

		toManifests: c.String("to-manifests"),
	}
	// The session is the live etcd's, every resource's (its CRDs, today's
	// target): the backup is read on its own, and the selectors are restore's.
	scan.snapshotFile, scan.resources, scan.namespace = "", nil, ""
	scan.api.liveCluster()
	return o
}

// validate refuses, before anything is opened, what restore's flags alone
// refuse.
func (o *restoreOptions) validate() error {
	if err := o.undo.validate(); err != nil {
		return err
	}
	if o.backup == "" {
		return usageErr("--snapshot-file: give the etcd backup to restore from")
	}
	if len(o.sel.Namespaces) == 0 && len(o.sel.Resources) == 0 && len(o.sel.Names) == 0 && len(o.sel.Keys) == 0 {
		return usageErr("select what to restore: --namespace, --resource, --name or --key-prefix (a restore never takes the whole backup: that is etcdutl snapshot restore)")
	}
	if o.toManifests != "" && (o.dryRun || o.overwrite || o.dangling) {
		return usageErr("--to-manifests writes files, never etcd: leave out --dry-run, --overwrite and --allow-dangling-owners (kubectl create refuses what exists; the manifests carry no ownerReferences)")
	}
	if !o.dryRun && o.toManifests == "" && o.undo.noUndo {
		return usageErr("--no-undo: restore always keeps its journal for 'rollback --run'; leave out --no-undo")
	}
	if n := o.batchOps; n <= 0 || n > 128 {
		return usageErr("--batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)")
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	if err := o.scan.validate(); err != nil {
		return err
	}
	return o.undo.checkPath(o.dryRun)
}

func cmdRestore(c *cli.Context) error {
	o := newRestoreOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	defer outliveTerminal(o.scan.io.errOut, o.dryRun)()
	return o.runRestore(ctx)
}

// runRestore is the restore command, its options validated: the backup
// opened (a damaged one refused before the live etcd is), the live etcd's
// session, then the stage in a writing run.
func (o *restoreOptions) runRestore(ctx context.Context) error {
	ios := o.scan.io
	f, err := snapshotdb.Open(o.backup, snapshotdb.Options{SkipHashCheck: o.scan.skipHashCheck})
	if err != nil {
		return fmt.Errorf("--snapshot-file: %w; nothing was written", err)
	}
	defer f.Close()
	fmt.Fprintf(ios.errOut, "backup %s: %s, revision %d; read in place, read-only\n", f.Info.Path, hashWords(f.Info.Hash), f.Info.Revision)
	o.scan.writes = !o.dryRun && o.toManifests == ""
	s, err := openToWrite(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	backupEnc, backupConf := s.env.Encryption, s.env.Encryption.Path
	if o.backupConf != "" {
		t, err := encryption.Load(ctx, o.backupConf)
		if err != nil {
			return usageErr("--backup-encryption-provider-config %s: %v", o.backupConf, err)
		}
		defer t.Close()
		backupEnc, backupConf = t, "--backup-encryption-provider-config "+o.backupConf
	} else if backupConf != "" {
		backupConf = "today's encryption configuration " + backupConf + " (--backup-encryption-provider-config names the backup's)"
	}
	if o.toManifests != "" {
		return o.restoreToManifests(ctx, s, f, backupEnc, backupConf)
	}
	cfg, err := s.kine.onKine(o.undo.runConfig(ios.errOut, "restore", s.cli, s.env.Resolver.Prefix(), o.dryRun, false, o.live))
	if err != nil {
		return err
	}
	return doWrite(ctx, cfg, writerun.Stage{Write: func(ctx context.Context, wr *writerun.Run) (writerun.Result, error) {
		writeCtx, cancelWrites := context.WithCancel(context.Background())
		defer cancelWrites()
		res, runErr := restore.Run(ctx, s.env, restore.Options{
			Backup: f, BackupName: o.backup,
			BackupEncryption: backupEnc, BackupEncryptionName: backupConf,
			Select:    o.sel,
			Overwrite: o.overwrite, AllowDanglingOwners: o.dangling, DryRun: o.dryRun,
			Journal: wr.Journal(), Snapshot: wr.Snapshot(), SaveSnapshot: wr.SaveSnapshot(), Lock: wr.Lock,
			OnPreflight: func(lines []string) error {
				// Said before the first write: what the backup needs (its
				// keys) and every check passed.
				for _, l := range lines {
					fmt.Fprintln(ios.errOut, "preflight: "+l)
				}
				return wr.Record("", lines)
			},
			Watch:        wr.MainWatch(),
			StateDir:     wr.StateDir(),
			BatchOps:     o.batchOps,
			WriteContext: writeCtx,
		})
		var written int64
		if res != nil {
			written = res.Written
			if err := printReport(ios.out, o.output, restoreReport{res}); err != nil {
				return writerun.Result{Written: written, Summary: res}, err
			}
		}
		return writerun.Result{Written: written, Summary: res}, restoreOutcome(res, runErr)
	}})
}

// restoreOutcome is the command's error for what restore did: a refusal
// (named by its flag), failed writes, unreadable objects left.
func restoreOutcome(res *restore.Result, err error) error {
	var se *restore.SelectError
	switch {
	case errors.As(err, &se):
		flag := se.Option
		if flag == "key" {
			flag = "key-prefix"
		}
		return usageErr("--%s %s: %s; nothing was written", flag, se.Value, se.Msg)
	case err != nil:
		return stoppedByWriter(err)
	case res.Conflicts > 0 || res.Failed > 0:
		return &codeError{code: exitError, err: fmt.Errorf("%d object(s) changed since read, %d write(s) failed: run again", res.Conflicts, res.Failed)}
	case res.Unreadable > 0:
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d object(s) of the backup unreadable, not restored (listed)", res.Unreadable)}
	}
	return nil
}

// restoreToManifests is restore --to-manifests: the selection written as
// files, etcd only read; no writing run.
func (o *restoreOptions) restoreToManifests(ctx context.Context, s *session, f *snapshotdb.File, backupEnc *encryption.Transformers, backupConf string) error {
	ios := o.scan.io
	res, runErr := restore.Run(ctx, s.env, restore.Options{
		Backup: f, BackupName: o.backup,
		BackupEncryption: backupEnc, BackupEncryptionName: backupConf,
		Select:      o.sel,
		ToManifests: o.toManifests,
	})
	if res != nil {
		if err := printReport(ios.out, o.output, restoreReport{res}); err != nil {
			return err
		}
		if res.Secrets > 0 {
			fmt.Fprintf(ios.errOut, "warning: %s holds %d Secret(s) with their data (base64, not encrypted): the files are mode 0600; delete them once the objects are created\n", o.toManifests, res.Secrets)
		}
	}
	return restoreOutcome(res, runErr)
}
