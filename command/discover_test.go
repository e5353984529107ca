package command

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/installer"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/plan"
)

// testNode is a control-plane node laid out under a scratch root as an
// installer lays it out (files as its documentation and code show them),
// with a real etcd over TLS whose CA and kube-apiserver's client
// certificate are at that installer's paths, mid key rotation (key2 first
// in the encryption configuration at the installer's path, n secrets still
// under key1, and n DeviceClasses stale by version).
type testNode struct {
	root string
	srv  *testetcd.Server
	c    *testcluster.Cluster
	// manifest is kube-apiserver's manifest on the node (k3s: its
	// configuration file), etcdDir etcd's data directory.
	manifest, etcdDir, encFile string
	stale                      int64
}

// nodeLayout is where an installer keeps what kube-apiserver reads.
type nodeLayout struct {
	caDir, caName         string // etcd's CA: caDir/caName.crt
	clientDir, clientName string // kube-apiserver's etcd client certificate and key
	serverDir             string // etcd's serving certificate
	encFile               string // the encryption configuration (host path)
	json                  bool   // written as JSON, as k3s and RKE2 write it
}

var layouts = map[installer.Name]nodeLayout{
	installer.Kubeadm: {caDir: "/etc/kubernetes/pki/etcd", caName: "ca", clientDir: "/etc/kubernetes/pki", clientName: "apiserver-etcd-client",
		serverDir: "/etc/kubernetes/pki/etcd", encFile: "/etc/kubernetes/encryption/encryption-config.yaml"},
	installer.Kops: {caDir: "/srv/kubernetes/kube-apiserver", caName: "etcd-ca", clientDir: "/srv/kubernetes/kube-apiserver", clientName: "etcd-client",
		serverDir: "/etc/kubernetes/pki/etcd-manager-main", encFile: "/srv/kubernetes/kube-apiserver/encryptionconfig.yaml"},
	installer.RKE2: {caDir: "/var/lib/rancher/rke2/server/tls/etcd", caName: "server-ca", clientDir: "/var/lib/rancher/rke2/server/tls/etcd", clientName: "client",
		serverDir: "/var/lib/rancher/rke2/server/tls/etcd", encFile: "/var/lib/rancher/rke2/server/cred/encryption-config.json", json: true},
	installer.K3s: {caDir: "/var/lib/rancher/k3s/server/tls/etcd", caName: "server-ca", clientDir: "/var/lib/rancher/k3s/server/tls/etcd", clientName: "client",
		serverDir: "/var/lib/rancher/k3s/server/tls/etcd", encFile: "/var/lib/rancher/k3s/server/cred/encryption-config.json", json: true},
}

// nodeOptions vary a node's layout.
type nodeOptions struct {
	parked bool                     // kube-apiserver's manifest moved where the runbooks park it
	edit   func(file string) string // edits kube-apiserver's manifest (or k3s's config.yaml)
}

