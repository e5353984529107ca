package command

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"kube-etcd-migrate/writerun"
)

// Exit codes. What each means, per command, is exitCodes.
const (
	exitOK         = 0
	exitError      = 1
	exitUsage      = 2
	exitStale      = 3
	exitUnreadable = 4
	exitWriter     = 5   // stopped: a writer appeared (writerun.WriterError)
	exitInternal   = 70  // a panic: a bug (guarded); sysexits.h's EX_SOFTWARE
	exitSignal     = 130 // a second SIGINT/SIGTERM: exited at once (signalContext)
)

// exitCodeRow is one exit code and what it means for the commands named.
type exitCodeRow struct {
	Code     int
	Commands []string // command names, in the app's order
	Meaning  string   // plain text, one sentence or a few; no Markdown
}

// Command names, for exitCodes.
var (
	readOnly = []string{"inventory", "inspect", "verify", "plan", "runs", "version", "completion"}
	writing  = []string{"migrate", "rollback", "quarantine", "restore"}
	everyCmd = slices.Concat(readOnly, writing)
)

// exitCodes is the one truth of the tool's exit codes: each command's --help
// shows its rows (exitCodesHelp), the app's --help all of them, and
// TestExitCodesAgree checks that docs/commands.md's "Exit codes" table lists
// exactly these rows and that every code a command's code can return is one of
// its rows. A new command adds its name to the rows of the codes it returns.
var exitCodes = []exitCodeRow{
	{exitOK, []string{"inventory", "inspect", "version", "completion"}, "success"},
	{exitOK, []string{"verify"}, "every object current (several --snapshot-file, or a state directory: every object of every file, every value of every run's journal readable)"},
	{exitOK, []string{"migrate"}, "done: every stale object rewritten (--dry-run: what would be rewritten, nothing unreadable); with --output-snapshot, OUT written, read afresh and verified current"},
	{exitOK, []string{"plan"}, "migrate would proceed: no blocker, nothing unreadable (what it would rewrite is listed, with an estimate of its time)"},
	{exitOK, []string{"runs"}, "the runs of the state directory listed (none is no error)"},
	{exitOK, []string{"rollback"}, "every journaled key of the runs (--run) or journal (--journal) restored, newest write first (keys changed since are skipped and listed; --dry-run: what would be, nothing written)"},
	{exitOK, []string{"quarantine"}, "done: every object the --reason and --resource name removed, none left unreadable (--dry-run: the list, whatever it holds)"},
	{exitOK, []string{"restore"}, "done: every selected object of the backup created, overwritten (--overwrite) or already the same; objects that exist with another value are left and listed (\"exists\"), Events and keys on an etcd lease skipped unless asked for (--dry-run: the plan, nothing written)"},
	{exitError, []string{"inventory", "inspect", "verify"}, "failed: etcd unreachable, a file unreadable or damaged (named); several --snapshot-file: a file could not be read (named) and none holds unreadable objects"},
	{exitError, []string{"plan"}, "migrate would refuse: one BLOCKER line per problem, each with its remedy (the quota, disk space for the undo, a KMS plugin, an etcd member, a conversion webhook, an alarm); or etcd unreachable; nothing written"},
	{exitError, []string{"runs"}, "failed: the state directory could not be read; with --verify, a run's undo is damaged (its lines name the file, the first bad record and its key, and the way back; an unverifiable journal, written before checksums, is listed and does not fail)"},
	{exitError, []string{"version", "completion"}, "failed: the output could not be written"},
	{exitError, writing, "failed, nothing lost: etcd unreachable, a preflight refusal (nothing written: a live kube-apiserver, no room for the undo in --state-dir, the state directory in use by another run or readable by others; for rollback a damaged journal, one without checksums unless --allow-unverified-journal, or values the encryption configuration cannot decrypt; for restore a damaged backup, a key its values need that --backup-encryption-provider-config lacks, a custom resource whose CRD the live etcd lacks, an owner neither in the live etcd nor in the selection unless --allow-dangling-owners, each named), failed writes or conflicts, a run stopped before etcd's quota or at its first NOSPACE or permission refusal; one line names the cause and the remedy, the journal is intact and a second run or rollback picks up from it; with --output-snapshot the line says whether OUT was written"},
	{exitUsage, everyCmd, "usage error: bad flag or argument (also a manifest path or KMS plugin socket under no hostPath mount; migrate when nothing says which Kubernetes release the cluster runs, or --target-version contradicts the manifest's image; rollback when it would put back encrypted values and neither --apiserver-manifest nor --encryption-provider-config is given); nothing written"},
	{exitStale, []string{"verify"}, "something is stale, everything is readable (several --snapshot-file: in some file, every file read)"},
	{exitStale, []string{"migrate"}, "with --output-snapshot: OUT was written, but its verification finds objects still stale in it (the line says how many): do not restore it"},
	{exitUnreadable, []string{"verify"}, "something is unreadable (no key for it, corrupt, unknown kind, fields these types would lose); with --fail-on-orphaned, also a key no built-in resource or CRD owns (orphaned keys are reported and otherwise do not change the exit code); several --snapshot-file: in some file (the verdict names the files and the keys they need), whatever the others"},
	{exitUnreadable, []string{"migrate"}, "the rest is done; unreadable objects were left untouched (listed); with --output-snapshot, OUT is written with them as they were"},
	{exitUnreadable, []string{"plan"}, "no blocker, but unreadable objects (listed): migrate would leave them untouched and exit 4"},
	{exitUnreadable, []string{"restore"}, "the rest is done; objects of the backup that do not decode or re-encode were not restored (listed as unreadable)"},
	{exitUnreadable, []string{"quarantine"}, "done, but unreadable objects remain (kept: another reason than --reason names, or refused by a configured key; listed); with --output-snapshot, as the verification of OUT finds"},
	{exitWriter, writing, "stopped: a writer appeared: after the liveness window, etcd showed a write under the prefix that was not the run's own (a kube-apiserver started, or a tool writing etcd directly); one line names each key and who wrote it (a kube-apiserver's node, from its identity lease); nothing more was sent, the writes in flight finished and are journaled; stop the writer, then run the same command again (it picks up from what was written) or roll the run back"},
	{exitInternal, everyCmd, "internal error: a bug of the tool (a panic, in any of its goroutines), on one line that starts \"internal error:\" and says where; a read-only command wrote nothing, a writing command journaled each write before making it (runs lists the run, rollback --run undoes it; with --no-undo nothing is kept)"},
	{exitSignal, []string{"inventory", "inspect", "verify", "plan", "migrate", "rollback", "runs", "quarantine", "restore"}, "a second SIGINT or SIGTERM: exited at once (a first one stops cleanly: in-flight writes finish, the journal is flushed, exit 1; runs --verify stops reading, exit 1)"},
}

