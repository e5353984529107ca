package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
)

// snapshotFlags read an etcd snapshot file instead of a live etcd (every
// command but rollback).
func snapshotFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "snapshot-file", Usage: "read this etcd snapshot (etcdctl snapshot save, or a member's member/snap/db with --skip-hash-check) instead of a live etcd; the file is never modified: inventory, inspect, verify, migrate and quarantine --dry-run read it in place (migrate writes its --output-snapshot directly, in flat memory), quarantine restores a copy with etcd's own code into a private etcd under $TMPDIR (unix socket only), removed on exit. The etcd connection flags are ignored, but --user/--password if the snapshot has etcd auth enabled (quarantine's restored copy only: read in place, a file has no auth, and a warning says they are ignored)"},
		&cli.BoolFlag{Name: "skip-hash-check", Usage: "read a --snapshot-file without etcd's sha256 trailer (a member's member/snap/db) or whose trailer does not match, as etcdutl's --skip-hash-check"},
	}
}

// outputSnapshotFlags are for the commands that write into a snapshot file's copy.
func outputSnapshotFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "output-snapshot", Usage: "with --snapshot-file: write the result here as a new etcd snapshot (mode 0600, atomically; compacted: only the latest value of each key), then verify it"},
		&cli.BoolFlag{Name: "force", Usage: "replace an existing --output-snapshot"},
	}
}

// outputSnapshotOptions are outputSnapshotFlags as given.
type outputSnapshotOptions struct {
	path  string // --output-snapshot
	force bool
}

func newOutputSnapshotOptions(c *cli.Context) outputSnapshotOptions {
	return outputSnapshotOptions{path: c.String("output-snapshot"), force: c.Bool("force")}
}

// validate refuses --snapshot-file (in) and --output-snapshot together as a
// command that writes (a dry run or not) does not take them, before
// anything is opened.
func (o outputSnapshotOptions) validate(in string, dryRun bool) error {
	out := o.path
	switch {
	case out != "" && in == "":
		return usageErr("--output-snapshot needs --snapshot-file (a live etcd is written in place)")
	case in == "":
		return nil
	case dryRun && out != "":
		return usageErr("--output-snapshot with --dry-run: nothing would be written")
	case !dryRun && out == "":
		return usageErr("--snapshot-file %s is never modified: give --output-snapshot FILE for the result, or --dry-run", in)
	}
	return nil
}

// checkPath refuses an --output-snapshot that cannot be written (it exists
// without --force, it is the input, its directory is not writable): a look
// at the path only, before anything is opened.
func (o outputSnapshotOptions) checkPath(in string, dryRun bool) error {
	if in == "" || dryRun {
		return nil
	}
	if err := snapshotdb.CheckOutput(in, o.path, o.force); err != nil {
		return usageErr("%v", err)
	}
	return nil
}

// privateEtcdOptions are the private etcd's options for the snapshot file
// path: etcd auth from --user/--password, and a quota that is no limit to a
// copy (the file's own size twice, at least 8 GiB, at least
// --quota-backend-bytes).
func privateEtcdOptions(o *scanOptions, path string) snapshotdb.RestoreOptions {
	user, password := o.etcd.user, o.etcd.password
	if name, pass, ok := strings.Cut(user, ":"); ok && password == "" {
		user, password = name, pass
	}
	quota := int64(8 << 30)
	if q := o.quotaBackendBytes; q > quota {
		quota = q
	}
	if fi, err := os.Stat(path); err == nil && 2*fi.Size() > quota {
		quota = 2 * fi.Size()
	}
	return snapshotdb.RestoreOptions{Username: user, Password: password, QuotaBackendBytes: quota}
}

// openSnapshotFile opens --snapshot-file for reading in place and says on
// stderr what it is.
func openSnapshotFile(o *scanOptions, path string) (*snapshotdb.File, error) {
	f, err := snapshotdb.Open(path, snapshotdb.Options{SkipHashCheck: o.skipHashCheck})
	if err != nil {
		return nil, err
	}
	in := f.Info
	fmt.Fprintf(o.io.errOut, "snapshot %s: %s, revision %d (oldest readable %d), %d lease(s); read in place, read-only\n",
		in.Path, hashWords(in.Hash), in.Revision, max(in.CompactRevision, 1), in.Leases)
	if w := authIgnored(o.etcd, path); w != "" {
		fmt.Fprintln(o.io.errOut, "warning: "+w)
	}
	return f, nil
}