func nodeWrite(t *testing.T, root, p string, content []byte) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, content, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// layNode lays out inst's control-plane node under root with n objects of
// each kind stale in its etcd.
func layNode(t *testing.T, root string, inst installer.Name, n int, o nodeOptions) *testNode {
	t.Helper()
	l := layouts[inst]
	mkdir := func(p string) string {
		if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(root, p)
	}
	ca := testpki.NewCA(t, mkdir(l.caDir), l.caName)
	srvCert, srvKey := ca.Issue(t, mkdir(l.serverDir), "server-client", true)
	cliCert, cliKey := ca.Issue(t, mkdir(l.clientDir), l.clientName, false)
	srv := testetcd.StartT(t, testetcd.Options{TLS: &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}})
	url := "https://" + srv.Endpoint
	key := func(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }
	enc := fmt.Sprintf("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, configmaps]\n  providers:\n%s%s%s",
		testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	if l.json {
		enc = `{"kind":"EncryptionConfiguration","apiVersion":"apiserver.config.k8s.io/v1","resources":[{"resources":["secrets"],"providers":[{"aescbc":{"keys":[{"name":"key2","secret":"` +
			key(2) + `"},{"name":"key1","secret":"` + key(1) + `"}]}},{"identity":{}}]}]}`
	}
	nodeWrite(t, root, l.encFile, []byte(enc))
	edit := o.edit
	if edit == nil {
		edit = func(s string) string { return s }
	}
	n0 := &testNode{root: root, srv: srv, encFile: filepath.Join(root, l.encFile), stale: 2 * int64(n)}
	place := func(live, parked, content string) {
		p := live
		if o.parked {
			p = parked
		}
		nodeWrite(t, root, p, []byte(edit(content)))
		n0.manifest = filepath.Join(root, p)
	}
	switch inst {
	case installer.Kubeadm:
		m := strings.Replace(readTestdata(t, "kubeadm/kube-apiserver.yaml"), "--etcd-servers=https://127.0.0.1:2379", "--etcd-servers="+url, 1)
		m = strings.Replace(m, "    - --etcd-prefix=/cluster-a/registry\n", "", 1)
		place("/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/kubernetes/kube-apiserver.yaml", m)
		nodeWrite(t, root, "/etc/kubernetes/manifests/etcd.yaml", []byte(readTestdata(t, "kubeadm/etcd.yaml")))
		n0.etcdDir = mkdir("/var/lib/etcd")
	case installer.Kops:
		m := strings.Replace(readTestdata(t, "kops/kube-apiserver.manifest"), "--etcd-servers=https://127.0.0.1:4001", "--etcd-servers="+url, 1)
		place("/etc/kubernetes/manifests/kube-apiserver.manifest", "/etc/kubernetes/kube-apiserver.manifest", m)
	case installer.RKE2:
		m := strings.Replace(readTestdata(t, "rke2/kube-apiserver.yaml"), "--etcd-servers=https://127.0.0.1:2379", "--etcd-servers="+url, 1)
		place("/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", "/var/lib/rancher/rke2/agent/kube-apiserver.yaml", m)
		nodeWrite(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/etcd.yaml", []byte(readTestdata(t, "rke2/etcd.yaml")))
		nodeWrite(t, root, "/var/lib/rancher/rke2/server/db/etcd/config", []byte(readTestdata(t, "rke2/etcd-config")))
		n0.etcdDir = filepath.Join(root, "/var/lib/rancher/rke2/server/db/etcd")
	case installer.K3s:
		// As k3s's documentation configures a server with embedded etcd and
		// secrets encryption; the drop-in points kube-apiserver at this
		// test's etcd (k3s's own is on 127.0.0.1:2379, a port a test does
		// not take) through kube-apiserver-arg, which k3s puts after its own.
		place("/etc/rancher/k3s/config.yaml", "/etc/rancher/k3s/config.yaml", "cluster-init: true\nsecrets-encryption: true\nwrite-kubeconfig-mode: \"0644\"\ntoken: a-secret-token\n")
		nodeWrite(t, root, "/etc/rancher/k3s/config.yaml.d/50-etcd.yaml", []byte("kube-apiserver-arg:\n- etcd-servers="+url+"\n"))
		n0.etcdDir = mkdir("/var/lib/rancher/k3s/server/db/etcd")
	}
	cli, err := etcdscan.Connect(context.Background(), etcdscan.Config{Endpoints: []string{srv.URL}, CACert: ca.File, Cert: cliCert, Key: cliKey, DialTimeout: 5 * time.Second, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	n0.c = testcluster.NewOn(t, cli)
	if n > 0 {
		n0.c.SeedMany(n, n0.c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1)))
	}
	return n0
}

// planNode runs plan -o json with no flag naming the cluster.
func planNode(t *testing.T, root string, args ...string) (int, plan.Plan, string) {
	t.Helper()
	code, out, stderr := runCLI(t, append([]string{"plan", "-o", "json", "--node-root", root}, args...)...)
	var p plan.Plan
	if code == exitOK {
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("plan -o json: %v\n%s", err, out)
		}
	}
	return code, p, stderr
}

