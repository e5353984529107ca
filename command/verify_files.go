package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
	"kube-etcd-migrate/writerun"
)

// snapshotFileList is verify's --snapshot-file: the flag repeated, or
// comma-separated values (as kubectl's --filename and etcdctl's --endpoints),
// each a snapshot file or a directory of them. Its String is the values
// joined by commas: one file reads as the other commands' --snapshot-file.
type snapshotFileList struct{ paths []string }

func (l *snapshotFileList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.paths = append(l.paths, p)
		}
	}
	return nil
}

func (l *snapshotFileList) String() string { return strings.Join(l.paths, ",") }

// verifySnapshotFileFlag is verify's --snapshot-file, which takes several files.
func verifySnapshotFileFlag() cli.Flag {
	return &cli.GenericFlag{Name: "snapshot-file", Value: &snapshotFileList{}, Usage: "read etcd snapshot files instead of a live etcd, in place and read-only (etcdctl snapshot save, or a member's member/snap/db with --skip-hash-check; a copy of k3s's or RKE2's SQLite datastore is read through kine, from a copy of its own); several at once: the flag repeated, comma-separated paths, or a directory (every etcd snapshot or SQLite database in it; other files are listed as skipped): one line per file says the exit it would have alone and how many objects are under each encryption provider and key, the exit is the worst (4 before 1 before 3). The etcd connection flags are ignored (--user/--password with a warning: a file has no auth)"}
}

// verifyFlags are commonFlags with the --snapshot-file that takes several files.
func verifyFlags() []cli.Flag {
	flags := commonFlags()
	for i, f := range flags {
		if f.Names()[0] == "snapshot-file" {
			flags[i] = verifySnapshotFileFlag()
		}
	}
	return flags
}

// snapshotTarget is one file verify of several reads, or skips.
type snapshotTarget struct {
	path    string
	skipped string // why it is not read: a file of a directory that is no etcd snapshot
	// owner is the run of a state directory the file is the snapshot or
	// (journal) the journal of.
	owner   *writerun.Record
	journal bool
}

// snapshotTargets expands verify's --snapshot-file paths, several files or
// a directory: a directory gives its files in name order (not its
// subdirectories, not hidden files); those that do not start as an etcd
// snapshot does are listed as skipped. A directory without a snapshot is an
// error: a gate over the wrong directory must not pass.
func snapshotTargets(paths []string) (targets []snapshotTarget, err error) {
	seen := map[string]bool{}
	add := func(t snapshotTarget) {
		if !seen[t.path] {
			seen[t.path] = true
			targets = append(targets, t)
		}
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() {
			add(snapshotTarget{path: p}) // named: read, and refused if it is no snapshot
			continue
		}
		if writerun.StateDir(p).Holds() {
			runs, err := stateDirTargets(writerun.StateDir(p))
			if err != nil {
				return nil, err
			}
			for _, t := range runs {
				add(t)
			}
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("--snapshot-file %s: %w", p, err)
		}
		found := 0
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			path := filepath.Join(p, e.Name())
			fi, err := os.Stat(path) // through a symbolic link
			if err != nil {
				add(snapshotTarget{path: path})
				continue
			}
			if !fi.Mode().IsRegular() {
				continue
			}
			if kinedb.IsSQLite(path) { // a k3s or RKE2 SQLite backup
				add(snapshotTarget{path: path})
				found++
				continue
			}
			ok, err := snapshotdb.LooksLikeDatabase(path)
			switch {
			case err != nil:
				add(snapshotTarget{path: path}) // unreadable: reading it names the error
				found++
			case ok:
				add(snapshotTarget{path: path})
				found++
			default:
				add(snapshotTarget{path: path, skipped: "not an etcd snapshot (no bbolt header: compressed or encrypted? decompress or decrypt it to check it)"})
			}
		}
		if found == 0 {
			return nil, fmt.Errorf("--snapshot-file %s: no etcd snapshot (or SQLite database) in this directory", p)
		}
	}
	return targets, nil
}