// authIgnored is the warning for etcd credentials given to a command that
// reads a --snapshot-file in place: etcd auth is enforced by an etcd server,
// and none reads the file, so the credentials have nothing to check them.
// They are ignored with one line rather than refused: ETCDCTL_USER and
// ETCDCTL_PASSWORD are often exported in the shell that runs the tool, and the
// same flags work for the commands that write (their restored copy enforces
// the snapshot's auth).
func authIgnored(o etcdOptions, path string) string {
	var set []string
	if o.userSet {
		set = append(set, "--user")
	}
	if o.passwordSet {
		set = append(set, "--password")
	}
	if len(set) == 0 {
		return ""
	}
	return fmt.Sprintf("%s ignored: %s is read in place, and a snapshot file has no etcd auth to check them (whoever can read the file can read every key in it; quarantine, which restores a copy, uses them)",
		strings.Join(set, " and "), path)
}

func hashWords(h snapshotdb.Hash) string {
	if h == snapshotdb.HashSkipped {
		return "sha256 not checked (--skip-hash-check; every record read through)"
	}
	return "sha256 verified"
}

// openSnapshot opens --snapshot-file and says on stderr what it is.
func openSnapshot(ctx context.Context, o *scanOptions) (*snapshotdb.Restored, error) {
	path := o.snapshotFile
	opts := privateEtcdOptions(o, path)
	opts.SkipHashCheck = o.skipHashCheck
	snap, err := snapshotdb.Restore(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	describeSnapshot(o.io.errOut, snap.Info)
	return snap, nil
}

func describeSnapshot(w io.Writer, in snapshotdb.RestoredInfo) {
	fmt.Fprintf(w, "snapshot %s: %s, revision %d (oldest readable %d), %d lease(s) holding %d key(s); read through a private copy, removed on exit\n",
		in.Path, hashWords(in.Hash), in.Revision, max(in.CompactRevision, 1), in.Leases, in.LeasedKeys)
}

// saveAndVerify writes the private etcd to --output-snapshot, then opens that
// file afresh (etcd's restore, as a restore after a disaster would) and verifies
// it with the same configuration. It prints the verdict and returns it.
func saveAndVerify(ctx context.Context, o *scanOptions, oo outputSnapshotOptions, s *session, w io.Writer) (*verify.Report, error) {
	out := oo.path
	if err := s.snap.Save(ctx, out, oo.force); err != nil {
		return nil, err
	}
	// The input's private etcd has done its work: stopped (its directory
	// removed) before OUT's starts, so that the two etcds' memory (each its
	// index of every key, and the pages of its database) is never held at once.
	_ = s.snap.Close()
	fi, err := os.Stat(out)
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: %w", out, err)
	}
	snap, err := snapshotdb.Restore(ctx, out, privateEtcdOptions(o, out))
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: written, but does not open again: %w", out, err)
	}
	defer snap.Close()
	fmt.Fprintf(w, "wrote %s (%s, mode 0600): revision %d, compacted to it, %d lease(s) holding %d key(s)\n", out, textfmt.Bytes(fi.Size()), snap.Info.Revision, snap.Info.Leases, snap.Info.LeasedKeys)
	cfg := s.env.Config
	cfg.SnapshotFile, cfg.Revision = out, 0
	cfg.Target = s.env.Target.Input()
	env, err := pipeline.Setup(ctx, snap.Client, cfg)
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: verify: %w", out, err)
	}
	defer env.Close()
	return verifyOutput(ctx, env, out, cfg.Resources, "restored afresh", w)
}

