package command

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/undo"
)

// countingListener is a loopback TCP listener the test owns: every
// connection made to it is counted and closed at once (no etcd answers).
func countingListener(t *testing.T) (addr string, accepted func() int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), n.Load
}

// TestUsageRefusedBeforeIO: every usage refusal the flags alone decide
// (each command's validate), and those that need only a look at a path the
// flags name, exits 2 with its one line before any I/O: etcd (--endpoints,
// a listener the test owns) accepted no connection, the state directory was
// not created, the --snapshot-file (a path that does not exist: opening it
// would be another error) not opened. A command that gets past its
// validation does connect to that listener (the control case), so a count of
// zero means something.
func TestUsageRefusedBeforeIO(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing")
	if err := os.WriteFile(existing, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	journal := filepath.Join(dir, "journal")
	if err := os.WriteFile(journal, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "node")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, "in.db") // never created: opening it would fail otherwise
	out := filepath.Join(dir, "out.db")
	secrets := []string{"--reason", "undecryptable", "--resource", "secrets"}
	for _, tc := range []struct {
		args []string
		want string // the error line, from its start (exact where it names no path)
	}{
		// Every command: urfave/cli's own refusals, and --output.
		{[]string{"inventory", "--no-such-flag"}, "error: inventory: flag provided but not defined: -no-such-flag"},
		{[]string{"inventory", "-o", "xml"}, `error: --output "xml": want one of table, json`},
		{[]string{"version", "extra"}, "error: version takes no arguments"},
		{[]string{"completion", "fish"}, `error: completion "fish": want bash or zsh`},
		// What every command that scans refuses (scanOptions.validate).
		{[]string{"inventory", "--namespace", "ns1"}, "error: --namespace needs --resource (the keyspace is laid out by resource first)"},
		{[]string{"verify", "--page-size", "0"}, "error: --page-size must be positive"},
		{[]string{"verify", "--conversion-webhook", "nope"}, `error: --conversion-webhook "nope": want NAMESPACE/SERVICE=HOST:PORT[/PATH] or NAMESPACE/SERVICE=https://HOST:PORT[/PATH]`},
		{[]string{"verify", "--conversion-webhook", "ns/svc=a:1", "--conversion-webhook", "ns/svc=b:2"}, "error: --conversion-webhook ns/svc given twice (a:1 and b:2)"},
		{[]string{"verify", "--target-version", "1.99"}, "error: --target-version 1.99: newer than the Kubernetes release this tool carries"},
		{[]string{"verify", "--target-version", "one"}, `error: --target-version "one"`},
		{[]string{"inventory", "--user", ":secret"}, "error: --user: empty user name"},
		{[]string{"inventory", "--user", "root:a", "--password", "b"}, "error: --user: password given both in --user and --password"},
		// Refusals that read a file the flags name, still before etcd.
		{[]string{"inventory", "--apiserver-manifest", filepath.Join(dir, "none.yaml")}, "error: --apiserver-manifest: open " + filepath.Join(dir, "none.yaml")},
		{[]string{"inventory", "--cacert", filepath.Join(dir, "none.pem")}, "error: --cacert: "},
		// The node's installer (--distribution, --node-root): the flags, then
		// the node's files, before etcd.
		{[]string{"inventory", "--distribution", "rancher"}, `error: --distribution "rancher": want one of kubeadm, kops, rke2, k3s`},
		{[]string{"inventory", "--distribution", "kubeadm", "--apiserver-manifest", existing}, "error: --distribution and --apiserver-manifest: --distribution looks for the node's installer's files"},
		{[]string{"verify", "--node-root", dir, "--snapshot-file", in}, "error: --node-root with --snapshot-file: a snapshot file is read with the configuration the flags give"},
		{[]string{"inventory", "--node-root", existing}, "error: --node-root " + existing + ": not a directory"},
		{[]string{"plan", "--distribution", "k3s", "--node-root", empty}, "error: no k3s control plane found on this node: looked for k3s (" + filepath.Join(empty, "/etc/rancher/k3s/config.yaml")},
		{[]string{"rollback", "--journal", journal, "--distribution", "kops", "--node-root", empty}, "error: no kops control plane found on this node: looked for kops ("},
		// inspect.
		{[]string{"inspect"}, "error: inspect takes exactly one KEY, e.g. /registry/secrets/default/my-secret"},
		{[]string{"inspect", "/registry/a", "/registry/b"}, "error: inspect takes exactly one KEY, e.g. /registry/secrets/default/my-secret"},
		// verify of several snapshot files.
		{[]string{"verify", "--snapshot-file", in + "," + out, "--revision", "5"}, "error: --revision with several --snapshot-file: each file is read at its own revision; give one file"},
		{[]string{"verify", "--snapshot-file", in, "--snapshot-file", out, "--metrics-file", filepath.Join(dir, "m")}, "error: --metrics-file with several --snapshot-file: the metrics are one report's; give one file"},
		// migrate.
		{[]string{"migrate", "--no-undo", "--journal", "j"}, "error: --no-undo keeps no journal and no snapshot: leave out --journal and --snapshot, or --no-undo"},
		{[]string{"migrate", "--state-dir="}, "error: --state-dir: empty; give a directory (default " + undo.DefaultStateDir + ")"},
		{[]string{"migrate", "--batch-ops", "0"}, "error: --batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)"},
		{[]string{"migrate", "--batch-ops", "129"}, "error: --batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)"},
		{[]string{"migrate", "--batch-bytes", "0"}, "error: --batch-bytes must be positive"},
		{[]string{"migrate", "--writers", "-1"}, "error: --writers must be positive"},
		{[]string{"migrate", "--snapshot-file", in, "--snapshot", out}, "error: --snapshot: with --snapshot-file, that file is the backup (it is never modified)"},
		{[]string{"migrate", "--output-snapshot", out}, "error: --output-snapshot needs --snapshot-file (a live etcd is written in place)"},
		{[]string{"migrate", "--snapshot-file", in, "--dry-run", "--output-snapshot", out}, "error: --output-snapshot with --dry-run: nothing would be written"},
		{[]string{"migrate", "--snapshot-file", in}, "error: --snapshot-file " + in + " is never modified: give --output-snapshot FILE for the result, or --dry-run"},
		{[]string{"migrate", "--liveness-window", "0s"}, "error: --liveness-window must be positive (default " + liveness.DefaultWindow.String() + ", longer than kube-apiserver's 10s identity-lease renewal)"},
		{[]string{"migrate", "--namespace", "ns1"}, "error: --namespace needs --resource (the keyspace is laid out by resource first)"},
		{[]string{"migrate", "--encryption-only", "--requested"}, "error: --encryption-only leaves storage versions as they are; --requested and --record are storage version migrations"},
		{[]string{"migrate", "--encryption-only", "--record"}, "error: --encryption-only leaves storage versions as they are; --requested and --record are storage version migrations"},
		{[]string{"migrate", "--record", "--snapshot-file", in, "--output-snapshot", out}, "error: --record: a --snapshot-file's --output-snapshot holds the objects migrated, not new StorageVersionMigration records; migrate the restored cluster's etcd to record them"},
		{[]string{"migrate", "--requested", "--record"}, "error: --requested and --record: the requests record their own outcome; give one of them"},
		{[]string{"migrate", "--requested", "--resource", "secrets"}, "error: --requested: the requests name their resources; --resource and --namespace do not apply"},
		{[]string{"migrate", "--requested", "--snapshot-file", in, "--dry-run"}, "error: --requested works on the cluster's etcd, not on --snapshot-file (an output snapshot must be current in every resource, a request migrates one)"},
		{[]string{"migrate", "--snapshot", existing}, "error: --snapshot " + existing + ": the file exists and a snapshot is never replaced"},
		{[]string{"migrate", "--snapshot-file", in, "--output-snapshot", existing}, "error: --output-snapshot " + existing + " exists: remove it or pass --force to replace it"},
		// plan: migrate's flags, less those for another etcd than the cluster's.
		{[]string{"plan", "--requested"}, "error: --requested: plan is for a migrate of the cluster's etcd (see docs/commands.md#plan)"},
		{[]string{"plan", "--snapshot-file", in}, "error: --snapshot-file: plan is for a migrate of the cluster's etcd (see docs/commands.md#plan)"},
		{[]string{"plan", "--liveness-window", "-1s"}, "error: --liveness-window must be positive"},
		{[]string{"plan", "--page-size", "0"}, "error: --page-size must be positive"},
		// quarantine.
		{[]string{"quarantine", "--reason", "nosuch", "--resource", "secrets"}, "error: --reason nosuch: not a reason quarantine removes objects for"},
		{[]string{"quarantine", "--reason", "orphaned", "--resource", "secrets"}, "error: --reason orphaned: orphaned keys belong to no resource; leave out --resource (the whole prefix is scanned, only orphaned keys are removed)"},
		{[]string{"quarantine", "--reason", "undecryptable"}, "error: --resource: name the resource(s) to quarantine objects of, e.g. --resource secrets"},
		{append([]string{"quarantine", "--no-undo"}, secrets...), "error: --no-undo: quarantine always keeps the removed values (its journal) for 'rollback'; leave out --no-undo"},
		{append([]string{"quarantine", "--batch-ops", "200"}, secrets...), "error: --batch-ops must be 1..128 (etcd's default --max-txn-ops is 128)"},
		{append([]string{"quarantine", "--no-undo", "--snapshot", "s"}, secrets...), "error: --no-undo keeps no journal and no snapshot: leave out --journal and --snapshot, or --no-undo"},
		{append([]string{"quarantine", "--snapshot-file", in}, secrets...), "error: --snapshot-file " + in + " is never modified: give --output-snapshot FILE for the result, or --dry-run"},
		{append([]string{"quarantine", "--liveness-window", "0s"}, secrets...), "error: --liveness-window must be positive"},
		{append([]string{"quarantine", "--namespace", "ns1", "--page-size", "0"}, secrets...), "error: --page-size must be positive"},
		{append([]string{"quarantine", "--snapshot", existing}, secrets...), "error: --snapshot " + existing + ": the file exists and a snapshot is never replaced"},
		// rollback.
		{[]string{"rollback"}, "error: rollback: give --run ID (see 'kube-etcd-migrate runs') or --journal FILE"},
		{[]string{"rollback", "--run", "x", "--journal", journal}, "error: rollback: give --run ID (see 'kube-etcd-migrate runs') or --journal FILE"},
		{[]string{"rollback", "--journal", journal, "--liveness-window", "0s"}, "error: --liveness-window must be positive"},
		{[]string{"rollback", "--journal", journal, "--user", ":x"}, "error: --user: empty user name"},
		{[]string{"rollback", "--journal", filepath.Join(dir, "none.journal")}, "error: --journal: stat " + filepath.Join(dir, "none.journal") + ": no such file or directory"},
		// runs.
		{[]string{"runs", "--keep", "3"}, "error: --keep, --before and --dry-run go with --prune"},
		{[]string{"runs", "--dry-run"}, "error: --keep, --before and --dry-run go with --prune"},
		{[]string{"runs", "--prune"}, "error: --prune: give --keep N (the newest N runs kept) or --before ID (the runs older than ID removed)"},
		{[]string{"runs", "--prune", "--keep", "2", "--before", "3"}, "error: --prune: give --keep N (the newest N runs kept) or --before ID (the runs older than ID removed)"},
		{[]string{"runs", "--prune", "--keep", "0"}, "error: --keep 0: keep at least the newest run (its undo is the one most likely needed)"},
		{[]string{"runs", "--prune", "--keep", "2", "--show", "1"}, "error: --prune removes runs: leave out --show and --verify (run them first)"},
		{[]string{"runs", "--show", "1", "--verify"}, "error: --show prints one run: leave out --verify ('runs --verify' checks every run)"},
		{[]string{"runs", "--show", "1", "--user", ":x"}, "error: --user: empty user name"},
		{[]string{"rollback", "--run", "1", "--no-undo", "--undo-dir", dir}, "error: --no-undo keeps no undo: leave out --undo-dir, or --no-undo"},
		{[]string{"rollback", "--run", "1", "--state-dir="}, "error: --state-dir: empty; give the state directory of the runs (default " + undo.DefaultStateDir + ")"},
	} {
		ep, accepted := countingListener(t)
		state := filepath.Join(t.TempDir(), "state")
		t.Setenv(undo.EnvStateDir, state)
		args := append(append([]string(nil), tc.args...), "--endpoints", ep)
		if tc.args[0] == "version" || tc.args[0] == "completion" {
			args = tc.args // no etcd flags
		}
		code, _, stderr := runCLIEnv(args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != exitUsage || !strings.HasPrefix(last, tc.want) {
			t.Errorf("%q: exit %d, last line %q\nwant exit %d, %q", tc.args, code, last, exitUsage, tc.want)
		}
		if n := accepted(); n != 0 {
			t.Errorf("%q: etcd accepted %d connection(s) before the refusal", tc.args, n)
		}
		if _, err := os.Lstat(state); err == nil {
			t.Errorf("%q: the state directory was created before the refusal", tc.args)
		}
		if _, err := os.Lstat(out); err == nil {
			t.Fatalf("%q: wrote %s", tc.args, out)
		}
	}

	// The control: past its validation, a command connects to that listener.
	ep, accepted := countingListener(t)
	code, _, stderr := runCLIEnv("inventory", "--endpoints", ep, "--dial-timeout", "1s")
	if code != exitError || accepted() == 0 {
		t.Errorf("inventory against the listener: exit %d, %d connection(s) (stderr %q); want exit 1 after a connection", code, accepted(), stderr)
	}
}

// TestRunRefusedBeforeConnection: rollback --run of a run the state
// directory does not have is refused from the state directory alone, before
// etcd is connected to.
func TestRunRefusedBeforeConnection(t *testing.T) {
	ep, accepted := countingListener(t)
	t.Setenv(undo.EnvStateDir, t.TempDir())
	code, _, stderr := runCLIEnv("rollback", "--run", "20990101-000000-nosuch", "--endpoints", ep)
	if code != exitUsage || !strings.Contains(stderr, "error: --run: ") || accepted() != 0 {
		t.Errorf("exit %d, %d connection(s), stderr %q; want exit 2, --run named, no connection", code, accepted(), stderr)
	}
}

// runCLIEnv is runCLI with the environment as the test set it.
func runCLIEnv(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(append([]string{"kube-etcd-migrate"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}
