package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/updatepath"
)

// The tool as an operator runs it: the binary built from this module, once per
// test binary. Flags that are process-wide in kube-apiserver (feature gates)
// stay in the tool's own process, away from the in-process kube-apiservers.
var tool struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// kubectl of the linked release, built from k8s.io/kubernetes at that
// release in a module of its own (modbuild, cached across runs), once per
// test binary: what an operator runs against the cluster, not a client of
// the tests' own.
var kubectl struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tool.dir != "" {
		os.RemoveAll(tool.dir)
	}
	os.Exit(code)
}

func kubectlBinary(t *testing.T) string {
	t.Helper()
	kubectl.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes").Output()
		if err != nil {
			kubectl.err = fmt.Errorf("the linked k8s.io/kubernetes: %w", err)
			return
		}
		spec, err := modbuild.Kubectl(ctx, strings.TrimSpace(string(out)))
		if err != nil {
			kubectl.err = err
			return
		}
		kubectl.path, kubectl.err = modbuild.Build(ctx, spec)
	})
	if kubectl.err != nil {
		t.Fatalf("build kubectl: %v", kubectl.err)
	}
	return kubectl.path
}

func toolBinary(t *testing.T) string {
	t.Helper()
	tool.once.Do(func() {
		tool.dir, tool.err = os.MkdirTemp("", "kube-etcd-migrate-e2e-")
		if tool.err != nil {
			return
		}
		tool.path = filepath.Join(tool.dir, "kube-etcd-migrate")
		cmd := exec.Command("go", "build", "-o", tool.path, "..")
		tool.out, tool.err = cmd.CombinedOutput()
	})
	if tool.err != nil {
		t.Fatalf("build the tool: %v\n%s", tool.err, tool.out)
	}
	return tool.path
}

// runTool runs the binary and returns its stdout, stderr and exit code.
func runTool(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(toolBinary(t), args...)
	// Every object of every e2e run goes through the field manager
	// shortcut and the full field manager both; an object on which they
	// differ is an error of the run (updatepath.CheckShortcutEnv).
	cmd.Env = append(os.Environ(), updatepath.CheckShortcutEnv+"=1", undo.EnvStateDir+"="+testcluster.StateDir(t))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	t.Logf("kube-etcd-migrate %v: exit %d\n%s", args, code, stderr.String())
	return stdout.String(), stderr.String(), code
}
