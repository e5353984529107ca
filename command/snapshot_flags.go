package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
)

// snapshotFlags read an etcd snapshot file instead of a live etcd (every
// command but rollback).
func snapshotFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "snapshot-file", Usage: "read this etcd snapshot (etcdctl snapshot save, or a member's member/snap/db with --skip-hash-check) instead of a live etcd; the file is never modified: every command reads it in place, and migrate and quarantine write their --output-snapshot directly, in flat memory. The etcd connection flags are ignored (a file has no etcd auth: --user/--password are ignored with a warning)"},
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
// ETCDCTL_PASSWORD are often exported in the shell that runs the tool.
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
	return fmt.Sprintf("%s ignored: %s is read in place, and a snapshot file has no etcd auth to check them (whoever can read the file can read every key in it)",
		strings.Join(set, " and "), path)
}

func hashWords(h snapshotdb.Hash) string {
	if h == snapshotdb.HashSkipped {
		return "sha256 not checked (--skip-hash-check; every record read through)"
	}
	return "sha256 verified"
}

// buildAndVerify builds --output-snapshot from the input read in place and
// the run's writes, then reads it afresh and verifies it with the run's
// configuration (verify.OutputSnapshot). It prints what was written and the
// verdict, and returns the verdict.
func buildAndVerify(ctx context.Context, oo outputSnapshotOptions, s *session, w io.Writer) (*verify.Report, error) {
	cfg := s.env.Config
	cfg.Target = s.env.Target.Input()
	o, err := verify.OutputSnapshot(ctx, s.out, s.file, oo.force, cfg)
	s.out, s.file = nil, nil
	if o != nil {
		res := o.Written
		fmt.Fprintf(w, "wrote %s (%s, mode 0600): revision %d, compacted to it, %d lease(s) holding %d key(s)\n", res.Path, textfmt.Bytes(res.Size), res.Revision, o.Leases, res.LeasedKeys)
	}
	if err != nil {
		return nil, err
	}
	sum, what := o.Report.Summary, ""
	if len(cfg.Resources) > 0 {
		what = " (" + strings.Join(cfg.Resources, ", ") + ")"
	}
	fmt.Fprintf(w, "verified %s%s, read afresh: %d object(s), %d current, %d stale, %d unreadable: verify would exit %d\n",
		oo.path, what, sum.Objects, sum.Current, sum.Stale, sum.Unreadable, o.Report.ExitCode())
	return o.Report, nil
}

// writeOutputSnapshot saves and verifies --output-snapshot after a run on a
// snapshot file that wrote all it had to; the verdict goes to stdout (stderr
// with -o json), and the exit is OUT's verification's (outputVerdict).
func writeOutputSnapshot(ctx context.Context, o *scanOptions, oo outputSnapshotOptions, output string, dryRun bool, s *session) error {
	if s.out == nil || dryRun {
		return nil
	}
	w := o.io.out
	if output == "json" {
		w = o.io.errOut
	}
	rep, err := buildAndVerify(ctx, oo, s, w)
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
	if s.out == nil || err == nil {
		return err
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return &codeError{code: ce.code, err: fmt.Errorf("%w (no --output-snapshot written)", ce.err)}
	}
	return fmt.Errorf("%w (no --output-snapshot written)", err)
}
