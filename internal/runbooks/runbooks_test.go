package runbooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-etcd-migrate/installer"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// stepTimeout bounds each runbook step: a step that loops waiting for
// something that never comes (a health check on the wrong listener) fails
// the test instead of hanging it.
const stepTimeout = 30 * time.Second

// runbookBlock is the first ```sh block after the heading line heading of
// docs/runbooks.md: the functions a runbook defines.
func runbookBlock(t *testing.T, heading string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/runbooks.md: no heading %q", heading)
	}
	rest := doc[i+len(heading)+2:]
	start := strings.Index(rest, "```sh\n")
	if start < 0 {
		t.Fatalf("docs/runbooks.md: no sh block after %q", heading)
	}
	if h := regexp.MustCompile(`(?m)^#{1,3} `).FindStringIndex(rest); h != nil && h[0] < start {
		t.Fatalf("docs/runbooks.md: the section %q has no sh block before the next heading", heading)
	}
	rest = rest[start+len("```sh\n"):]
	end := strings.Index(rest, "\n```")
	if end < 0 {
		t.Fatalf("docs/runbooks.md: the sh block after %q does not end", heading)
	}
	return rest[:end+1]
}

// onNode rewrites the node's paths of a runbook block to their place under
// root (/etc/..., /var/...) and the well-known ports to the test servers'.
func onNode(block, root string, ports map[string]string) string {
	block = regexp.MustCompile(`(^|[\s="'(:])/(etc|var)/`).ReplaceAllString(block, "${1}"+root+"/$2/")
	for from, to := range ports {
		block = strings.ReplaceAll(block, ":"+from, ":"+to)
	}
	return block
}

// stubs writes the commands a runbook step runs that this machine has no
// node for, as small scripts in dir: sudo (runs the command as this user),
// crictl and kubectl (a kube-apiserver container exists, and is ready, while
// its manifest is in the kubelet's directory, $KUBELET_MANIFEST),
// systemctl (records the call), k3s (k3s kubectl: ready unless the
// runbook's drop-in, $K3S_DROPIN, disables kube-apiserver). curl, the
// health and readiness checks, and every loop are the runbook's own.
func stubs(t *testing.T, dir string) {
	t.Helper()
	for name, script := range map[string]string{
		"sudo":      "exec env \"$@\"\n",
		"crictl":    "case \" $* \" in *' ps '*) [ -f \"$KUBELET_MANIFEST\" ] && echo 0123456789ab;; esac; exit 0\n",
		"kubectl":   "case \" $* \" in *' /readyz '*) [ -f \"$KUBELET_MANIFEST\" ]; exit;; esac; exit 0\n",
		"systemctl": "echo \"$*\" >> \"$SYSTEMCTL_LOG\"\n",
		"k3s":       "case \" $* \" in *' /readyz '*) [ ! -f \"$K3S_DROPIN\" ]; exit;; esac; exit 0\n",
	} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// runStep runs the runbook's block, then step, with bash; the step must
// finish within stepTimeout.
func runStep(t *testing.T, block, step string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", block+"\nset -e\n"+step+"\n")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s did not finish within %s (the runbook's loop never saw what it waits for):\n%s", step, stepTimeout, out.String())
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", step, err, out.String())
	}
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func testdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// etcdLike starts a real etcd as an installer configures its own: client
// TLS with client certificates, and, for k3s and RKE2, the separate client
// HTTP listener (listen-client-http-urls) that takes HTTP off the client
// URL; on [::1] for an IPv6-only k3s. The CA and a client certificate are
// written to tls under the names given.
func etcdLike(t *testing.T, tlsDir, caName, clientName string, httpListener, ipv6 bool) *testetcd.Server {
	t.Helper()
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ca := testpki.NewCA(t, tlsDir, caName)
	ca.Issue(t, tlsDir, clientName, false)
	serverDir := t.TempDir()
	cert, key := ca.Issue(t, serverDir, "server", true)
	return testetcd.StartT(t, testetcd.Options{TLS: &testetcd.TLSFiles{CertFile: cert, KeyFile: key, TrustedCAFile: ca.File}, ClientHTTP: httpListener, IPv6: ipv6})
}

