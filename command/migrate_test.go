package command

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/migrate"
)

// TestRunbookCLI is the runbook an operator follows, through the CLI: verify says
// stale (exit 3); migrate is interrupted with SIGINT mid-run, finishes its
// in-flight writes, flushes the journal and prints the summary; verify still says
// stale; migrate again finishes the job (exit 0); verify says current (exit 0).
func TestRunbookCLI(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 1500
	c.SeedMany(n, oldCfg)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg}

	code, out, stderr := runCLI(t, append([]string{"verify", "-o", "json"}, conn...)...)
	if code != exitStale {
		t.Fatalf("verify before: exit %d, want %d\n%s%s", code, exitStale, out, stderr)
	}

	bin := toolBinary(t)
	journal := filepath.Join(c.Dir, "journal")
	startRev := c.Revision()
	cmd := exec.Command(bin, append([]string{"migrate", "--target-version", "1.37", "--liveness-window", "500ms", "-o", "json", "--journal", journal, "--writers", "1", "--batch-ops", "1"}, conn...)...)
	var stdout, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writes := 0
	for resp := range c.Cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(startRev+1)) {
		if writes += len(resp.Events); writes >= 100 {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != exitError {
		t.Fatalf("interrupted migrate: %v, want exit %d\nstderr:\n%s", err, exitError, errb.String())
	}
	if !strings.Contains(errb.String(), "interrupted") {
		t.Errorf("stderr does not say it was interrupted:\n%s", errb.String())
	}
	var sum migrate.Summary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout.String())
	}
	if !sum.Interrupted || sum.Summary.Rewritten < 100 || sum.Summary.Rewritten >= 2*n || sum.Summary.Failed != 0 {
		t.Fatalf("interrupted summary %+v", sum.Summary)
	}
	// The journal was flushed: every write that landed has its "done" record.
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	done := strings.Count(string(data), `"op":"done"`)
	if int64(done) != sum.Summary.Rewritten {
		t.Fatalf("journal has %d done records, summary says %d rewritten", done, sum.Summary.Rewritten)
	}
	if fi, err := os.Stat(journal); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}

	if code, out, stderr = runCLI(t, append([]string{"verify"}, conn...)...); code != exitStale {
		t.Fatalf("verify after interruption: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr = runCLI(t, append([]string{"migrate", "-o", "json", "--target-version", "1.37", "--liveness-window", "500ms"}, conn...)...); code != exitOK {
		t.Fatalf("migrate again: exit %d\n%s%s", code, out, stderr)
	}
	var again migrate.Summary
	if err := json.Unmarshal([]byte(out), &again); err != nil {
		t.Fatal(err)
	}
	if again.Summary.Current != sum.Summary.Rewritten || again.Summary.Rewritten != 2*n-sum.Summary.Rewritten {
		t.Fatalf("resumed run: %+v (first run rewrote %d)", again.Summary, sum.Summary.Rewritten)
	}
	if code, out, stderr = runCLI(t, append([]string{"verify"}, conn...)...); code != exitOK {
		t.Fatalf("verify after migrate: exit %d\n%s%s", code, out, stderr)
	}
}

// TestSpaceCLI: migrate says which quota it keeps below and where it found
// it (etcd's own metrics, not told), that it compacts (--compact-history),
// and the database size before and after;
// under etcd's NOSPACE alarm verify reports it, and rollback and quarantine
// refuse with one line naming the remedy (exit 1, nothing written).
func TestSpaceCLI(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{QuotaBackendBytes: 8 << 20})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	for i := 0; i < 20; i++ {
		c.Put(fmt.Sprintf("/registry/secrets/ns/s-%02d", i), testcluster.SecretsGR, testcluster.Secret("ns", fmt.Sprintf("s-%02d", i), "pw"), "", "", oldCfg)
	}
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	journal := filepath.Join(c.Dir, "journal")
	code, out, stderr := runCLI(t, append([]string{"migrate", "--journal", journal, "--compact-history", "--liveness-window", "500ms"}, conn...)...)
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"preflight: ok: etcd's quota: 8.0 MiB, from etcd_server_quota_backend_bytes of member", "preflight: ok: --compact-history: ", "etcd database: "} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate's output does not say %q:\n%s", want, out)
		}
	}

	ctx := context.Background()
	big := strings.Repeat("x", 64<<10)
	var full error
	for i := 0; i < 400 && full == nil; i++ {
		_, full = c.Cli.Put(ctx, fmt.Sprintf("/filler/%d", i), big)
		if i%8 == 7 {
			time.Sleep(110 * time.Millisecond) // etcd checks its committed size
		}
	}
	if full == nil {
		t.Fatal("could not fill an 8 MiB quota")
	}
	code, out, stderr = runCLI(t, append([]string{"verify"}, conn...)...)
	if code != exitOK || !strings.Contains(out, "ALARM: etcd NOSPACE on member ") {
		t.Fatalf("verify under the alarm: exit %d\n%s%s", code, out, stderr)
	}
	before := c.Revision()
	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--journal", journal, "--encryption-provider-config", newCfg)
	if code != exitError || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "error: rollback writes too, and etcd has active alarms: NOSPACE") || !strings.Contains(stderr, "etcdctl alarm disarm") {
		t.Fatalf("rollback under the alarm: exit %d\nstdout:\n%sstderr:\n%s", code, out, stderr)
	}
	if c.Revision() != before {
		t.Fatal("rollback wrote under the alarm")
	}
	// quarantine too (its objects, now under key2, unreadable with key1
	// alone): refused before its first removal, nothing written.
	code, out, stderr = runCLI(t, "quarantine", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", oldCfg, "--reason", "undecryptable", "--resource", "secrets",
		"--liveness-window", "500ms", "--journal", filepath.Join(c.Dir, "quarantine.journal"))
	if code != exitError || !strings.Contains(stderr, "etcd has active alarms: NOSPACE") {
		t.Fatalf("quarantine under the alarm: exit %d\nstdout:\n%sstderr:\n%s", code, out, stderr)
	}
	if c.Revision() != before {
		t.Fatal("quarantine wrote under the alarm")
	}
}

