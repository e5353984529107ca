// Command demo is `make demo`: it starts a throw-away etcd on loopback, seeds it with a
// stale Kubernetes cluster (internal/testrig/seed), and runs the kube-etcd-migrate binary
// against it as an operator would: inventory, inspect, verify, migrate --dry-run,
// migrate, verify, inventory. Each command line is printed before its output. It exits
// non-zero when a command's exit code is not the expected one, and removes its etcd
// and temporary directory on exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/undo"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/grpclog"

	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

const binName = "kube-etcd-migrate"

func main() {
	bin := flag.String("bin", "", "kube-etcd-migrate binary to run (default: build it from the module into the demo's temp dir)")
	scale := flag.Int("scale", 1, "seed size: 4 team namespaces (about 320 objects) per unit")
	goCmd := flag.String("go", "go", "go command used to build the binary when -bin is not given")
	flag.Parse()
	// The demo's own etcd client logs gRPC reconnect noise when it closes; what the
	// user should read is the tool's output.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
	os.Exit(run(*bin, *goCmd, *scale, os.Stdout, os.Stderr))
}

// step is one command the operator runs, and the exit code the demo expects.
type step struct {
	comment string
	args    []string
	want    int
}

func run(bin, goCmd string, scale int, stdout, stderr io.Writer) int {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	tmp, err := os.MkdirTemp("", "kube-etcd-migrate-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	if bin == "" {
		bin, err = build(ctx, goCmd, tmp, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "demo: %v\n", err)
			return 1
		}
	} else if bin, err = filepath.Abs(bin); err != nil {
		fmt.Fprintf(stderr, "demo: -bin: %v\n", err)
		return 1
	}

	fmt.Fprintln(stdout, "# Starting a throw-away etcd on loopback (data in", tmp+")")
	srv, err := testetcd.Start(testetcd.Options{Dir: filepath.Join(tmp, "etcd")})
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		fmt.Fprintf(stderr, "demo: etcd client: %v\n", err)
		return 1
	}
	res, err := seed.Cluster(ctx, cli, seed.Options{Dir: tmp, Scale: scale})
	cli.Close()
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "# Seeded %d objects as kube-apiserver wrote them (%s).\n", res.Objects, counts(res.Counts))
	fmt.Fprintln(stdout, "# The story: secrets were encrypted with aescbc key1; the operator has now rotated to key2")
	fmt.Fprintf(stdout, "# (encryption-config-new.yaml: aescbc [key2, key1], identity) and upgraded to kube-apiserver %s,\n", release.Linked())
	fmt.Fprintln(stdout, "# which stores DeviceClasses as resource.k8s.io/v1 and widgets.example.com as v1. Older writes are stale:")
	fmt.Fprintln(stdout, "# secrets under key1, DeviceClasses at v1beta1/v1beta2, widgets at v1beta1, some objects in JSON.")
	fmt.Fprintln(stdout, "# kube-apiserver is stopped (its identity lease is old); etcd keeps running.")
	fmt.Fprintln(stdout)

	newCfg := filepath.Base(res.NewConfig)
	// etcd named on the command line: without it (or a kube-apiserver
	// configuration), the tool would look for the control plane of the
	// machine the demo runs on.
	enc := []string{"--encryption-provider-config", newCfg}
	live := append([]string{"--endpoints", srv.URL}, enc...)
	// kube-apiserver's own command line, as a systemd unit or a kubeadm
	// manifest holds it: the tool takes etcd, the prefix and the encryption
	// configuration from it (--apiserver-manifest reads a static pod).
	flagsFile := "kube-apiserver.flags"
	flags := fmt.Sprintf("# kube-apiserver's command line (one flag per line, as in its systemd unit)\n--etcd-servers=%s\n--etcd-prefix=/registry\n--encryption-provider-config=%s\n--authorization-mode=Node,RBAC\n", srv.URL, res.NewConfig)
	if err := os.WriteFile(filepath.Join(tmp, flagsFile), []byte(flags), 0o600); err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	// A flags file does not say which release runs it (a manifest's image
	// would): --target-version does, and migrate refuses to write without it.
	api := []string{"--apiserver-flags-file", flagsFile, "--target-version", release.Linked()}
	steps := []step{
		{"Which Kubernetes release this binary stores objects as (its scheme and storage factory).", []string{"version"}, 0},
		{"What is in etcd, per resource: versions, media types, encryption keys, leases.", append([]string{"inventory"}, live...), 0},
		{"One secret with its storage header, and what migrate would do to it; the data is redacted.", append(append([]string{"inspect"}, live...), res.SecretKey), 0},
		{"Read-only audit against " + release.Linked() + " and the new key, configured from kube-apiserver's own flags: exit 3 means stale objects, all readable.", append([]string{"verify"}, api...), 3},
		{"The plan, read-only (on a real cluster, before kube-apiserver is stopped): what a migration would rewrite, every check it makes before its first write but liveness, and how long it would take.", append([]string{"plan"}, api...), 0},
		{"The migration: compare-and-swap writes, leases kept; its undo kept automatically in a run directory of the state directory (a snapshot before the first write, the old values journaled).", append([]string{"migrate"}, api...), 0},
		{"The runs kept in the state directory, where each one's undo is and the encryption keys it needs; --verify reads every byte of each.", []string{"runs", "--verify"}, 0},
		{"The audit again: exit 0, everything current.", append([]string{"verify"}, api...), 0},
		{"The census after the migration.", append([]string{"inventory"}, live...), 0},
		{"The snapshot taken before the migration's first write, read from the file: still stale (3), but readable with these keys (not 4).", append([]string{"verify", "--snapshot-file", "state/runs/0001-migrate/snapshot.db", "--show-keys", "1"}, enc...), 3},
		{"If the upgrade had to be undone: first what a rollback of the run would do, writing nothing: its journal read whole and verified, every value it would put back decrypted with kube-apiserver's encryption configuration.", []string{"rollback", "--apiserver-flags-file", flagsFile, "--run", "0001-migrate", "--dry-run"}, 0},
		{"Then the rollback: the journaled old bytes back (compare-and-swap on the new mod revisions), itself a run with its own undo.", []string{"rollback", "--apiserver-flags-file", flagsFile, "--run", "0001-migrate"}, 0},
		{"Back where it started: the same audit says stale again (exit 3).", append([]string{"verify", "--show-keys", "1"}, api...), 3},
	}

	env := append(os.Environ(), "ETCDCTL_ENDPOINTS=", undo.EnvStateDir+"="+filepath.Join(tmp, "state"))
	fmt.Fprintf(stdout, "$ cd %s\n$ export %s=%s\n\n", tmp, undo.EnvStateDir, filepath.Join(tmp, "state"))
	for i, s := range steps {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "demo: interrupted")
			return 1
		}
		fmt.Fprintf(stdout, "# %d/%d %s\n$ %s %s\n", i+1, len(steps), s.comment, binName, strings.Join(s.args, " "))
		code, err := execStep(ctx, bin, tmp, env, s.args, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "demo: %s %s: %v\n", binName, s.args[0], err)
			return 1
		}
		fmt.Fprintf(stdout, "(exit %d)\n\n", code)
		if code != s.want {
			fmt.Fprintf(stderr, "demo: step %d (%s %s) exited %d, expected %d\n", i+1, binName, strings.Join(s.args, " "), code, s.want)
			return 1
		}
	}
	fmt.Fprintf(stdout, "# Demo finished in %s: every step exited as expected. Removing etcd and %s.\n", time.Since(start).Round(100*time.Millisecond), tmp)
	return 0
}

// build compiles the module's main package into dir.
func build(ctx context.Context, goCmd, dir string, stdout, stderr io.Writer) (string, error) {
	gomod, err := exec.CommandContext(ctx, goCmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if root == "." || root == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", errors.New("run the demo from inside the kube-etcd-migrate module (make demo)")
	}
	bin := filepath.Join(dir, binName)
	fmt.Fprintf(stdout, "# Building %s (go build -o %s .)\n", binName, bin)
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build: %w", err)
	}
	return bin, nil
}

// execStep runs one command with a time limit and returns its exit code.
func execStep(ctx context.Context, bin, dir string, env, args []string, stdout, stderr io.Writer) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// On cancellation ask for a graceful stop first (the tool finishes in-flight writes).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return -1, fmt.Errorf("stopped: %w", ctx.Err())
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return exitErr.ExitCode(), nil
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
