package command

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInterspersed(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// Flags after the argument, value flags in both syntaxes, a short alias, a bool.
		{"inspect /registry/secrets/default/x -o yaml --endpoints 10.0.0.5:2379 --show-secrets",
			"inspect -o yaml --endpoints 10.0.0.5:2379 --show-secrets -- /registry/secrets/default/x"},
		{"inspect --endpoints=10.0.0.5:2379 /registry/x -o=json",
			"inspect --endpoints=10.0.0.5:2379 -o=json -- /registry/x"},
		// A bool flag does not take the next word; "--flag=false" is one word.
		{"inspect --show-secrets /registry/x", "inspect --show-secrets -- /registry/x"},
		{"inspect /registry/x --show-secrets=false", "inspect --show-secrets=false -- /registry/x"},
		// A value that looks like a flag belongs to its flag.
		{"verify --page-size -1", "verify --page-size -1"},
		// "--" ends the flags: what follows is an argument even if it starts with "-".
		{"inspect -o json -- -weird-key --endpoints", "inspect -o json -- -weird-key --endpoints"},
		{"inspect /a -- --endpoints", "inspect -- /a --endpoints"},
		// Already in order: unchanged (no "--" needed without arguments).
		{"verify --endpoints x --encryption-provider-config enc.yaml -o json", "verify --endpoints x --encryption-provider-config enc.yaml -o json"},
		// etcdctl's habit: connection flags before the command.
		{"--endpoints=x --dial-timeout 3s inventory -o json", "inventory --endpoints=x --dial-timeout 3s -o json"},
		// App flags stay where they are.
		{"--version", "--version"},
		{"--help inventory", "--help inventory"},
		// Unknown flags are left for the parser to report.
		{"inspect /a --no-such-flag", "inspect --no-such-flag -- /a"},
		{"--no-such-flag inventory", "--no-such-flag inventory"},
		// A value flag without its value: the parser says so.
		{"inspect /a -o", "inspect -o"},
		// Completion requests are read from os.Args by urfave/cli: untouched.
		{"inspect /a --end --generate-bash-completion", "inspect /a --end --generate-bash-completion"},
		// Not a command: untouched.
		{"nosuch /a --endpoints x", "nosuch /a --endpoints x"},
	} {
		app := newApp(io.Discard, io.Discard)
		got := strings.Join(interspersed(app, append([]string{"kube-etcd-migrate"}, strings.Fields(tc.in)...))[1:], " ")
		if got != tc.want {
			t.Errorf("%s\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// TestFlagsAfterArgumentsParse: what the reordering produces is what urfave/cli
// parses, for every command (connection errors, not usage errors, mean every flag
// and argument was accepted; the endpoint named in the error is the one given
// after the argument).
func TestFlagsAfterArgumentsParse(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "j") // there: rollback looks before it connects
	if err := os.WriteFile(journal, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"inventory", "-o", "json", "--endpoints", "127.0.0.1:1", "--dial-timeout", "200ms"},
		{"inspect", "/registry/secrets/default/x", "-o", "json", "--endpoints", "127.0.0.1:1", "--dial-timeout=200ms"},
		{"verify", "--show-keys", "2", "--endpoints", "127.0.0.1:1", "-o", "yaml", "--dial-timeout", "200ms"},
		{"migrate", "--dry-run", "--endpoints", "127.0.0.1:1", "--dial-timeout", "200ms", "--writers", "2"},
		{"rollback", "--endpoints", "127.0.0.1:1", "--journal", journal, "--dial-timeout", "200ms"},
		{"--endpoints", "127.0.0.1:1", "--dial-timeout", "200ms", "inventory"},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, "127.0.0.1:1") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming 127.0.0.1:1", args, code, stderr, exitError)
		}
	}
	// A flag after the argument is still checked.
	code, _, stderr := runCLI(t, "inspect", "/registry/x", "-o", "xml")
	if code != exitUsage || !strings.Contains(stderr, `"xml"`) {
		t.Errorf("inspect KEY -o xml: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "inspect", "/registry/x", "/registry/y", "--endpoints", "127.0.0.1:1")
	if code != exitUsage || !strings.Contains(stderr, "exactly one KEY") {
		t.Errorf("two keys: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "inspect", "/registry/x", "-o")
	if code != exitUsage || !strings.Contains(stderr, "flag needs an argument") {
		t.Errorf("inspect KEY -o: exit %d, stderr %q", code, stderr)
	}
}
