package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/updatepath"
)

// watchSecrets is the number of secrets the runs rewrite: enough that a
// rotation still writes when a kube-apiserver started at its first write has
// written its own first keys, on a loaded 2-core machine.
const watchSecrets = 50000

// toolRun is the binary started in the background.
type toolRun struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

func startTool(t *testing.T, args ...string) *toolRun {
	t.Helper()
	r := &toolRun{cmd: exec.Command(toolBinary(t), args...), done: make(chan struct{})}
	r.cmd.Env = append(os.Environ(), updatepath.CheckShortcutEnv+"=1", undo.EnvStateDir+"="+testcluster.StateDir(t))
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		var ee *exec.ExitError
		if err := r.cmd.Wait(); errors.As(err, &ee) {
			r.code = ee.ExitCode()
		} else if err != nil {
			r.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// wait waits for the run's end and returns its exit code.
func (r *toolRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the run did not end:\n%s", r.stderr.String())
	}
	t.Logf("kube-etcd-migrate %v: exit %d\n%s", r.cmd.Args[1:], r.code, r.stderr.String())
	return r.code
}

// writeTimes is what a watch of /registry/ saw: when etcd showed the run's
// first and last writes (keys under ours) and another writer's first.
type writeTimes struct {
	mu                    sync.Mutex
	firstOurs, lastOurs   time.Time
	firstOther            time.Time
	firstOtherKey         string
	oursSeen              chan struct{}
	oursOnce, cancelWatch func()
	done                  chan struct{}
}

func watchWrites(t *testing.T, cli *clientv3.Client, from int64, ours string) *writeTimes {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writeTimes{oursSeen: make(chan struct{}), cancelWatch: cancel, done: make(chan struct{})}
	var once sync.Once
	w.oursOnce = func() { once.Do(func() { close(w.oursSeen) }) }
	wch := cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(from+1))
	go func() {
		defer close(w.done)
		for resp := range wch {
			now := time.Now()
			w.mu.Lock()
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				switch {
				case strings.HasPrefix(k, ours):
					if w.firstOurs.IsZero() {
						w.firstOurs = now
						w.oursOnce()
					}
					w.lastOurs = now
				case w.firstOther.IsZero():
					w.firstOther, w.firstOtherKey = now, k
				}
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

func (w *writeTimes) stop() {
	time.Sleep(300 * time.Millisecond) // the last events arrive
	w.cancelWatch()
	<-w.done
}

// secretValues are the secrets' stored values, by key.
func secretValues(t *testing.T, c *testcluster.Cluster) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range c.Raw() {
		if strings.HasPrefix(k, "/registry/secrets/") {
			out[k] = v
		}
	}
	return out
}

// journaled fails unless every secret whose value differs from before is in
// the run's journal, written ("intent") and landed ("done").
func journaled(t *testing.T, journal string, before, after map[string]string) int {
	t.Helper()
	intents, done := map[string]bool{}, map[string]bool{}
	if err := undo.ReadJournal(journal, func(r undo.JournalRecord) error {
		switch r.Op {
		case "intent":
			intents[r.Key] = true
		case "done":
			done[r.Key] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	changed := 0
	for k, v := range after {
		if v != before[k] {
			changed++
			if !intents[k] || !done[k] {
				t.Errorf("%s written but not journaled (intent %v, done %v)", k, intents[k], done[k])
			}
		}
	}
	return changed
}

// sameSecrets fails unless every secret holds its value of before, byte for byte.
func sameSecrets(t *testing.T, before, after map[string]string) {
	t.Helper()
	if len(after) != len(before) {
		t.Errorf("%d secrets, %d before", len(after), len(before))
	}
	bad := 0
	for k, v := range before {
		if after[k] != v {
			if bad++; bad <= 5 {
				t.Errorf("%s: not its value of before", k)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d secrets not restored byte for byte", bad)
	}
}

// apiServerAppears starts a real kube-apiserver on the cluster's etcd (with
// the new encryption configuration, which reads every value, as a manifest
// put back would run) once etcd shows the tool's first write of the run,
// waits for the run's end and
// checks the stop: exit 5, the error naming a key, the run's last write
// within 2 s of the kube-apiserver's first. The kube-apiserver is stopped
// after.
func apiServerAppears(t *testing.T, c *testcluster.Cluster, run *toolRun, w *writeTimes, encCfg string) {
	t.Helper()
	select {
	case <-w.oursSeen:
	case <-run.done:
		t.Fatalf("the run ended before its first write (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the run seen:\n%s", run.stderr.String())
	}
	// Start returns once the server is healthy (stopped earlier, its
	// post-start hooks would end the test process).
	srv := apiservertest.Start(t, apiservertest.Options{EtcdURL: c.Srv.URL, EncryptionConfigPath: encCfg})
	code := run.wait(t)
	srv.Stop()
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.firstOther.IsZero() {
		t.Fatalf("the kube-apiserver wrote nothing while the run went on (exit %d)", code)
	}
	if code != 5 {
		t.Fatalf("exit %d, want 5 (stopped: a writer appeared); stdout:\n%s", code, run.stdout.String())
	}
	msg := run.stderr.String()
	if !strings.Contains(msg, "error: stopped: a writer appeared: etcd shows") || !strings.Contains(msg, "/registry/") {
		t.Errorf("the stop does not name the keys written:\n%s", msg)
	}
	if d := w.lastOurs.Sub(w.firstOther); d > 2*time.Second {
		t.Errorf("the run wrote for %s after etcd showed the kube-apiserver's first write (%s)", d, w.firstOtherKey)
	}
	t.Logf("the kube-apiserver's first write %s came %s after the run's first; the run's last write %s after it",
		w.firstOtherKey, w.firstOther.Sub(w.firstOurs).Round(time.Millisecond), w.lastOurs.Sub(w.firstOther).Round(time.Millisecond))
}

// TestAPIServerAppearsDuringMigrate: a key rotation of 50,000 secrets, and a
// real kube-apiserver started on the same etcd once the run writes (its
// manifest put back mid-run): the run stops within 2 s of etcd showing the
// kube-apiserver's first write, exit 5, every write journaled; once the
// kube-apiserver is stopped, `rollback --run` puts every secret back byte for
// byte.
func TestAPIServerAppearsDuringMigrate(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(watchSecrets, oldCfg)
	before := secretValues(t, c)
	state := testcluster.StateDir(t)

	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	run := startTool(t, "migrate", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37",
		"--resource", "secrets", "--liveness-window", "2s")
	apiServerAppears(t, c, run, w, newCfg)

	journal := filepath.Join(state, "runs", "0001-migrate", undo.JournalFile)
	written := journaled(t, journal, before, secretValues(t, c))
	if written == 0 || written == watchSecrets {
		t.Errorf("%d of %d secrets rewritten: want a run stopped part-way", written, watchSecrets)
	}
	t.Logf("stopped after %d of %d secrets rewritten", written, watchSecrets)
	// The kube-apiserver was stopped by the test itself: its master lease may
	// still have time left, which the rollback's window would wait out.
	_, stderr, code := runTool(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "0001-migrate", "--allow-live-apiserver")
	if code != 0 {
		t.Fatalf("rollback: exit %d\n%s", code, stderr)
	}
	sameSecrets(t, before, secretValues(t, c))
}

// TestAPIServerAppearsDuringRollback: the same for a rollback of the
// rotation of 50,000 secrets: a kube-apiserver started once the rollback
// writes stops it within 2 s (exit 5, every write journaled); once it is
// stopped, `rollback --run` again (which undoes the stopped rollback, then
// the migration) puts every secret back byte for byte.
func TestAPIServerAppearsDuringRollback(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(watchSecrets, oldCfg)
	before := secretValues(t, c)
	state := testcluster.StateDir(t)
	if _, stderr, code := runTool(t, "migrate", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37",
		"--resource", "secrets", "--liveness-window", "1s"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, stderr)
	}
	migrated := secretValues(t, c)

	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	run := startTool(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "0001-migrate", "--liveness-window", "2s")
	apiServerAppears(t, c, run, w, newCfg)

	journal := filepath.Join(state, "runs", "0002-rollback", undo.JournalFile)
	restored := journaled(t, journal, migrated, secretValues(t, c))
	if restored == 0 || restored == watchSecrets {
		t.Errorf("%d of %d secrets restored: want a rollback stopped part-way", restored, watchSecrets)
	}
	t.Logf("stopped after %d of %d secrets restored", restored, watchSecrets)
	_, stderr, code := runTool(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "0001-migrate", "--allow-live-apiserver")
	if code != 0 {
		t.Fatalf("rollback again: exit %d\n%s", code, stderr)
	}
	sameSecrets(t, before, secretValues(t, c))
}
