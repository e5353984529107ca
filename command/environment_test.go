package command

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/inventory"
)

// TestConfigurationPrecedence: a flag on the command line wins over
// kube-apiserver's manifest, which wins over the ETCDCTL_* and KEM_PREFIX
// environment, which wins over the defaults; a value taken from the
// environment, and one the manifest overrode, is named on stderr, a password
// never shown. The keyspace says which etcd and prefix were read: one object
// under /registry, two under /alt.
func TestConfigurationPrecedence(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.Put("/registry/configmaps/default/a", testcluster.ConfigMapsGR, testcluster.ConfigMap("default", "a"), "", "", "")
	c.Put("/alt/configmaps/default/b", testcluster.ConfigMapsGR, testcluster.ConfigMap("default", "b"), "", "", "")
	c.Put("/alt/configmaps/default/c", testcluster.ConfigMapsGR, testcluster.ConfigMap("default", "c"), "", "", "")
	live := c.Srv.Endpoint
	const dead = "127.0.0.1:1"
	manifest := kubeadmManifest(t, live)     // --etcd-servers the live etcd, --etcd-prefix=/registry
	deadManifest := kubeadmManifest(t, dead) // --etcd-servers nothing listens on
	for _, v := range []string{"ENDPOINTS", "CACERT", "CERT", "KEY", "USER", "PASSWORD", "DIAL_TIMEOUT", "COMMAND_TIMEOUT"} {
		t.Setenv("ETCDCTL_"+v, "")
	}
	t.Setenv("KEM_PREFIX", "")

	inv := func(args ...string) (objects int64, prefixes []string, stderr string) {
		t.Helper()
		code, out, stderr := runCLI(t, append([]string{"inventory", "-o", "json"}, args...)...)
		var rep inventory.Inventory
		if err := json.Unmarshal([]byte(out), &rep); code != exitOK || err != nil {
			t.Fatalf("inventory %v: exit %d, %v\n%s%s", args, code, err, out, stderr)
		}
		return rep.Total.Objects, rep.Prefixes, stderr
	}
	wantLine := func(stderr string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr does not say %q:\n%s", w, stderr)
			}
		}
	}

	// The manifest and the environment disagree: the manifest wins, and the
	// line says which variables it overrode.
	t.Setenv("ETCDCTL_ENDPOINTS", dead)
	t.Setenv("KEM_PREFIX", "/alt")
	n, prefixes, stderr := inv("--apiserver-manifest", manifest)
	if n != 1 || len(prefixes) != 1 || prefixes[0] != "/registry/" {
		t.Errorf("manifest vs environment: %d object(s) under %v, want the manifest's etcd and prefix (1 under /registry/)", n, prefixes)
	}
	wantLine(stderr, "--etcd-servers=http://"+live+" (manifest)", "--etcd-prefix=/registry (manifest)",
		"ignoring $ETCDCTL_ENDPOINTS (kube-apiserver's --etcd-servers from the manifest wins), $KEM_PREFIX (kube-apiserver's --etcd-prefix from the manifest wins)")
	if strings.Count(stderr, "\n") != 2 {
		t.Errorf("stderr: want the manifest's line and the environment's, one each:\n%s", stderr)
	}

	// The same values in both: nothing to say about the environment.
	t.Setenv("ETCDCTL_ENDPOINTS", "http://"+live)
	t.Setenv("KEM_PREFIX", "/registry/")
	if n, _, stderr = inv("--apiserver-manifest", manifest); n != 1 || strings.Contains(stderr, "environment") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("manifest and environment agreeing: %d object(s), stderr:\n%s\nwant 1 and only the manifest's line", n, stderr)
	}
	t.Setenv("ETCDCTL_ENDPOINTS", dead)
	t.Setenv("KEM_PREFIX", "/alt")

	// A flag wins over both.
	n, prefixes, stderr = inv("--apiserver-manifest", deadManifest, "--endpoints", live, "--prefix", "/alt")
	if n != 2 || prefixes[0] != "/alt/" {
		t.Errorf("flags vs manifest and environment: %d object(s) under %v, want the flags' (2 under /alt/)", n, prefixes)
	}
	wantLine(stderr, "--etcd-servers="+live+" (command line)", "--etcd-prefix=/alt (command line)")
	if strings.Contains(stderr, "environment") {
		t.Errorf("the flags won, the environment is not in play:\n%s", stderr)
	}

	// Nothing else says, and no installer's files on the node: the
	// environment, named on stderr.
	t.Setenv("ETCDCTL_ENDPOINTS", live)
	n, prefixes, stderr = inv("--node-root", t.TempDir())
	if n != 2 || prefixes[0] != "/alt/" {
		t.Errorf("environment alone: %d object(s) under %v, want 2 under /alt/", n, prefixes)
	}
	if want := "note: no kubeadm, kops, RKE2 or k3s control plane found on this node: the cluster is the one $ETCDCTL_ENDPOINTS names\nusing from the environment: --endpoints=" + live + " ($ETCDCTL_ENDPOINTS) --prefix=/alt ($KEM_PREFIX)\n"; stderr != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}

	// Credentials from the environment: named, the password never shown, even
	// when the connection fails.
	t.Setenv("ETCDCTL_ENDPOINTS", dead)
	t.Setenv("KEM_PREFIX", "")
	t.Setenv("ETCDCTL_USER", "root")
	t.Setenv("ETCDCTL_PASSWORD", "s3cret-pw")
	code, _, stderr := runCLI(t, "inventory", "--dial-timeout", "1s", "--node-root", t.TempDir())
	if code != exitError || strings.Contains(stderr, "s3cret-pw") {
		t.Errorf("exit %d, stderr %q: want exit %d and no password", code, stderr, exitError)
	}
	wantLine(stderr, "--endpoints="+dead+" ($ETCDCTL_ENDPOINTS)", "--user=root ($ETCDCTL_USER)", "--password=(not shown) ($ETCDCTL_PASSWORD)")
	t.Setenv("ETCDCTL_PASSWORD", "")
	t.Setenv("ETCDCTL_USER", "root:hunter2")
	journal := filepath.Join(t.TempDir(), "journal") // there: rollback looks before it connects
	if err := os.WriteFile(journal, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr = runCLI(t, "rollback", "--journal", journal, "--dial-timeout", "1s", "--node-root", t.TempDir()); strings.Contains(stderr, "hunter2") || !strings.Contains(stderr, "--user=root ($ETCDCTL_USER)") {
		t.Errorf("rollback with ETCDCTL_USER=name:password: exit %d, stderr %q: want the user named, never the password", code, stderr)
	}
}
