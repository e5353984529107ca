package command

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// TestInternalErrorLine: a panic of a command's action, or one a goroutine
// carried back as its error (however wrapped, even in an exit code of its
// own), is exit 70 and one line on stderr: the panic, where, that it is a
// bug, and what was written — nothing for a read-only command, the journal
// for a writing one.
func TestInternalErrorLine(t *testing.T) {
	for _, tc := range []struct {
		name, command string
		action        cli.ActionFunc
		want          []string
	}{
		{"the action panics", "verify", func(*cli.Context) error {
			var p *struct{ n int }
			_ = p.n
			return nil
		}, []string{"internal error: panic while running verify: runtime error: invalid memory address or nil pointer dereference, in kube-etcd-migrate/command.TestInternalErrorLine.func1 (internal_error_test.go:", "nothing was written"}},
		{"a goroutine's panic, wrapped", "migrate", func(*cli.Context) error {
			p := &crash.Panic{Where: "writing a batch", Value: "invalid memory address or nil pointer dereference", At: "migrate.writeBatch (migrate.go:1)"}
			return &codeError{code: exitError, err: fmt.Errorf("run: %w", p)}
		}, []string{"internal error: panic while writing a batch: invalid memory address or nil pointer dereference, in migrate.writeBatch (migrate.go:1)", "every write it made was journaled first"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			app := newApp(&stdout, &stderr)
			for _, c := range app.Commands {
				if c.Name == tc.command {
					c.Action = guarded(c.Name, tc.action)
				}
			}
			code := exitFor(app.Run([]string{"kube-etcd-migrate", tc.command}), &stderr)
			line := stderr.String()
			if code != exitInternal || strings.Count(line, "\n") != 1 || !strings.HasPrefix(line, tc.want[0]) || !strings.Contains(line, tc.want[1]) {
				t.Errorf("exit %d, stderr %q: want %d and one line starting %q, saying %q", code, line, exitInternal, tc.want[0], tc.want[1])
			}
		})
	}
}

// TestBinaryInternalError drives real panics in the built tool (built with
// -tags crashhook, whose hook dereferences a nil pointer where
// KUBE_ETCD_MIGRATE_PANIC_AT says): in the producer of a scan, in a decoding
// worker, in a writer of migrate after its first batch is written. Each is
// exit 70 and one line; what migrate wrote is in its journal, and rollback
// puts the value back byte for byte.
func TestBinaryInternalError(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kube-etcd-migrate")
	if out, err := exec.Command("go", "build", "-tags", "crashhook", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	// A ConfigMap stored as JSON: stale (media type) for a protobuf target.
	const key = "/registry/configmaps/default/app"
	const stored = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"app","namespace":"default","uid":"uid-app","creationTimestamp":"2023-11-14T22:13:20Z"},"data":{"k":"v"}}`
	if _, err := cli.Put(ctx, key, stored); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoint
	snap := filepath.Join(t.TempDir(), "snap.db")
	if err := etcdscan.Snapshot(ctx, cli, snap); err != nil {
		t.Fatal(err)
	}
	journal, stateDir := filepath.Join(t.TempDir(), "journal"), testcluster.StateDir(t)
	at := func(point string, args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "ETCDCTL_ENDPOINTS=", "KUBE_ETCD_MIGRATE_PANIC_AT="+point, undo.EnvStateDir+"="+stateDir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stderr.String()
	}
	for _, tc := range []struct {
		point string
		args  []string
		want  []string
	}{
		{"scan", []string{"inventory", "--snapshot-file", snap}, []string{"internal error: panic while scanning: runtime error: invalid memory address or nil pointer dereference, in kube-etcd-migrate/internal/crash.At (", "nothing was written"}},
		{"decide", []string{"verify", "--endpoints", ep}, []string{"internal error: panic while deciding " + key + ": runtime error: invalid memory address", "nothing was written"}},
		{"written", []string{"migrate", "--endpoints", ep, "--liveness-window", "500ms", "--journal", journal, "--target-version", "1.37"}, []string{"internal error: panic while writing a batch: runtime error: invalid memory address", "every write it made was journaled first"}},
	} {
		code, stderr := at(tc.point, tc.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != exitInternal || strings.Count(stderr, "internal error") != 1 || strings.Contains(stderr, "goroutine ") ||
			!strings.HasPrefix(last, tc.want[0]) || !strings.Contains(last, tc.want[1]) || !strings.Contains(last, "a bug of kube-etcd-migrate") {
			t.Errorf("%s at %s: exit %d, stderr:\n%s\nwant exit %d and one line starting %q, saying %q", tc.args[0], tc.point, code, stderr, exitInternal, tc.want[0], tc.want[1])
		}
	}
	// The run's record has the exit code the process had.
	runs, _ := filepath.Glob(filepath.Join(stateDir, "runs", "*-migrate", "run.json"))
	var rec struct {
		ExitCode int `json:"exitCode"`
	}
	if len(runs) != 1 {
		t.Fatalf("runs of migrate in %s: %v", stateDir, runs)
	}
	if b, err := os.ReadFile(runs[0]); err != nil || json.Unmarshal(b, &rec) != nil || rec.ExitCode != exitInternal {
		t.Errorf("%s: exit code %d (%v), want %d", runs[0], rec.ExitCode, err, exitInternal)
	}
	// migrate wrote its batch before the panic: in the journal, and undone.
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) == stored {
		t.Fatalf("migrate did not write %s before its panic: %v", key, err)
	}
	if code, stderr := at("", "rollback", "--journal", journal, "--endpoints", ep); code != 0 {
		t.Fatalf("rollback: exit %d\n%s", code, stderr)
	}
	if resp, err = cli.Get(ctx, key); err != nil || string(resp.Kvs[0].Value) != stored {
		t.Errorf("after the rollback, %s is not what it was: %v", key, err)
	}
}