// exitCodesFor are the rows of command name ("" for every row).
func exitCodesFor(name string) []exitCodeRow {
	var out []exitCodeRow
	for _, r := range exitCodes {
		if name == "" || slices.Contains(r.Commands, name) {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b exitCodeRow) int { return a.Code - b.Code })
	return out
}

// exitCodesHelp is the EXIT CODES section of a command's --help (of the app's
// when name is "").
func exitCodesHelp(name string) string {
	var b strings.Builder
	b.WriteString("EXIT CODES:\n")
	for _, r := range exitCodesFor(name) {
		who := ""
		if name == "" && !slices.Equal(r.Commands, everyCmd) {
			who = strings.Join(r.Commands, ", ") + ": "
		}
		fmt.Fprintf(&b, "%s\n", wrap(fmt.Sprintf("%4d  ", r.Code), who+r.Meaning, 90))
	}
	return b.String()
}

// wrap prints text after head, wrapped at width with continuation lines
// indented under its start.
func wrap(head, text string, width int) string {
	indent := strings.Repeat(" ", len(head))
	var lines []string
	line, empty := head, true
	for _, w := range strings.Fields(text) {
		if !empty && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line, empty = indent, true
		}
		if !empty {
			line += " "
		}
		line += w
		empty = false
	}
	return strings.Join(append(lines, line), "\n")
}

// codeError carries an exit code through urfave/cli.
type codeError struct {
	code int
	err  error
	// quiet: the report already says it (verify's 3 and 4, migrate's 4), so
	// no "error:" line.
	quiet bool
}

func (e *codeError) Error() string { return e.err.Error() }

func (e *codeError) Unwrap() error { return e.err }

// stoppedByWriter gives a writing run that another writer stopped
// (writerun.WriterError) its exit code.
func stoppedByWriter(err error) error {
	var ce *codeError
	if errors.As(err, new(*writerun.WriterError)) && !errors.As(err, &ce) {
		return &codeError{code: exitWriter, err: err}
	}
	return err
}

// usageErr is an exit-2 error whose message is fmt.Errorf's, with every
// error argument written as the command line says it (cliMessage).
func usageErr(format string, args ...any) error {
	for i, a := range args {
		if err, ok := a.(error); ok {
			args[i] = cliMessage(err)
		}
	}
	return &codeError{code: exitUsage, err: fmt.Errorf(format, args...)}
}