// TestDiscoveryPlanEachInstaller: on a node laid out by each installer,
// plan with no flag naming the cluster finds it, names the installer and
// what it read on stderr, and reads that installer's etcd (over its TLS
// certificates, with the encryption configuration at its path): the stale
// objects it counts are the ones seeded there.
func TestDiscoveryPlanEachInstaller(t *testing.T) {
	for i, tc := range []struct {
		inst   installer.Name
		opts   nodeOptions
		args   []string
		source string // where the using line says --etcd-servers came from
		found  string // the found line, after the root
	}{
		{installer.Kubeadm, nodeOptions{}, nil, "manifest", "kube-apiserver's manifest ROOT/etc/kubernetes/manifests/kube-apiserver.yaml; etcd's manifest ROOT/etc/kubernetes/manifests/etcd.yaml; etcd's data directory ROOT/var/lib/etcd (etcd's manifest)"},
		{installer.Kops, nodeOptions{edit: func(s string) string {
			return strings.Replace(s, "    - --etcd-servers-overrides=/events#https://127.0.0.1:4002\n", "", 1)
		}}, nil, "manifest", "kube-apiserver's manifest ROOT/etc/kubernetes/manifests/kube-apiserver.manifest; etcd's data directory not known on this node"},
		{installer.RKE2, nodeOptions{}, nil, "manifest", "kube-apiserver's manifest ROOT/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml; etcd's manifest ROOT/var/lib/rancher/rke2/agent/pod-manifests/etcd.yaml; etcd's data directory ROOT/var/lib/rancher/rke2/server/db/etcd (etcd's configuration ROOT/var/lib/rancher/rke2/server/db/etcd/config)"},
		{installer.K3s, nodeOptions{}, []string{"--target-version", "1.37"}, "k3s", "kube-apiserver's command line as k3s builds it from ROOT/etc/rancher/k3s/config.yaml, ROOT/etc/rancher/k3s/config.yaml.d/50-etcd.yaml (embedded etcd); etcd's data directory ROOT/var/lib/rancher/k3s/server/db/etcd (k3s's data-dir)"},
	} {
		t.Run(string(tc.inst), func(t *testing.T) {
			root := t.TempDir()
			n := layNode(t, root, tc.inst, 3+i, tc.opts)
			code, p, stderr := planNode(t, root, tc.args...)
			t.Logf("plan on a %s node: exit %d\n%s", tc.inst, code, stderr)
			if code != exitOK || p.Summary.Stale != n.stale {
				t.Fatalf("plan on a %s node: exit %d, %d stale (want %d)\n%s", tc.inst, code, p.Summary.Stale, n.stale, stderr)
			}
			for _, want := range []string{
				"found " + string(tc.inst) + " on this node (under " + root + "): " + strings.ReplaceAll(tc.found, "ROOT", root),
				"--etcd-servers=https://" + n.srv.Endpoint + " (" + tc.source + ")",
				"--etcd-cafile=" + filepath.Join(root, layouts[tc.inst].caDir, layouts[tc.inst].caName+".crt") + " (" + tc.source + ")",
				"--etcd-certfile=" + filepath.Join(root, layouts[tc.inst].clientDir, layouts[tc.inst].clientName+".crt") + " (" + tc.source + ")",
				"--encryption-provider-config=" + n.encFile + " (" + tc.source + ")",
			} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, "a-secret-token") {
				t.Errorf("stderr shows k3s's token:\n%s", stderr)
			}
		})
	}
}

