package command

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/clusterlock"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// startWriting starts the binary with args (a node's migrate) and returns
// once etcd has seen it write under /registry/: it holds the cluster's lock.
func startWriting(t *testing.T, c *testcluster.Cluster, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	rev := c.Revision()
	cmd := exec.Command(toolBinary(t), args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		// A run that ends without writing ends the wait.
		for ctx.Err() == nil {
			if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
				cancel()
			}
			if p, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err != nil || strings.Contains(string(p), ") Z ") {
				cancel()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	for resp := range c.Cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if len(resp.Events) > 0 {
			return cmd, &errb
		}
	}
	t.Fatalf("%v wrote nothing; stderr:\n%s", args, errb.String())
	return nil, nil
}

// TestOneWritingRunPerCluster: two operators on two nodes (two processes,
// two state directories) against one etcd. While the first migrate writes,
// the second is refused before it checks or writes anything (exit 1),
// naming the first run's host, PID, run ID and state directory; once the
// first ends, the second runs and names where the earlier run's undo is;
// 'runs' with etcd's flags lists both hosts' runs. A holder killed with
// SIGKILL keeps the lock until its lease expires (a short TTL here), then a
// run on the other node proceeds; a rerun in the killed run's own state
// directory on its own host takes its lock over at once.
func TestOneWritingRunPerCluster(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(1500, oldCfg)
	t.Setenv(clusterlock.EnvTTL, "4")
	host, _ := os.Hostname()
	stateA, stateB := filepath.Join(t.TempDir(), "node-a"), filepath.Join(t.TempDir(), "node-b")
	rotate := func(n int) []string {
		var providers []string
		for k := n; k >= 1; k-- {
			providers = append(providers, testcluster.AESCBC(fmt.Sprintf("key%d", k), byte(k)))
		}
		cfg := c.EncryptionConfig(fmt.Sprintf("key%d.yaml", n), append(providers, testcluster.Identity)...)
		return []string{"migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets"}
	}
	slow := func(args []string, state string) []string {
		return append(append([]string(nil), args...), "--writers", "1", "--batch-ops", "1", "--state-dir", state)
	}
	on := func(args []string, state string) []string {
		return append(append([]string(nil), args...), "--state-dir", state)
	}

	key2 := rotate(2)
	a, aErr := startWriting(t, c, slow(key2, stateA)...)
	code, out, stderr := runCLI(t, on(key2, stateB)...)
	want := fmt.Sprintf("error: another writing run holds the cluster's lock in etcd (/kube-etcd-migrate/lock): run 0001-migrate (migrate, pid %d on %s, state directory %s, since ", a.Process.Pid, host, stateA)
	if code != exitError || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was written") {
		t.Fatalf("the second node's migrate while the first writes: exit %d\n%s%s\nwant %q", code, out, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(stateB, "runs")); err == nil {
		t.Error("the refused run made a run directory")
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("the first node's migrate: %v\n%s", err, aErr.String())
	}
	if !strings.Contains(aErr.String(), "run 0001-migrate holds the cluster's lock in etcd") {
		t.Errorf("the first run does not say it holds the cluster's lock:\n%s", aErr.String())
	}
	code, out, stderr = runCLI(t, on(rotate(3), stateB)...)
	if code != exitOK || !strings.Contains(stderr, fmt.Sprintf("note: the cluster's earlier runs keep their undo elsewhere too: 0001-migrate (migrate) on %s in %s", host, stateA)) ||
		!strings.Contains(stderr, "run 0001-migrate holds the cluster's lock in etcd") || !strings.Contains(out, "rewritten 1500 of 1500") {
		t.Fatalf("the second node's migrate once the first ended: exit %d\n%s%s", code, out, stderr)
	}

	// Every host's runs, from etcd.
	code, out, stderr = runCLI(t, "runs", "--state-dir", stateB, "--endpoints", c.Srv.Endpoint, "-o", "json")
	var listed struct {
		Cluster *clusterRuns `json:"cluster"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || listed.Cluster == nil || len(listed.Cluster.Runs) != 2 {
		t.Fatalf("runs with etcd: exit %d\n%s%s", code, out, stderr)
	}
	for i, dir := range []string{stateA, stateB} {
		if r := listed.Cluster.Runs[i]; r.StateDir != dir || r.Host != host || r.State != "finished" || *r.ExitCode != 0 {
			t.Errorf("the cluster's run %d: %+v, want finished in %s", i, r, dir)
		}
	}
	code, out, stderr = runCLI(t, "runs", "--state-dir", stateB, "--endpoints", c.Srv.Endpoint)
	t.Logf("runs with etcd:\n%s", out)
	if code != exitOK || !strings.Contains(out, "the cluster's runs (etcd, every host), in the order they took the cluster's lock:") || strings.Count(out, " finished  "+host+"  ") != 2 {
		t.Errorf("runs with etcd: exit %d\n%s%s", code, out, stderr)
	}
	if _, out, _ := runCLI(t, "runs", "--state-dir", stateB); !strings.Contains(out, notAsked) {
		t.Errorf("runs without etcd's flags does not say it lists this host's runs only:\n%s", out)
	}

	// A holder killed: its lease keeps the lock for its TTL, no longer.
	key4 := rotate(4)
	k, _ := startWriting(t, c, slow(key4, stateA)...)
	if err := k.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = k.Wait()
	killed := time.Now()
	code, out, stderr = runCLI(t, on(key4, stateB)...)
	if code != exitError || !strings.Contains(stderr, fmt.Sprintf("run 0002-migrate (migrate, pid %d on %s", k.Process.Pid, host)) || !strings.Contains(stderr, "its lease frees the lock within") {
		t.Fatalf("the other node's migrate %s after the holder was killed: exit %d\n%s%s", time.Since(killed), code, out, stderr)
	}
	for {
		code, out, stderr = runCLI(t, on(key4, stateB)...)
		if code == exitOK {
			break
		}
		if time.Since(killed) > 30*time.Second || !strings.Contains(stderr, "another writing run holds the cluster's lock") {
			t.Fatalf("the other node's migrate %s after the holder was killed: exit %d\n%s%s", time.Since(killed), code, out, stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("the killed holder's lock freed %s after the kill (lease TTL 4s)", time.Since(killed).Round(100*time.Millisecond))

	// A rerun in the killed run's own state directory takes its lock over.
	key5 := rotate(5)
	k, _ = startWriting(t, c, slow(key5, stateA)...)
	if err := k.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = k.Wait()
	t.Setenv(clusterlock.EnvTTL, "600")
	code, out, stderr = runCLI(t, on(key5, stateA)...)
	if code != exitOK || !strings.Contains(stderr, fmt.Sprintf("note: run 0003-migrate (pid %d on this host, state directory %s) holds the cluster's lock but its process is gone (killed): its lock is released", k.Process.Pid, stateA)) {
		t.Fatalf("the rerun of the killed run: exit %d\n%s%s", code, out, stderr)
	}
}

// TestClusterLockFallsBackUnderAuth: etcd with auth on, the tool connecting
// as a user that may read and write under /registry/ only (as
// kube-apiserver's client certificate may): the cluster's lock cannot be
// held, and the run is not blocked: it says so on a warning line and
// migrates. (--no-undo: etcd lets only root save a snapshot, whatever the
// lock.)
func TestClusterLockFallsBackUnderAuth(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(20, oldCfg)
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := c.Cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := c.Cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.Cli.RoleAdd(ctx, "apiserver"); return err },
		func() error {
			_, err := c.Cli.RoleGrantPermission(ctx, "apiserver", "/registry/", clientv3.GetPrefixRangeEnd("/registry/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.Cli.UserAdd(ctx, "apiserver", "apiserverpw"); return err },
		func() error { _, err := c.Cli.UserGrantRole(ctx, "apiserver", "apiserver"); return err },
		func() error { _, err := c.Cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := runCLI(t, "migrate", "--no-undo", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--user", "apiserver:apiserverpw",
		"--encryption-provider-config", newCfg, "--target-version", "1.37", "--resource", "secrets")
	t.Logf("%s%s", out, stderr)
	if code != exitOK || !strings.Contains(stderr, "warning: no cluster lock: etcd refused the cluster's lock key /kube-etcd-migrate/lock") ||
		!strings.Contains(stderr, "with --no-undo no state directory's lock either: nothing keeps a second writing run out") || !strings.Contains(out, "rewritten 20 of 20") {
		t.Fatalf("migrate as a user limited to /registry/: exit %d\n%s%s", code, out, stderr)
	}
}
