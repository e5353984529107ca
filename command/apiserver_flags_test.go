package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// kubeadmManifest writes testdata's kubeadm manifest with etcd at endpoint
// over plain HTTP, the prefix /registry, no encryption and no TLS files.
func kubeadmManifest(t *testing.T, endpoint string, extra ...string) string {
	t.Helper()
	data, err := os.ReadFile("../testdata/kubeadm/kube-apiserver.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(line, "--etcd-cafile"), strings.Contains(line, "--etcd-certfile"), strings.Contains(line, "--etcd-keyfile"), strings.Contains(line, "--encryption-provider-config"):
			continue
		case strings.Contains(line, "--etcd-servers="):
			line = "    - --etcd-servers=http://" + endpoint
		case strings.Contains(line, "--etcd-prefix="):
			line = "    - --etcd-prefix=/registry"
		case strings.Contains(line, "--advertise-address="):
			for _, e := range extra {
				line += "\n    - " + e
			}
		}
		keep = append(keep, line)
	}
	p := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	if err := os.WriteFile(p, []byte(strings.Join(keep, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAPIServerFlagsUsageErrors(t *testing.T) {
	unreachable := kubeadmManifest(t, "127.0.0.1:1")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--feature-gates", "NoSuchGate=true"}, "NoSuchGate"},
		{[]string{"verify", "--runtime-config", "no.such.group/v9=true"}, "no.such.group/v9"},
		{[]string{"verify", "--target-version", "1.20"}, "1.20"},
		{[]string{"inventory", "--apiserver-manifest", "/nonexistent/kube-apiserver.yaml"}, "/nonexistent/kube-apiserver.yaml"},
		{[]string{"migrate", "--apiserver-manifest", unreachable, "--apiserver-flags-file", unreachable}, "give one of them"},
		{[]string{"verify", "--apiserver-manifest", kubeadmManifest(t, "127.0.0.1:1", "--no-such-flag=1")}, "no-such-flag"},
	} {
		code, _, stderr := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and one line naming %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
}

// TestAPIServerManifestEtcd: the manifest's --etcd-servers is where the tool
// connects, and --endpoints overrides it; the one line on stderr says which.
func TestAPIServerManifestEtcd(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	code, _, stderr := runCLI(t, "inventory", "--apiserver-manifest", kubeadmManifest(t, "127.0.0.1:1"), "--dial-timeout", "1s")
	if code != exitError || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("manifest naming an unreachable etcd: exit %d, stderr %q; want exit 1 naming 127.0.0.1:1", code, stderr)
	}

	manifest := kubeadmManifest(t, srv.Endpoint, "--runtime-config=resource.k8s.io/v1beta2=true")
	code, stdout, stderr := runCLI(t, "verify", "--apiserver-manifest", manifest)
	if code != exitOK {
		t.Fatalf("verify with the manifest: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"using kube-apiserver " + manifest + ": --etcd-servers=http://" + srv.Endpoint + " (manifest)", "--etcd-prefix=/registry (manifest)", "--runtime-config=resource.k8s.io/v1beta2=true (manifest)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if stdout == "" {
		t.Errorf("verify printed no report")
	}

	code, _, stderr = runCLI(t, "verify", "--apiserver-manifest", kubeadmManifest(t, "127.0.0.1:1"), "--endpoints", srv.Endpoint)
	if code != exitOK || !strings.Contains(stderr, "--etcd-servers="+srv.Endpoint+" (command line)") {
		t.Errorf("--endpoints over the manifest: exit %d, stderr %q", code, stderr)
	}
}