// TestRollbackSpaceCLI: after a migrate that fit etcd's quota only by
// compacting as it went, its rollback would write back more than the room
// left: rollback refuses before any write, in one line naming
// --compact-history (a dry run says the same); with --compact-history it
// restores every key byte for byte below the quota, says how often it
// compacted, and etcd raises no alarm.
func TestRollbackSpaceCLI(t *testing.T) {
	const quota, n = 4<<20 + 512<<10, 600
	c := testcluster.New(t, testetcd.Options{QuotaBackendBytes: quota})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	ctx := context.Background()
	values := map[string][]byte{}
	var ops []clientv3.Op
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("s-%04d", i)
		key := "/registry/secrets/ns/" + name
		values[key] = c.Encode(key, testcluster.SecretsGR, testcluster.Secret("ns", name, strings.Repeat(fmt.Sprintf("%x", i), 2000)[:2000]), "", "", oldCfg)
		ops = append(ops, clientv3.OpPut(key, string(values[key])))
		if len(ops) == 32 || i == n-1 {
			if _, err := c.Cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	time.Sleep(150 * time.Millisecond)
	// The plan, before the outage, says the undo will need compaction.
	code, out, stderr := runCLI(t, "plan", "--compact-history", "--state-dir", filepath.Join(c.Dir, "state"), "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37")
	if code != exitOK || !strings.Contains(out, "\nwarning: the undo: a rollback of this run writes about") || !strings.Contains(out, "run it as rollback --compact-history") {
		t.Fatalf("plan: exit %d, want 0 and the undo's need for --compact-history named\nstdout:\n%sstderr:\n%s", code, out, stderr)
	}
	t.Logf("plan:\n%s", out)
	journal := filepath.Join(c.Dir, "journal")
	code, out, stderr = runCLI(t, "migrate", "--journal", journal, "--compact-history", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37")
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	time.Sleep(150 * time.Millisecond)

	before := c.Revision()
	for _, dry := range []bool{false, true} {
		args := []string{"rollback", "--journal", journal, "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg}
		if dry {
			args = append(args, "--dry-run")
		}
		code, out, stderr = runCLI(t, args...)
		if code != exitError || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "the rollback would add about") || !strings.Contains(stderr, "rerun with --compact-history") {
			t.Fatalf("rollback (dry run %v) past the room left: exit %d\nstdout:\n%sstderr:\n%s", dry, code, out, stderr)
		}
		if c.Revision() != before {
			t.Fatalf("the refused rollback (dry run %v) wrote", dry)
		}
		t.Logf("dry run %v: %s%s", dry, out, stderr)
	}

	code, out, stderr = runCLI(t, "rollback", "--journal", journal, "--compact-history", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg)
	if code != exitOK {
		t.Fatalf("rollback --compact-history: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("%s", out)
	for _, want := range []string{fmt.Sprintf("restored %d, unchanged 0, skipped 0", n), "preflight: --compact-history: ", "--compact-history compacted "} {
		if !strings.Contains(out, want) {
			t.Errorf("rollback's output does not say %q:\n%s", want, out)
		}
	}
	alarms, err := etcdscan.Alarms(ctx, c.Cli)
	if err != nil || len(alarms) != 0 {
		t.Fatalf("alarms after the rollback: %v %v", alarms, err)
	}
	for key, want := range values {
		if got, _, _ := c.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("%s: not restored byte for byte", key)
		}
	}
}