// TestDiscoveryRefusals: a node with two installers' files is refused,
// listing both, and --distribution picks one (whose etcd is then the one
// read); a node with none is refused, listing every place looked at and the
// flags that name a cluster, unless $ETCDCTL_ENDPOINTS names one; a k3s
// whose datastore is not etcd is refused with the reason; kops' second
// etcd for Events (--etcd-servers-overrides) is reached for after kops
// was found; each refusal is a usage error (exit 2) before etcd is connected to.
func TestDiscoveryRefusals(t *testing.T) {
	root := t.TempDir()
	kubeadm := layNode(t, root, installer.Kubeadm, 2, nodeOptions{})
	k3s := layNode(t, root, installer.K3s, 5, nodeOptions{})
	before := kubeadm.c.Revision()
	code, _, stderr := planNode(t, root, "--target-version", "1.37")
	if code != exitUsage || !strings.Contains(stderr, "error: more than one control plane found on this node: kubeadm ("+kubeadm.manifest+"); k3s ("+k3s.manifest) ||
		!strings.Contains(stderr, "pick one with --distribution kubeadm|k3s, or name the cluster with --apiserver-manifest, --apiserver-flags-file or --endpoints") {
		t.Fatalf("two installers: exit %d\n%s", code, stderr)
	}
	for _, tc := range []struct {
		inst installer.Name
		node *testNode
	}{{installer.Kubeadm, kubeadm}, {installer.K3s, k3s}} {
		code, p, stderr := planNode(t, root, "--target-version", "1.37", "--distribution", string(tc.inst))
		if code != exitOK || p.Summary.Stale != tc.node.stale || !strings.Contains(stderr, "found "+string(tc.inst)+" on this node") {
			t.Errorf("--distribution %s: exit %d, %d stale (want %d from its etcd)\n%s", tc.inst, code, p.Summary.Stale, tc.node.stale, stderr)
		}
	}
	// --distribution of an installer not there.
	if code, _, stderr := planNode(t, root, "--distribution", "rke2"); code != exitUsage || !strings.Contains(stderr, "error: no rke2 control plane found on this node: looked for rke2 ("+filepath.Join(root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml")) {
		t.Errorf("--distribution rke2 on a kubeadm and k3s node: exit %d\n%s", code, stderr)
	}
	if kubeadm.c.Revision() != before {
		t.Error("a refused plan wrote to etcd")
	}

	// Nothing on the node: refused, every place named; with
	// $ETCDCTL_ENDPOINTS, that etcd.
	empty := t.TempDir()
	code, _, stderr = planNode(t, empty)
	for _, want := range []string{"error: no control plane found on this node: looked for kubeadm (" + filepath.Join(empty, "/etc/kubernetes/manifests/kube-apiserver.yaml") + ", " + filepath.Join(empty, "/etc/kubernetes/kube-apiserver.yaml") + "); kops (",
		"); rke2 (", "); k3s (" + filepath.Join(empty, "/etc/rancher/k3s/config.yaml"), "name the cluster with --apiserver-manifest, --apiserver-flags-file or --endpoints (with --cacert, --cert, --key)"} {
		if code != exitUsage || !strings.Contains(stderr, want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("empty node: exit %d, want one line with %q:\n%s", code, want, stderr)
		}
	}
	plain := testcluster.New(t, testetcd.Options{})
	plain.SeedMany(1, plain.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1)))
	t.Setenv("ETCDCTL_ENDPOINTS", plain.Srv.Endpoint)
	newCfg := plain.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	code, p, stderr := planNode(t, empty, "--target-version", "1.37", "--encryption-provider-config", newCfg)
	if code != exitOK || p.Summary.Stale != 2 || !strings.Contains(stderr, "note: no kubeadm, kops, RKE2 or k3s control plane found on this node: the cluster is the one $ETCDCTL_ENDPOINTS names") {
		t.Errorf("empty node, $ETCDCTL_ENDPOINTS: exit %d, %d stale\n%s", code, p.Summary.Stale, stderr)
	}
	// A node's installer wins over the environment, as a manifest does.
	code, p, stderr = planNode(t, root, "--distribution", "kubeadm")
	if code != exitOK || p.Summary.Stale != kubeadm.stale || !strings.Contains(stderr, "ignoring $ETCDCTL_ENDPOINTS (kube-apiserver's --etcd-servers from the manifest wins)") {
		t.Errorf("kubeadm node, $ETCDCTL_ENDPOINTS: exit %d, %d stale\n%s", code, p.Summary.Stale, stderr)
	}
	t.Setenv("ETCDCTL_ENDPOINTS", "")
	os.Unsetenv("ETCDCTL_ENDPOINTS")

	// k3s on kine: NATS is refused as a usage error; PostgreSQL and MySQL
	// are found, and a database that does not answer is one line naming it,
	// never its password (e2e TestK3sServer reads and writes real ones).
	root = t.TempDir()
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte("datastore-endpoint: \"nats://k3s:pa55w0rd@nats.example.com:4222\"\n"))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/db/state.db", nil)
	code, _, stderr = planNode(t, root)
	if want := "but its datastore-endpoint is NATS through kine, not etcd: the tool works on etcd, and on SQLite, PostgreSQL and MySQL through kine"; code != exitUsage || !strings.Contains(stderr, "error: found k3s on this node ("+filepath.Join(root, "/etc/rancher/k3s/config.yaml")+"), "+want) || strings.Contains(stderr, "pa55w0rd") {
		t.Errorf("k3s on NATS: exit %d, want %q\n%s", code, want, stderr)
	}
	root = t.TempDir()
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte("datastore-endpoint: \"mysql://k3s:pa55w0rd@tcp(127.0.0.1:1)/kubernetes\"\n"))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/token", nil)
	code, _, stderr = planNode(t, root)
	if want := "error: the MySQL datastore kubernetes on 127.0.0.1:1: connecting: "; code != exitError || !strings.Contains(stderr, want) || strings.Contains(stderr, "pa55w0rd") || strings.Count(strings.TrimSpace(stderr[strings.Index(stderr, "error: "):]), "\n") != 0 {
		t.Errorf("k3s on a MySQL that does not answer: exit %d, want %d and one line %q, no password\n%s", code, exitError, want, stderr)
	}
	root = t.TempDir()
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte("datastore-endpoint: \"postgres://k3s:pa55w0rd@127.0.0.1:1/kubernetes\"\n"))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/token", nil)
	code, _, stderr = planNode(t, root)
	if want := "error: the PostgreSQL datastore kubernetes on 127.0.0.1:1: connecting: "; code != exitError || !strings.Contains(stderr, want) || strings.Contains(stderr, "pa55w0rd") || strings.Count(strings.TrimSpace(stderr[strings.Index(stderr, "error: "):]), "\n") != 0 {
		t.Errorf("k3s on a PostgreSQL that does not answer: exit %d, want %d and one line %q, no password\n%s", code, exitError, want, stderr)
	}
	root = t.TempDir()
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte("write-kubeconfig-mode: \"0644\"\n"))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/db/state.db", nil)
	// Found and named; an empty file is no k3s datastore (kine's table is
	// not in it): refused with one line naming it.
	code, _, stderr = runCLI(t, "inventory", "--node-root", root)
	db := filepath.Join(root, "/var/lib/rancher/k3s/server/db/state.db")
	if want := "error: kine datastore " + db + ": a SQLite database without kine's table"; code != exitError || !strings.Contains(stderr, want) || !strings.Contains(stderr, "(SQLite through kine, "+db+")") {
		t.Errorf("k3s on SQLite, an empty database: exit %d, want %d and %q\n%s", code, exitError, want, stderr)
	}

	// kops with etcd-manager's second etcd for Events: found, and that
	// etcd (not running here) is the one plan cannot reach.
	kops := t.TempDir()
	n := layNode(t, kops, installer.Kops, 1, nodeOptions{})
	code, _, stderr = planNode(t, kops, "--dial-timeout", "1s")
	if code == exitOK || !strings.Contains(stderr, "found kops on this node (under "+kops+"): kube-apiserver's manifest "+n.manifest) ||
		!strings.Contains(stderr, "etcd of events: https://127.0.0.1:4002 (events, --etcd-servers-overrides)") || !strings.Contains(stderr, "error: etcd of events: ") {
		t.Errorf("kops with etcd-events not running: exit %d\n%s", code, stderr)
	}
}