// buildAndVerify builds --output-snapshot from the input read in place and
// the run's writes (snapshotdb.Writer), then opens that file afresh, read in place
// as a restore after a disaster would read it, and verifies it with the same
// configuration. It prints the verdict and returns it.
func buildAndVerify(ctx context.Context, _ *scanOptions, oo outputSnapshotOptions, s *session, w io.Writer) (*verify.Report, error) {
	out := oo.path
	res, err := s.out.Finish(ctx, oo.force)
	s.out = nil
	if err != nil {
		return nil, err
	}
	// The input's indexes have done their work: dropped before OUT's are built.
	_ = s.file.Close()
	f, err := snapshotdb.Open(out, snapshotdb.Options{})
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: written, but does not open again: %w", out, err)
	}
	defer f.Close()
	if f.Info.Revision != res.Revision {
		return nil, fmt.Errorf("--output-snapshot %s: written at revision %d, but reads at revision %d", out, res.Revision, f.Info.Revision)
	}
	fmt.Fprintf(w, "wrote %s (%s, mode 0600): revision %d, compacted to it, %d lease(s) holding %d key(s)\n", out, textfmt.Bytes(res.Size), res.Revision, f.Info.Leases, res.LeasedKeys)
	cfg := s.env.Config
	cfg.SnapshotFile, cfg.Revision = out, 0
	cfg.Target = s.env.Target.Input()
	env, err := pipeline.SetupSource(ctx, f, cfg)
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: verify: %w", out, err)
	}
	defer env.Close()
	return verifyOutput(ctx, env, out, cfg.Resources, "read afresh", w)
}

// verifyOutput verifies OUT and prints the verdict line.
func verifyOutput(ctx context.Context, env *pipeline.Env, out string, resources []string, how string, w io.Writer) (*verify.Report, error) {
	rep, err := verify.Run(ctx, env, verify.Options{ShowKeys: -1})
	if err != nil {
		return nil, fmt.Errorf("--output-snapshot %s: %w", out, err)
	}
	sum := rep.Summary
	what := ""
	if len(resources) > 0 {
		what = " (" + strings.Join(resources, ", ") + ")"
	}
	fmt.Fprintf(w, "verified %s%s, %s: %d object(s), %d current, %d stale, %d unreadable: verify would exit %d\n",
		out, what, how, sum.Objects, sum.Current, sum.Stale, sum.Unreadable, rep.ExitCode())
	return rep, nil
}

// writeOutputSnapshot saves and verifies --output-snapshot after a run on a
// snapshot file that wrote all it had to; the verdict goes to stdout (stderr
// with -o json), and the exit is OUT's verification's (outputVerdict).
func writeOutputSnapshot(ctx context.Context, o *scanOptions, oo outputSnapshotOptions, output string, dryRun bool, s *session) error {
	if (s.snap == nil && s.out == nil) || dryRun {
		return nil
	}
	w := o.io.out
	if output == "json" {
		w = o.io.errOut
	}
	build := saveAndVerify
	if s.out != nil {
		build = buildAndVerify
	}
	rep, err := build(ctx, o, oo, s, w)
	if err != nil {
		return err
	}
	return outputVerdict(oo.path, rep)
}

// outputVerdict is migrate's exit for an OUT written and verified (rep): as
// verify of OUT would exit, with a line that says OUT was written.
func outputVerdict(out string, rep *verify.Report) error {
	switch rep.ExitCode() {
	case exitUnreadable:
		// As the run's own summary says: left untouched, listed.
		return &codeError{code: exitUnreadable, err: fmt.Errorf("--output-snapshot %s written with %d unreadable object(s) as they were", out, rep.Summary.Unreadable), quiet: true}
	case exitStale:
		return &codeError{code: exitStale, err: fmt.Errorf("--output-snapshot %s was written, but its verification finds %d object(s) still stale in it: do not restore it; migrate it again (--snapshot-file %s)", out, rep.Summary.Stale, out)}
	}
	return nil
}

// noOutput adds to the error of a run on a snapshot file that no output was written.
func noOutput(s *session, err error) error {
	if (s.snap == nil && s.out == nil) || err == nil {
		return err
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return &codeError{code: ce.code, err: fmt.Errorf("%w (no --output-snapshot written)", ce.err)}
	}
	return fmt.Errorf("%w (no --output-snapshot written)", err)
}
