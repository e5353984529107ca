package command

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestAPIServerManifestKMSSocket: kube-apiserver's manifest mounts the KMS
// plugin's socket directory from the host at another path in its container,
// and its encryption configuration names the container path. verify with the
// manifest reads a secret kube-apiserver wrote through the plugin (it dials
// the host path, and says so on stderr); the tool's own
// --encryption-provider-config is used as written; a socket under no hostPath
// mount is one line naming the endpoint and the manifest.
func TestAPIServerManifestKMSSocket(t *testing.T) {
	const containerEndpoint = "unix:///var/run/kmsplugin/kms.sock"
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	kms := func(endpoint string) string {
		return fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 3s}\n", endpoint)
	}
	// The configuration as kube-apiserver uses it, reaching the plugin from its container.
	hostCfg := c.EncryptionConfig("host.yaml", kms(plugin.Endpoint()), testcluster.Identity)
	c.Put("/registry/secrets/default/db", testcluster.SecretsGR, testcluster.Secret("default", "db", "pw"), "", "", hostCfg)

	encDir := t.TempDir()
	encFile := filepath.Join(encDir, "encryption-config.yaml")
	written := strings.Replace(readFile(t, hostCfg), plugin.Endpoint(), containerEndpoint, 1)
	if err := os.WriteFile(encFile, []byte(written), 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := func(socketMount bool) string {
		p := kubeadmManifest(t, c.Srv.Endpoint, "--encryption-provider-config=/etc/kubernetes/enc/encryption-config.yaml")
		s := strings.Replace(readFile(t, p), "      path: /etc/kubernetes/encryption\n", "      path: "+encDir+"\n", 1)
		if socketMount {
			s = strings.Replace(s, "    - mountPath: /etc/kubernetes/enc\n", "    - mountPath: /var/run/kmsplugin\n      name: kms-socket\n    - mountPath: /etc/kubernetes/enc\n", 1)
			s = strings.Replace(s, "status: {}", "  - hostPath:\n      path: "+filepath.Dir(plugin.SocketPath())+"\n      type: Directory\n    name: kms-socket\nstatus: {}", 1)
		}
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	mounted := manifest(true)
	decrypts := plugin.DecryptCalls()
	code, stdout, stderr := runCLI(t, "verify", "--apiserver-manifest", mounted)
	if code != exitOK {
		t.Fatalf("verify with the manifest: exit %d\n%s%s", code, stdout, stderr)
	}
	if plugin.DecryptCalls() == decrypts {
		t.Errorf("verify did not read the secret through the plugin")
	}
	if want := "--encryption-provider-config=" + encFile + " (manifest; kms endpoint " + containerEndpoint + " -> " + plugin.Endpoint() + ")"; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}

	code, _, stderr = runCLI(t, "verify", "--apiserver-manifest", mounted, "--encryption-provider-config", hostCfg)
	if code != exitOK || strings.Contains(stderr, "kms endpoint") || !strings.Contains(stderr, "--encryption-provider-config="+hostCfg+" (command line)") {
		t.Errorf("the tool's own --encryption-provider-config: exit %d, stderr %q; want exit 0, that file as written", code, stderr)
	}

	unmounted := manifest(false)
	code, _, stderr = runCLI(t, "verify", "--apiserver-manifest", unmounted)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code != exitUsage || !strings.Contains(last, containerEndpoint) || !strings.Contains(last, unmounted) || !strings.Contains(last, "give the tool --encryption-provider-config with a copy") {
		t.Errorf("socket under no hostPath mount: exit %d, stderr %q; want exit %d (a configuration error, as a manifest path under no mount is), a line naming %s and %s and the flag that mends it", code, stderr, exitUsage, containerEndpoint, unmounted)
	}
}

// TestVerifyKMSPluginStopped: verify with the KMS v2 plugin that encrypted a
// secret stopped says so once on stderr, naming the plugin and its endpoint;
// the secret is reported undecryptable with an error naming them too, the
// configmap stored unencrypted still reads (stale: not under the plugin), the
// JSON report carries the warning too, and the exit code is 4.
func TestVerifyKMSPluginStopped(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	endpoint := plugin.Endpoint()
	cfg := c.EncryptionConfig("enc.yaml", fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 1s}\n", endpoint), testcluster.Identity)
	c.Put("/registry/secrets/default/db", testcluster.SecretsGR, testcluster.Secret("default", "db", "pw"), "", "", cfg)
	c.Put("/registry/configmaps/default/app", testcluster.ConfigMapsGR, testcluster.ConfigMap("default", "app"), "", "", "")
	plugin.Close()

	code, stdout, stderr := runCLI(t, "verify", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", cfg, "-o", "json")
	if code != exitUnreadable {
		t.Errorf("exit %d, want %d\n%s%s", code, exitUnreadable, stdout, stderr)
	}
	want := `warning: KMS v2 plugin "vault" at ` + endpoint + " is unreachable"
	if n := strings.Count(stderr, want); n != 1 || strings.Count(stderr, "warning:") != 1 {
		t.Errorf("stderr has %d lines %q, want exactly one:\n%s", n, want, stderr)
	}
	if !strings.Contains(stdout, `KMS v2 plugin \"vault\" at `+endpoint+" could not decrypt it") || strings.Contains(stdout, "unexpected nil transformer") {
		t.Errorf("report does not name the plugin and endpoint for the secret:\n%s", stdout)
	}
	if !strings.Contains(stdout, `"warnings": [`) || !strings.Contains(stdout, `KMS v2 plugin \"vault\" at `+endpoint+" is unreachable") {
		t.Errorf("the JSON report does not carry the warning:\n%s", stdout)
	}
	if strings.Count(stdout, `"reason": "undecryptable"`) != 1 || !strings.Contains(stdout, `"key": "/registry/configmaps/default/app"`) {
		t.Errorf("want the secret alone unreadable and the configmap read:\n%s", stdout)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