// port is the port of a URL's host.
func port(t *testing.T, u string) string {
	t.Helper()
	hostport := u[strings.Index(u, "://")+3:]
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunbookStopStart runs each installer's stop_apiserver and
// start_apiserver as docs/runbooks.md writes them, with bash, against a
// real etcd configured as that installer configures its own: every step
// finishes (within stepTimeout), leaves kube-apiserver where the runbook
// says, and leaves the node as the tool's search then finds it (the
// manifest parked, or k3s's apiserver disabled). k3s and RKE2 give etcd a
// client HTTP listener of its own (k3s-io/k3s pkg/etcd/etcd.go
// listenClientHTTPURLs: https://LOOPBACK:2382; RKE2 writes the same into its
// etcd's --config-file), so an etcd health check must go there: /health on
// 2379 never answers and a step waiting for it never returns.
func TestRunbookStopStart(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			// CI installs both (.ci/run): there a missing one fails.
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s: the runbooks' steps are bash and their health checks curl's", tool)
			}
			t.Skipf("no %s: the runbooks' steps are bash and their health checks curl's", tool)
		}
	}
	type node struct {
		root, bin string
		env       []string
	}
	newNode := func(t *testing.T) *node {
		n := &node{root: t.TempDir()}
		n.bin = filepath.Join(n.root, "test-bin")
		stubs(t, n.bin)
		n.env = append(os.Environ(), "PATH="+n.bin+":"+os.Getenv("PATH"), "SYSTEMCTL_LOG="+filepath.Join(n.root, "systemctl.log"))
		return n
	}
	under := func(n *node, p string) string { return filepath.Join(n.root, p) }

	// A static pod's kube-apiserver (kubeadm, kops, RKE2): stop parks its
	// manifest and waits for the container to go; start puts it back and
	// waits for readiness.
	staticPod := func(t *testing.T, n *node, name installer.Name, heading, live, parked, manifest string, ports map[string]string) {
		write(t, under(n, live), manifest)
		block := onNode(runbookBlock(t, heading), n.root, ports)
		env := append(n.env, "KUBELET_MANIFEST="+under(n, live))
		runStep(t, block, "stop_apiserver", env)
		if _, err := os.Stat(under(n, live)); err == nil {
			t.Fatalf("stop_apiserver left %s in the kubelet's directory", live)
		}
		f, err := installer.Find(n.root, name)
		if err != nil || !f.Parked || f.Manifest != under(n, parked) {
			t.Fatalf("after stop_apiserver, the search finds %+v %v; want the manifest parked at %s", f, err, parked)
		}
		runStep(t, block, "start_apiserver", env)
		if f, err = installer.Find(n.root, name); err != nil || f.Parked {
			t.Fatalf("after start_apiserver, the search finds %+v %v", f, err)
		}
	}

	t.Run("kubeadm", func(t *testing.T) {
		n := newNode(t)
		pki := under(n, "/etc/kubernetes/pki")
		e := etcdLike(t, filepath.Join(pki, "etcd"), "ca", "healthcheck-client", false, false)
		write(t, under(n, "/var/lib/kubelet/config.yaml"), "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
		api := fakeAPIServer(t, pki, under(n, "/etc/kubernetes/manifests/kube-apiserver.yaml"))
		staticPod(t, n, installer.Kubeadm, "## Before you start", "/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/kubernetes/kube-apiserver.yaml",
			testdata(t, "kubeadm/kube-apiserver.yaml"), map[string]string{"2379": port(t, e.URL), "6443": api})
	})
	t.Run("kops", func(t *testing.T) {
		n := newNode(t)
		e := etcdLike(t, under(n, "/srv/kubernetes/kube-apiserver"), "etcd-ca", "etcd-client", false, false)
		staticPod(t, n, installer.Kops, "### kops", "/etc/kubernetes/manifests/kube-apiserver.manifest", "/etc/kubernetes/kube-apiserver.manifest",
			testdata(t, "kops/kube-apiserver.manifest"), map[string]string{"4001": port(t, e.URL)})
	})
	t.Run("rke2", func(t *testing.T) {
		n := newNode(t)
		e := etcdLike(t, under(n, "/var/lib/rancher/rke2/server/tls/etcd"), "server-ca", "client", true, false)
		stubs(t, under(n, "/var/lib/rancher/rke2/bin")) // $R/bin/crictl, $R/bin/kubectl
		staticPod(t, n, installer.RKE2, "### RKE2", "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", "/var/lib/rancher/rke2/agent/kube-apiserver.yaml",
			testdata(t, "rke2/kube-apiserver.yaml"), map[string]string{"2379": port(t, e.URL), "2382": port(t, e.HTTPURL)})
	})

	// k3s: stop restarts k3s with a drop-in that disables kube-apiserver and
	// waits for its etcd member to answer; start removes the drop-in and
	// waits for readiness.
	k3s := func(t *testing.T, ipv6 bool) {
		n := newNode(t)
		e := etcdLike(t, under(n, "/var/lib/rancher/k3s/server/tls/etcd"), "server-ca", "client", true, ipv6)
		config := "cluster-init: true\n"
		if ipv6 {
			config += "cluster-cidr: fd00:42::/56\nservice-cidr: fd00:43::/112\n"
		}
		write(t, under(n, "/etc/rancher/k3s/config.yaml"), config)
		if err := os.MkdirAll(under(n, "/var/lib/rancher/k3s/server/db/etcd"), 0o700); err != nil {
			t.Fatal(err)
		}
		dropin := under(n, "/etc/rancher/k3s/config.yaml.d/99-kube-etcd-migrate.yaml")
		block := onNode(runbookBlock(t, "### k3s"), n.root, map[string]string{"2379": port(t, e.URL), "2382": port(t, e.HTTPURL)})
		env := append(n.env, "K3S_DROPIN="+dropin)
		runStep(t, block, "stop_apiserver", env)
		f, err := installer.Find(n.root, installer.K3s)
		if err != nil || !slices.ContainsFunc(f.Notes, func(s string) bool { return strings.Contains(s, "kube-apiserver is disabled") }) {
			t.Fatalf("after stop_apiserver, the search finds %+v %v; want kube-apiserver disabled", f, err)
		}
		loopback := "127.0.0.1"
		if ipv6 {
			loopback = "[::1]"
		}
		if !slices.Contains(f.CommandLine, "--etcd-servers=https://"+loopback+":2379") {
			t.Errorf("the search's command line %q, want etcd at %s", f.CommandLine, loopback)
		}
		if log, _ := os.ReadFile(under(n, "systemctl.log")); string(log) != "restart k3s\n" {
			t.Errorf("systemctl calls %q", log)
		}
		runStep(t, block, "start_apiserver", env)
		if _, err := os.Stat(dropin); err == nil {
			t.Fatalf("start_apiserver left %s", dropin)
		}
		if f, err = installer.Find(n.root, installer.K3s); err != nil || slices.ContainsFunc(f.Notes, func(s string) bool { return strings.Contains(s, "kube-apiserver is disabled") }) {
			t.Fatalf("after start_apiserver, the search finds %+v %v", f, err)
		}
	}
	t.Run("k3s", func(t *testing.T) { k3s(t, false) })
	t.Run("k3s IPv6-only", func(t *testing.T) {
		if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
			t.Skipf("no IPv6 loopback: %v", err)
		} else {
			l.Close()
		}
		k3s(t, true)
	})
}

// fakeAPIServer serves kube-apiserver's /readyz over TLS, as kubeadm's does
// (a serving certificate for "kubernetes" from pki/ca.crt, client
// certificates required), while its manifest is in the kubelet's
// directory; it writes apiserver-kubelet-client.{crt,key} for kubeadm's
// ready. It returns its port.
func fakeAPIServer(t *testing.T, pki, manifest string) string {
	t.Helper()
	ca := testpki.NewCA(t, pki, "ca")
	ca.Issue(t, pki, "apiserver-kubelet-client", false)
	servingDir := t.TempDir()
	cert, key := ca.IssueServing(t, servingDir, "apiserver", "kubernetes")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := os.Stat(manifest); err != nil || r.URL.Path != "/readyz" {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, "ok")
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}
