package command

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/writerun"
)

// listRuns is 'runs -o json', by ID.
func listRuns(t *testing.T) map[string]writerun.RunView {
	t.Helper()
	code, out, stderr := runCLI(t, "runs", "-o", "json")
	if code != exitOK {
		t.Fatalf("runs: exit %d\n%s%s", code, out, stderr)
	}
	var listed struct {
		Runs []writerun.RunView `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("runs -o json: %v\n%s", err, out)
	}
	byID := map[string]writerun.RunView{}
	for _, r := range listed.Runs {
		byID[r.ID] = r
	}
	return byID
}

// waitWrites waits until etcd shows n writes under /registry/ after rev.
func waitWrites(t *testing.T, c *testcluster.Cluster, rev int64, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writes := 0
	for resp := range c.Cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if writes += len(resp.Events); writes >= n {
			return
		}
	}
	t.Fatalf("only %d writes seen", writes)
}

// savedOutput reads a run's output file, checking its mode.
func savedOutput(t *testing.T, state, id string) string {
	t.Helper()
	path := filepath.Join(state, "runs", id, undo.OutputFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("run %s's output: %v %v, want mode 0600", id, fi, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRunOutlivesTerminal is a run whose SSH session drops: SIGHUP to a
// migrate that is writing (listed as running meanwhile) lets it finish, exit
// 0, with everything it printed (stdout and stderr) in its run directory; a
// migrate whose stdout and stderr are pipes nobody reads any more (a '| tee'
// that died, '| head -c1') finishes with the exit code it would have had,
// its output saved all the same; a migrate killed with SIGKILL is listed as
// killed.
func TestRunOutlivesTerminal(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	key2 := c.EncryptionConfig("key2.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	key3 := c.EncryptionConfig("key3.yaml", testcluster.AESCBC("key3", 3), testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	key4 := c.EncryptionConfig("key4.yaml", testcluster.AESCBC("key4", 4), testcluster.AESCBC("key3", 3), testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 1500
	c.SeedMany(n, oldCfg)
	state := testcluster.StateDir(t)
	t.Setenv(undo.EnvStateDir, state)
	migrate := func(cfg string) []string {
		return []string{"migrate", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", cfg, "--target-version", "1.37",
			"--resource", "secrets", "--liveness-window", "500ms", "--writers", "1", "--batch-ops", "1"}
	}

	// 1. SIGHUP mid-run.
	rev := c.Revision()
	cmd := exec.Command(toolBinary(t), migrate(key2)...)
	cmd.Env = append(os.Environ(), undo.EnvStateDir+"="+state)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitWrites(t, c, rev, 100)
	if r := listRuns(t)["0001-migrate"]; r.State != undo.StateRunning {
		t.Errorf("run 0001-migrate, writing: state %q, want running", r.State)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("migrate after SIGHUP: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	saved := savedOutput(t, state, "0001-migrate")
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()+stderr.String()), "\n") {
		if !strings.Contains(saved, line) {
			t.Errorf("the saved output lacks the line %q", line)
		}
	}
	for _, want := range []string{"run 0001-migrate: its undo is kept", "note: SIGHUP", "secrets"} {
		if !strings.Contains(saved, want) {
			t.Errorf("the saved output does not say %q:\n%s", want, saved)
		}
	}
	r := listRuns(t)["0001-migrate"]
	if r.State != undo.StateFinished || r.ExitCode == nil || *r.ExitCode != exitOK || r.KeysWritten != n || r.Output != filepath.Join(state, "runs", "0001-migrate", undo.OutputFile) {
		t.Errorf("run 0001-migrate after SIGHUP: %+v", r)
	}

	// 2. Nobody reads stdout or stderr any more.
	cmd = exec.Command(toolBinary(t), migrate(key3)...)
	cmd.Env = append(os.Environ(), undo.EnvStateDir+"="+state)
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1)
	if _, err := errPipe.Read(first); err != nil { // as 'head -c1' reads
		t.Fatal(err)
	}
	outPipe.Close()
	errPipe.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("migrate into closed pipes: %v (want exit 0, as with a reader)", err)
	}
	saved = savedOutput(t, state, "0002-migrate")
	if !strings.Contains(saved, "run 0002-migrate: its undo is kept") || !strings.Contains(saved, "secrets") {
		t.Errorf("the saved output of the run into closed pipes:\n%s", saved)
	}
	if r := listRuns(t)["0002-migrate"]; r.State != undo.StateFinished || r.KeysWritten != n {
		t.Errorf("run 0002-migrate: %+v", r)
	}

	// 3. SIGKILL.
	killMidRun(t, c, 100, migrate(key4)...)
	if r := listRuns(t)["0003-migrate"]; r.State != undo.StateKilled || r.Finished() {
		t.Errorf("run 0003-migrate, killed: %+v", r)
	}
	if code, out, _ := runCLI(t, "runs"); code != exitOK || !strings.Contains(out, "killed: 0003-migrate") {
		t.Errorf("runs does not say the killed run is:\n%s", out)
	}
}