// stateDirTargets are the snapshot and journal of every run of a state
// directory, oldest run first. A state directory without any is an error: a
// gate over the wrong directory must not pass.
func stateDirTargets(d writerun.StateDir) ([]snapshotTarget, error) {
	recs, err := d.List()
	if err != nil {
		return nil, fmt.Errorf("--snapshot-file %s: %w", d, err)
	}
	var out []snapshotTarget
	for i := range recs {
		r := &recs[i]
		if r.SnapshotTaken() {
			out = append(out, snapshotTarget{path: r.Snapshot, owner: r})
		}
		if _, err := os.Stat(r.Journal); r.Journal != "" && err == nil {
			out = append(out, snapshotTarget{path: r.Journal, owner: r, journal: true})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--snapshot-file %s: a state directory with no run's snapshot or journal in it", d)
	}
	return out, nil
}

// fileVerdict is one file's line of verify over several snapshot files.
type fileVerdict struct {
	Path string `json:"path"`
	// RunID is the run of the state directory the file is the snapshot or
	// journal of; Kind "journal" for a journal.
	RunID string `json:"run,omitempty"`
	Kind  string `json:"kind,omitempty"`
	// Journal is how a run's journal verified (its records' checksums).
	Journal *writerun.JournalCheck `json:"journal,omitempty"`
	// Exit is what verify of this file alone would exit; -1 for a skipped file.
	Exit     int    `json:"exit"`
	Skipped  string `json:"skipped,omitempty"`
	Error    string `json:"error,omitempty"`
	Revision int64  `json:"revision,omitempty"`
	Target   string `json:"target,omitempty"`
	// Summary counts the file's objects by verdict (none for a file not read).
	Summary *verify.Counts `json:"summary,omitempty"`
	// Encryption counts the objects by provider and key, and where each stands
	// in the configuration: "unreadable" ones need a key it does not have.
	Encryption []verify.EncryptionCount `json:"encryption,omitempty"`
	// NeedsKeys are the providers and keys of objects no provider of the
	// configuration decrypts.
	NeedsKeys      []string         `json:"needsKeys,omitempty"`
	UnreadableKeys []verify.KeyLine `json:"unreadableKeys,omitempty"`
}

// filesReport is verify over several snapshot files.
type filesReport struct {
	Files    []fileVerdict `json:"files"`
	ExitCode int           `json:"exitCode"`
	Verdict  string        `json:"verdict"`
}

// runVerifyFiles runs verify on each file of several (snapshotTargets) in
// turn, one open at a time (each file's session closed before the next
// opens: memory is one file's), through the same code as verify of one file.
func (o *verifyOptions) runVerifyFiles(ctx context.Context) error {
	targets, err := snapshotTargets(o.files)
	if err != nil {
		return err
	}
	stop, err := startProfiles(o.scan.cpuprofile, o.scan.memprofile)
	if err != nil {
		return err
	}
	defer stop()
	rep := &filesReport{}
	var journals *journalReader
	defer func() { journals.close() }()
	for _, t := range targets {
		if t.skipped != "" {
			rep.Files = append(rep.Files, fileVerdict{Path: t.path, Exit: -1, Skipped: t.skipped})
			continue
		}
		if t.journal {
			if journals == nil {
				if journals, err = o.newJournalReader(ctx); err != nil {
					return err
				}
			}
			v, err := journals.verify(ctx, o.scan.io.errOut, t)
			if err != nil {
				return err
			}
			rep.Files = append(rep.Files, v)
			continue
		}
		v, err := o.runVerifyOneFile(ctx, t.path)
		if err != nil {
			return err
		}
		if t.owner != nil {
			v.RunID = t.owner.ID
		}
		rep.Files = append(rep.Files, v)
	}
	rep.ExitCode, rep.Verdict = rep.verdict()
	if err := printReport(o.scan.io.out, o.output, filesPrint{rep, o.showKeys}); err != nil {
		return err
	}
	if rep.ExitCode == exitOK {
		return nil
	}
	return &codeError{code: rep.ExitCode, err: fmt.Errorf("exit %d", rep.ExitCode), quiet: true}
}

// runVerifyOneFile is verify of one file: its verdict, or an exit 1 line naming
// it when it cannot be read. The error returned stops the whole run: a usage
// error (the same for every file) or a signal.
func (o *verifyOptions) runVerifyOneFile(ctx context.Context, path string) (fileVerdict, error) {
	v := fileVerdict{Path: path, Exit: exitError}
	s, err := openFile(ctx, o.scan, path, false)
	if err == nil {
		defer s.close()
		var r *verify.Report
		r, err = verify.Run(ctx, s.env, verify.Options{ShowKeys: o.showKeys, FailOnOrphaned: o.failOnOrphaned})
		if err == nil {
			sum := r.Summary
			v.Exit, v.Revision, v.Target, v.Summary, v.Encryption = r.ExitCode(), r.Revision, r.Target, &sum, r.Encryption
			v.NeedsKeys = verify.NeedsMissingKey(r.Encryption)
			for _, rr := range r.Resources {
				v.UnreadableKeys = append(v.UnreadableKeys, rr.UnreadableKeys...)
			}
			return v, nil
		}
	}
	var ce *codeError
	if ctx.Err() != nil || (errors.As(err, &ce) && ce.code == exitUsage) {
		return v, err
	}
	v.Error = cliMessage(err)
	fmt.Fprintf(o.scan.io.errOut, "error: %s\n", cliMessage(err))
	return v, nil
}

// journalReader reads the journals of a state directory's runs for verify:
// every value a rollback would put back decrypted with the encryption
// configuration given (--encryption-provider-config, else the manifest's;
// none: identity for every resource, as for the snapshots).
type journalReader struct {
	enc    *encryption.Transformers
	prefix string
}

func (o *verifyOptions) newJournalReader(ctx context.Context) (*journalReader, error) {
	enc, _, api, err := loadEncryption(ctx, o.scan.api, o.scan.prov, o.scan.encryptionConfig)
	if err != nil {
		return nil, err
	}
	prefix := api.EtcdPrefix
	if o.scan.prov.onCommandLine("prefix") || prefix == "" {
		prefix = o.scan.prefix
	}
	return &journalReader{enc: enc, prefix: prefix}, nil
}

func (j *journalReader) close() {
	if j != nil && j.enc != nil {
		j.enc.Close()
	}
}

// verify is the line of one run's journal: exit 4 when a value a rollback
// would put back needs a key the configuration does not have, 1 when the
// journal does not verify (named on errOut), else 0.
func (j *journalReader) verify(ctx context.Context, errOut io.Writer, t snapshotTarget) (fileVerdict, error) {
	v := fileVerdict{Path: t.path, RunID: t.owner.ID, Kind: "journal", Exit: exitError}
	prefix := t.owner.Prefix
	if prefix == "" {
		prefix = j.prefix
	}
	r, err := verify.CheckJournal(ctx, writerun.JournalSpec{Path: t.path, Record: t.owner}, j.enc, prefix)
	if err != nil {
		if ctx.Err() != nil {
			return v, ctx.Err()
		}
		v.Error = cliMessage(err)
		fmt.Fprintf(errOut, "error: %s\n", v.Error)
		return v, nil
	}
	sum := r.Summary
	v.Exit, v.Summary, v.Encryption, v.Journal = r.ExitCode(), &sum, r.Encryption, r.Check
	v.NeedsKeys = verify.NeedsMissingKey(r.Encryption)
	return v, nil
}

// verdict is the overall exit and its sentence: 4 when a file holds objects
// this configuration cannot read (a key it no longer has, above all), then 1
// when a file could not be read, then 3 when something is stale, else 0. Every
// code but 0 and 3 means a backup may need what the configuration lacks.
func (r *filesReport) verdict() (int, string) {
	var needKey, runNeedKey, unreadable, failed, stale []string
	read := 0
	for _, f := range r.Files {
		switch {
		case f.Skipped != "":
			continue
		case f.Exit == verify.ExitUnreadable && len(f.NeedsKeys) > 0 && f.RunID != "":
			runNeedKey = append(runNeedKey, fmt.Sprintf("%s of run %s (%s)", f.Path, f.RunID, strings.Join(f.NeedsKeys, ", ")))
		case f.Exit == verify.ExitUnreadable && len(f.NeedsKeys) > 0:
			needKey = append(needKey, fmt.Sprintf("%s (%s)", f.Path, strings.Join(f.NeedsKeys, ", ")))
		case f.Exit == verify.ExitUnreadable:
			unreadable = append(unreadable, f.Path)
		case f.Exit == exitError:
			failed = append(failed, f.Path)
		case f.Exit == verify.ExitStale:
			stale = append(stale, f.Path)
		}
		read++
	}
	var parts []string
	code := exitOK
	if len(needKey) > 0 {
		code = exitUnreadable
		parts = append(parts, fmt.Sprintf("%d file(s) need a key this configuration does not have: %s. Keep that key until they are re-encrypted (migrate --snapshot-file IN --output-snapshot OUT --encryption-only, with a configuration that still has it) or no longer kept.", len(needKey), strings.Join(needKey, "; ")))
	}
	if len(runNeedKey) > 0 {
		code = exitUnreadable
		parts = append(parts, fmt.Sprintf("%d file(s) of runs' undo need a key this configuration does not have: %s. A rollback of those runs, or a restore of their snapshots, would give values kube-apiserver cannot read: keep that key for as long as those run directories are kept (remove them, oldest first, once the change is accepted).", len(runNeedKey), strings.Join(runNeedKey, "; ")))
	}
	if len(unreadable) > 0 {
		code = exitUnreadable
		parts = append(parts, fmt.Sprintf("%d file(s) hold objects unreadable for another reason than a key (listed): %s.", len(unreadable), strings.Join(unreadable, ", ")))
	}
	if len(failed) > 0 {
		if code == exitOK {
			code = exitError
		}
		parts = append(parts, fmt.Sprintf("%d file(s) could not be read (damaged, not a snapshot, or unreadable; named above): %s: nothing is known of what they need.", len(failed), strings.Join(failed, ", ")))
	}
	if code == exitOK && len(stale) > 0 {
		code = exitStale
	}
	if code == exitOK || code == exitStale {
		s := fmt.Sprintf("every object of the %d file(s) is readable with this configuration", read)
		if len(stale) > 0 {
			s += fmt.Sprintf("; %d of them hold stale objects (under a later key, or not as this release stores them): %s", len(stale), strings.Join(stale, ", "))
		}
		parts = append([]string{s + "."}, parts...)
	}
	return code, fmt.Sprintf("VERDICT: %s Exit %d.", strings.Join(parts, " "), code)
}

// filesPrint is verify over several snapshot files as the printers take
// it: the table lists the first show unreadable keys of each file.
type filesPrint struct {
	rep  *filesReport
	show int
}

func (f filesPrint) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*filesReport
	}{build, f.rep}
}

