package command

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// runCLI runs the command line in-process, with the state directory of the
// writing commands in the test's own directory (one per test, kept across its calls).
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv(undo.EnvStateDir, testcluster.StateDir(t))
	var out, errb bytes.Buffer
	code = run(append([]string{"kube-etcd-migrate"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"inventory", "--no-such-flag"},
		{"inventory", "-o", "xml", "--endpoints", "127.0.0.1:1"},
		{"inspect", "--endpoints", "127.0.0.1:1"},
		{"verify", "--page-size", "many"},
		{"migrate", "--liveness-window", "0s", "--endpoints", "127.0.0.1:1"},
		{"quarantine", "--liveness-window", "-1s", "--reason", "undecryptable", "--resource", "secrets", "--journal", "j", "--endpoints", "127.0.0.1:1"},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
		if !strings.HasPrefix(stderr, "error: ") {
			t.Errorf("%v: stderr %q, want an error line", args, stderr)
		}
	}
}

// TestBinary runs the built binary: against an unreachable etcd it fails with
// exit 1 and exactly one line on stderr (no gRPC retry logs); against a real etcd
// its inventory writes the table and nothing on stderr.
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kube-etcd-migrate")
	build := exec.Command("go", "build", "-o", bin, "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "inventory", "--endpoints", "127.0.0.1:1", "--dial-timeout", "1s")
	cmd.Env = append(os.Environ(), "ETCDCTL_ENDPOINTS=", "ETCDCTL_CACERT=", "ETCDCTL_CERT=", "ETCDCTL_KEY=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != exitError {
		t.Fatalf("exit %v, want %d; stderr:\n%s", err, exitError, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "error: ") || !strings.Contains(lines[0], "127.0.0.1:1") {
		t.Errorf("stderr is not one error line naming the endpoint:\n%s", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}

	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put(t, cli, "/registry/configmaps/default/app", schema.GroupResource{Resource: "configmaps"},
		&api.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"}, Data: map[string]string{"k": "v"}})
	// A value no configured key can decrypt: reported in the table, not logged.
	if _, err := cli.Put(context.Background(), "/registry/secrets/default/locked", "k8s:enc:aescbc:v1:gone:"+strings.Repeat("\x01", 48)); err != nil {
		t.Fatal(err)
	}
	encCfg := filepath.Join(t.TempDir(), "enc.yaml")
	if err := os.WriteFile(encCfg, []byte("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: gone\n        secret: "+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))+"\n  - identity: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(bin, "inventory", "--endpoints", srv.Endpoint, "--encryption-provider-config", encCfg)
	cmd.Env = append(os.Environ(), "ETCDCTL_ENDPOINTS=", "ETCDCTL_CACERT=", "ETCDCTL_CERT=", "ETCDCTL_KEY=")
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("inventory: %v\nstderr:\n%s", err, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("inventory wrote on stderr:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "configmaps") || !strings.Contains(stdout.String(), "v1=1") {
		t.Errorf("inventory table:\n%s", stdout.String())
	}
}

func put(t *testing.T, cli *clientv3.Client, key string, gr schema.GroupResource, obj runtime.Object, opts ...clientv3.OpOption) {
	t.Helper()
	sc, err := decode.NewStorageConfig("")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := sc.Codec(gr)
	if err != nil {
		t.Fatal(err)
	}
	value, err := runtime.Encode(rc.Codec, obj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), key, string(value), opts...); err != nil {
		t.Fatal(err)
	}
}

func TestInventoryAndInspectCLI(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	om := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0)}
	}
	secrets := schema.GroupResource{Resource: "secrets"}
	put(t, cli, "/registry/secrets/default/db", secrets, &api.Secret{ObjectMeta: om("default", "db"), Type: api.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("s3cr3t-value")}})
	put(t, cli, "/registry/configmaps/default/app", schema.GroupResource{Resource: "configmaps"}, &api.ConfigMap{ObjectMeta: om("default", "app"), Data: map[string]string{"k": "v"}})
	lease, err := cli.Grant(context.Background(), 600)
	if err != nil {
		t.Fatal(err)
	}
	put(t, cli, "/registry/events/default/e1", schema.GroupResource{Resource: "events"},
		&api.Event{ObjectMeta: om("default", "e1"), InvolvedObject: api.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"}, Reason: "Started", Type: "Normal", Count: 1},
		clientv3.WithLease(lease.ID))
	if _, err := cli.Put(context.Background(), "/registry/configmaps/default/broken", "garbage"); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCLI(t, "inventory", "--endpoints", srv.Endpoint, "-o", "json")
	if code != exitOK {
		t.Fatalf("inventory exit %d, stderr:\n%s", code, stderr)
	}
	var inv struct {
		Revision   int64 `json:"revision"`
		Consistent bool  `json:"consistent"`
		Resources  []struct {
			Group      string           `json:"group"`
			Resource   string           `json:"resource"`
			Count      int64            `json:"count"`
			Bytes      int64            `json:"bytes"`
			WithLease  int64            `json:"withLease"`
			Unreadable int64            `json:"unreadable"`
			Versions   map[string]int64 `json:"versions"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(stdout), &inv); err != nil {
		t.Fatalf("inventory -o json is not JSON: %v\n%s", err, stdout)
	}
	if inv.Revision == 0 || !inv.Consistent {
		t.Errorf("revision %d consistent %v", inv.Revision, inv.Consistent)
	}
	got := map[string]string{}
	for _, r := range inv.Resources {
		b, _ := json.Marshal(r)
		got[r.Resource] = string(b)
		switch r.Resource {
		case "configmaps":
			if r.Count != 2 || r.Unreadable != 1 || r.Versions["v1"] != 1 {
				t.Errorf("configmaps: %s", b)
			}
		case "secrets":
			if r.Count != 1 || r.Bytes <= 0 {
				t.Errorf("secrets: %s", b)
			}
		case "events":
			if r.Count != 1 || r.WithLease != 1 {
				t.Errorf("events: %s", b)
			}
		}
	}
	if len(got) != 3 {
		t.Errorf("resources %v, want configmaps, events, secrets", got)
	}
	if strings.Contains(stdout, "s3cr3t-value") {
		t.Error("inventory printed secret data")
	}

	code, stdout, stderr = runCLI(t, "inspect", "--endpoints", srv.Endpoint, "/registry/secrets/default/db")
	if code != exitOK || !strings.Contains(stdout, "<redacted 12 bytes>") || strings.Contains(stdout, "czNjcjN0LXZhbHVl") {
		t.Errorf("inspect: exit %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, "inspect", "--endpoints", srv.Endpoint, "--show-secrets", "/registry/secrets/default/db")
	if code != exitOK || !strings.Contains(stdout, "password: czNjcjN0LXZhbHVl") {
		t.Errorf("inspect --show-secrets: exit %d, stdout:\n%s", code, stdout)
	}
	code, _, stderr = runCLI(t, "inspect", "--endpoints", srv.Endpoint, "/registry/configmaps/default/broken")
	if code != exitError || !strings.Contains(stderr, "/registry/configmaps/default/broken") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("inspect of a corrupt key: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, "inspect", "--endpoints", srv.Endpoint, "/registry/secrets/default/none")
	if code != exitError || stderr != "error: key not found: /registry/secrets/default/none\n" {
		t.Errorf("inspect of a missing key: exit %d, stderr %q", code, stderr)
	}
}

// TestMigrateMemoryLimit: migrate raises the soft memory limit to its own
// default, unless GOMEMLIMIT is set (then the runtime's, from it, stays).
func TestMigrateMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	if v, set := os.LookupEnv("GOMEMLIMIT"); set {
		t.Cleanup(func() { os.Setenv("GOMEMLIMIT", v) })
	}
	os.Unsetenv("GOMEMLIMIT")
	debug.SetMemoryLimit(defaultMemoryLimit)
	setMemoryLimit(migrateMemoryLimit)
	if got := debug.SetMemoryLimit(-1); got != migrateMemoryLimit {
		t.Errorf("without GOMEMLIMIT: limit %d MiB, want %d", got>>20, migrateMemoryLimit>>20)
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	debug.SetMemoryLimit(100 << 20)
	setMemoryLimit(migrateMemoryLimit)
	if got := debug.SetMemoryLimit(-1); got != 100<<20 {
		t.Errorf("with GOMEMLIMIT=100MiB: limit %d MiB, want 100", got>>20)
	}
}