// TestDiscoveryParkedManifest: during a migrate kube-apiserver is stopped
// the runbooks' way, its manifest moved out of the kubelet's directory
// (kubeadm: /etc/kubernetes/kube-apiserver.yaml); discovery finds it there
// and says so. The same file in both places is read from the kubelet's
// directory; two different ones are refused.
func TestDiscoveryParkedManifest(t *testing.T) {
	root := t.TempDir()
	n := layNode(t, root, installer.Kubeadm, 2, nodeOptions{parked: true})
	code, p, stderr := planNode(t, root)
	if code != exitOK || p.Summary.Stale != n.stale || !strings.Contains(stderr, "found kubeadm on this node (under "+root+"): kube-apiserver's manifest "+
		filepath.Join(root, "/etc/kubernetes/kube-apiserver.yaml")+" (parked out of "+filepath.Join(root, "/etc/kubernetes/manifests")+": kube-apiserver stopped)") {
		t.Fatalf("parked manifest: exit %d, %d stale\n%s", code, p.Summary.Stale, stderr)
	}
	live := filepath.Join(root, "/etc/kubernetes/manifests/kube-apiserver.yaml")
	data, err := os.ReadFile(n.manifest)
	if err != nil {
		t.Fatal(err)
	}
	nodeWrite(t, root, "/etc/kubernetes/manifests/kube-apiserver.yaml", append(data, "# another\n"...))
	code, _, stderr = planNode(t, root)
	if code != exitUsage || !strings.Contains(stderr, "error: found kubeadm on this node with two different kube-apiserver manifests: "+live+" (the kubelet runs it) and "+n.manifest) {
		t.Errorf("two different manifests: exit %d\n%s", code, stderr)
	}
}