func (f filesPrint) table(w io.Writer) error {
	r, show := f.rep, f.show
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tEXIT\tREVISION\tOBJECTS\tSTALE\tUNREADABLE\tOBJECTS BY ENCRYPTION (provider:key=N (first|later|unreadable))")
	for _, f := range r.Files {
		switch {
		case f.Skipped != "":
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tskipped: %s\n", f.Path, f.Skipped)
		case f.Summary == nil:
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\tnot read (error above)\n", f.Path, f.Exit)
		case f.Kind == "journal":
			s := f.Summary
			fmt.Fprintf(tw, "%s\t%d\t-\t%d\t-\t%d\t%s\n", f.Path, f.Exit, s.Objects, s.Unreadable, encryptionSummary(f.Encryption))
		default:
			s := f.Summary
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", f.Path, f.Exit, f.Revision, s.Objects, s.Stale, s.Unreadable, encryptionSummary(f.Encryption))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if show > 0 {
		for _, f := range r.Files {
			if len(f.UnreadableKeys) == 0 {
				continue
			}
			fmt.Fprintf(&b, "\nUnreadable in %s (first %d per resource):\n", f.Path, show)
			for _, k := range f.UnreadableKeys {
				line := fmt.Sprintf("  %s  %s", k.Key, k.Reason)
				if k.Detail != "" {
					line += ": " + k.Detail
				}
				fmt.Fprintf(&b, "%s\n", line)
			}
		}
	}
	fmt.Fprintf(&b, "\n%s\n", r.Verdict)
	_, err := io.WriteString(w, b.String())
	return err
}
