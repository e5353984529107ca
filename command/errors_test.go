package command

import (
	"errors"
	"fmt"
	"io"
	"kube-etcd-migrate/snapshotdb"
	"strings"
	"testing"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/input"
)

// TestEveryInputHasAFlag: every input the library's messages refer to is
// spelled as a flag some command has, so that no error the user reads names
// an input in words where a flag was typed.
func TestEveryInputHasAFlag(t *testing.T) {
	flags := map[string]bool{}
	app := newApp(io.Discard, io.Discard)
	for _, f := range app.Flags {
		for _, n := range f.Names() {
			flags["--"+n] = true
		}
	}
	for _, cmd := range app.Commands {
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				flags["--"+n] = true
			}
		}
	}
	for _, n := range input.All() {
		f, ok := inputFlags[n]
		if !ok {
			t.Errorf("input %q has no flag in inputFlags", n)
			continue
		}
		if !flags[f] {
			t.Errorf("input %q is spelled %s, which no command has", n, f)
		}
	}
	if len(inputFlags) != len(input.All()) {
		t.Errorf("inputFlags has %d entries, input.All %d", len(inputFlags), len(input.All()))
	}
}

// TestCLIMessageNamesFlags: a library error, wrapped, reads with the flags the
// user typed; the library's own text names none.
func TestCLIMessageNamesFlags(t *testing.T) {
	err := snapshotdb.CheckOutput("/nonexistent/in.db", "", false)
	if err == nil {
		t.Fatal("CheckOutput accepted no output file")
	}
	wrapped := fmt.Errorf("migrate: %w", err)
	if got, want := cliMessage(wrapped), "migrate: --output-snapshot: no file given"; got != want {
		t.Errorf("cliMessage = %q, want %q", got, want)
	}
	if strings.Contains(err.Error(), "--") {
		t.Errorf("library error names a flag: %q", err)
	}
	inner := input.Errorf("%s %s exists: pass %s", input.OutputSnapshot, "/tmp/x", input.Force)
	outer := input.Errorf("%s: %w", input.CompactHistory, inner)
	joined := errors.Join(errors.New("first"), fmt.Errorf("second: %w", outer))
	if got, want := cliMessage(joined), "first\nsecond: --compact-history: --output-snapshot /tmp/x exists: pass --force"; got != want {
		t.Errorf("cliMessage = %q, want %q", got, want)
	}
	if !errors.Is(joined, inner) {
		t.Error("the wrapped error is not found through input.Errorf")
	}
}

// TestStopErrorNamesFlags: a run stopped by etcd says which flags give it the
// credentials, or the compaction, that would let it finish.
func TestStopErrorNamesFlags(t *testing.T) {
	denied := &guard.StopError{Fatal: &etcdscan.FatalError{Cause: etcdscan.CausePermission, Err: errors.New("etcdserver: permission denied")}, Key: "/registry/secrets/a/b", Verb: "migrate"}
	if got, want := cliMessage(fmt.Errorf("migrate: %w", denied)), "(--cert/--key of kube-apiserver's etcd client, or --user with read-write on the prefix)"; !strings.Contains(got, want) {
		t.Errorf("cliMessage = %q, want it to say %q", got, want)
	}
	full := &guard.StopError{Fatal: &etcdscan.FatalError{Cause: etcdscan.CauseNoSpace, Err: errors.New("etcdserver: mvcc: database space exceeded")}, Key: "/registry/secrets/a/b", Verb: "migrate"}
	if got := cliMessage(full); !strings.HasSuffix(got, "then run again with --compact-history") {
		t.Errorf("cliMessage = %q, want the remedy with --compact-history", got)
	}
}