// TestDiscoveryMigrateK3sAPIServerDisabled: the k3s runbook's window — a
// drop-in disables kube-apiserver on the server (k3s keeps its embedded
// etcd running): migrate, with no flag naming the cluster, finds k3s, says
// its kube-apiserver is disabled, rewrites under key2 through k3s's
// certificates and encryption configuration, and verify then finds
// nothing stale.
func TestDiscoveryMigrateK3sAPIServerDisabled(t *testing.T) {
	root := t.TempDir()
	n := layNode(t, root, installer.K3s, 4, nodeOptions{})
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml.d/99-kube-etcd-migrate.yaml", []byte("disable-apiserver: true\ndisable-controller-manager: true\ndisable-scheduler: true\n"))
	code, _, stderr := runCLI(t, "migrate", "--node-root", root, "--target-version", "1.37", "--liveness-window", "500ms")
	if code != exitOK || !strings.Contains(stderr, "note: kube-apiserver is disabled on this k3s server (disable-apiserver)") ||
		!strings.Contains(stderr, filepath.Join(root, "/etc/rancher/k3s/config.yaml.d/99-kube-etcd-migrate.yaml")) {
		t.Fatalf("migrate on a k3s server with kube-apiserver disabled: exit %d\n%s", code, stderr)
	}
	if code, out, stderr := runCLI(t, "verify", "--node-root", root, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("verify after migrate: exit %d\n%s%s", code, out, stderr)
	}
	value, _, _ := n.c.Get("/registry/secrets/ns0/s-0000")
	if !bytes.HasPrefix(value, []byte("k8s:enc:aescbc:v1:key2:")) {
		t.Errorf("the secret after migrate starts %q, want k8s:enc:aescbc:v1:key2:", value[:min(len(value), 24)])
	}
}

// TestDiscoveryEtcdDataDirSpace: etcd's data directory as the installer's
// layout names it (k3s has no etcd manifest; RKE2's etcd reads its settings
// from a configuration file) is where etcd's growth from the run is counted:
// with its filesystem full, plan has a blocker naming it and migrate is
// refused before its first write, etcd byte for byte as it was; with room,
// plan passes and names that filesystem.
func TestDiscoveryEtcdDataDirSpace(t *testing.T) {
	for _, inst := range []installer.Name{installer.K3s, installer.RKE2} {
		t.Run(string(inst), func(t *testing.T) {
			root := t.TempDir()
			n := layNode(t, root, inst, 20, nodeOptions{})
			fsDir := smallFilesystem(t, 256<<20)
			// etcd's data directory's files (RKE2's etcd configuration) moved
			// onto the small filesystem, the directory a link to it.
			if err := os.CopyFS(fsDir, os.DirFS(n.etcdDir)); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(n.etcdDir); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(fsDir, n.etcdDir); err != nil {
				t.Fatal(err)
			}
			filler := filepath.Join(fsDir, "filler")
			if err := os.WriteFile(filler, make([]byte, 255<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			state := []string{"--state-dir", filepath.Join(t.TempDir(), "state"), "--target-version", "1.37"}
			before, rev := n.c.Raw(), n.c.Revision()
			code, out, stderr := runCLI(t, append([]string{"plan", "--node-root", root}, state...)...)
			if code != exitError || !strings.Contains(out, "BLOCKER (disk space): not enough disk space on the filesystem of "+n.etcdDir) ||
				!strings.Contains(out, "etcd's database growth") || !strings.Contains(out, "etcd itself needs it") ||
				!strings.Contains(out, "remedy: free room on that filesystem: etcd's own database and WAL need it") || strings.Contains(out, "give --state-dir on another one") {
				t.Fatalf("plan with etcd's filesystem full: exit %d\n%s%s", code, out, stderr)
			}
			code, _, stderr = runCLI(t, append([]string{"migrate", "--node-root", root, "--liveness-window", "500ms"}, state...)...)
			if code != exitError || !strings.Contains(stderr, "not enough disk space on the filesystem of "+n.etcdDir) {
				t.Fatalf("migrate with etcd's filesystem full: exit %d\n%s", code, stderr)
			}
			if n.c.Revision() != rev {
				t.Fatal("migrate wrote with etcd's filesystem full")
			}
			for k, v := range n.c.Raw() {
				if before[k] != v {
					t.Fatalf("%s changed", k)
				}
			}
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			code, out, stderr = runCLI(t, append([]string{"plan", "--node-root", root}, state...)...)
			if code != exitOK || !strings.Contains(out, "disk space on the filesystem of "+n.etcdDir) {
				t.Fatalf("plan with room on etcd's filesystem: exit %d\n%s%s", code, out, stderr)
			}
		})
	}
}
