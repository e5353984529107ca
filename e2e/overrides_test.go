package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// TestOverridesEventsEtcd: a control plane shaped like kops' — Events kept
// in a second etcd (kube-apiserver's --etcd-servers-overrides=/events#...),
// both etcds over TLS with the same client certificate, secrets and events
// encrypted — whose encryption key is rotated. Given nothing but the
// manifest, the tool migrates both etcds in one run (the events in the
// second), verify finds both current, one `rollback --run` puts both etcds
// back byte for byte; a kube-apiserver alive on the events etcd alone, or
// on both, refuses the run with nothing written; and after the migration,
// kube-apiserver with the same flags serves every object unchanged and a
// no-op update of every object (the events among them) rewrites none.
func TestOverridesEventsEtcd(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	encDir := filepath.Join(dir, "encryption")
	for _, d := range []string{filepath.Join(pki, "etcd"), encDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ca := testpki.NewCA(t, filepath.Join(pki, "etcd"), "ca")
	srvCert, srvKey := ca.Issue(t, filepath.Join(pki, "etcd"), "server", true)
	cliCert, cliKey := ca.Issue(t, pki, "apiserver-etcd-client", false)
	tlsFiles := &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}
	mainEtcd := testetcd.StartT(t, testetcd.Options{TLS: tlsFiles})
	eventsEtcd := testetcd.StartT(t, testetcd.Options{TLS: tlsFiles})
	override := "--etcd-servers-overrides=/events#https://" + eventsEtcd.Endpoint

	const ns = "kops"
	enc := &cluster{t: t, dir: encDir}
	encrypted := []string{"secrets", "events"}
	encFile := enc.writeEncryptionConfig("encryption-config.yaml", encrypted, aescbcProvider("key1", 1), identityProvider)
	opts := apiservertest.Options{
		EtcdURL: "https://" + mainEtcd.Endpoint, EtcdCAFile: ca.File, EtcdCertFile: cliCert, EtcdKeyFile: cliKey,
		EncryptionConfigPath: encFile, ExtraFlags: []string{override},
	}

	// 1. The cluster as it runs: secrets in the main etcd, events (both
	// groups' APIs: the same storage) in the events etcd, all under key1.
	srv := apiservertest.Start(t, opts)
	rc := srv.ClientConfig
	cs := kubernetes.NewForConfigOrDie(rc)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("db-%d", i)}, Data: secretData(i)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createEvents(ctx, t, cs, ns, "pod", 4)
	if _, err := cs.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "scaled"}, EventTime: metav1.NowMicro(), ReportingController: "example.com/scaler", ReportingInstance: "scaler-1",
		Action: "Scale", Reason: "Scaled", Type: corev1.EventTypeNormal, Regarding: corev1.ObjectReference{Kind: "Deployment", Namespace: ns, Name: "web"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, rc, servedResources(t, rc))
	srv.Stop()

	mainCli := overridesClient(t, mainEtcd, ca.File, cliCert, cliKey)
	eventsCli := overridesClient(t, eventsEtcd, ca.File, cliCert, cliKey)
	eventsDir := "/registry/events/" + ns + "/"
	if n := len(rawUnder(t, eventsCli, eventsDir)); n != 5 {
		t.Fatalf("the events etcd holds %d events of %s, want 5", n, ns)
	}
	if n := len(rawUnder(t, mainCli, eventsDir)); n != 0 {
		t.Fatalf("the main etcd holds %d events of %s, want none (the override)", n, ns)
	}

	// 2. Key rotation: key2 first, key1 still there to read. The manifest
	// names both etcds.
	enc.writeEncryptionConfig("encryption-config.yaml", encrypted, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	manifest := writeKubeadmManifest(t, dir, map[string]string{
		"--etcd-servers=https://127.0.0.1:2379": "--etcd-servers=https://" + mainEtcd.Endpoint + "\n    - " + override,
		"path: /etc/kubernetes/pki":             "path: " + pki,
		"path: /etc/kubernetes/encryption":      "path: " + encDir,
		"--etcd-prefix=/cluster-a/registry":     "--etcd-prefix=/registry",
	})
	mainBefore, eventsBefore := rawAll(t, mainCli), rawAll(t, eventsCli)

	out, stderr, code := runTool(t, "verify", "--apiserver-manifest", manifest)
	if code != 3 || !strings.Contains(out, "== etcd of events (https://"+eventsEtcd.Endpoint+")") || !strings.Contains(stderr, "--etcd-servers-overrides=/events#https://"+eventsEtcd.Endpoint+" (manifest)") {
		t.Fatalf("verify before migrate: exit %d, want 3 with a report per etcd\n%s\n%s", code, out, stderr)
	}

	// plan: a plan per etcd, nothing in the way (the stopped
	// kube-apiserver's fresh leases aside).
	out, stderr, code = runTool(t, "plan", "--apiserver-manifest", manifest, "--allow-live-apiserver")
	if code != 0 || !strings.Contains(out, "== main etcd (https://"+mainEtcd.Endpoint+")") || !strings.Contains(out, "== etcd of events (https://"+eventsEtcd.Endpoint+")") {
		t.Fatalf("plan: exit %d, want 0 with a plan per etcd\n%s\n%s", code, out, stderr)
	}

	// 3. One run, both etcds. The kube-apiserver was stopped moments ago:
	// its leases are fresh, hence --allow-live-apiserver.
	out, stderr, code = runTool(t, "migrate", "--apiserver-manifest", manifest, "--allow-live-apiserver")
	if code != 0 {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, out, stderr)
	}
	for _, c := range []struct {
		cli *clientv3.Client
		dir string
		n   int
	}{{mainCli, "/registry/secrets/" + ns + "/", 3}, {eventsCli, eventsDir, 5}} {
		kvs := rawUnder(t, c.cli, c.dir)
		if len(kvs) != c.n {
			t.Errorf("%s: %d keys, want %d", c.dir, len(kvs), c.n)
		}
		for k, v := range kvs {
			if !strings.HasPrefix(v, "k8s:enc:aescbc:v1:key2:") {
				t.Errorf("%s is not under key2 after migrate", k)
			}
		}
	}
	run := filepath.Join(testcluster.StateDir(t), "runs", "0001-migrate")
	for _, f := range []string{"journal", "snapshot.db", "journal-events", "snapshot-events.db", "run.json"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Errorf("run directory: %v", err)
		}
	}
	if out, stderr, code := runTool(t, "verify", "--apiserver-manifest", manifest); code != 0 {
		t.Fatalf("verify after migrate: exit %d, want 0\n%s\n%s", code, out, stderr)
	}

	// 4. One rollback of the run: both etcds as they were, byte for byte.
	if out, stderr, code := runTool(t, "rollback", "--apiserver-manifest", manifest, "--run", "0001-migrate", "--allow-live-apiserver"); code != 0 {
		t.Fatalf("rollback: exit %d\n%s\n%s", code, out, stderr)
	}
	sameBytes(t, "main etcd", mainBefore, rawAll(t, mainCli))
	sameBytes(t, "events etcd", eventsBefore, rawAll(t, eventsCli))

	// 5. A kube-apiserver alive on the events etcd alone (its main etcd is
	// a third one) writing events: the run is refused before anything is
	// written on either etcd.
	thirdEtcd := testetcd.StartT(t, testetcd.Options{TLS: tlsFiles})
	other := opts
	other.EtcdURL = "https://" + thirdEtcd.Endpoint
	srv3 := apiservertest.Start(t, other)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cs3 := kubernetes.NewForConfigOrDie(srv3.ClientConfig)
		_, _ = cs3.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}}, metav1.CreateOptions{})
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_, _ = cs3.CoreV1().Events("elsewhere").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i)}, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "elsewhere", Name: "p"}, Reason: "Tick"}, metav1.CreateOptions{})
		}
	}()
	_, stderr, code = runTool(t, "migrate", "--apiserver-manifest", manifest, "--liveness-window", "3s")
	close(stop)
	wg.Wait()
	srv3.Stop()
	if code != 1 || !strings.Contains(stderr, "etcd of events") || !strings.Contains(stderr, "--allow-live-apiserver") {
		t.Errorf("migrate with a kube-apiserver writing to the events etcd: exit %d, want 1 naming the events etcd\n%s", code, stderr)
	}
	sameBytes(t, "main etcd", mainBefore, rawAll(t, mainCli))
	eventsNow := rawAll(t, eventsCli)
	for k, v := range eventsBefore {
		if eventsNow[k] != v {
			t.Errorf("events etcd: %s changed by a refused run", k)
		}
	}

	// 6. Migrate again, then kube-apiserver with the same flags: the same
	// content, and a no-op update of every object writes nothing.
	if _, stderr, code := runTool(t, "migrate", "--apiserver-manifest", manifest, "--allow-live-apiserver"); code != 0 {
		t.Fatalf("migrate again: exit %d\n%s", code, stderr)
	}
	srv = apiservertest.Start(t, opts)
	sameContent(t, srv.ClientConfig, before)
	byResource := noOpUpdatesByResource(t, srv.ClientConfig)
	if byResource[schema.GroupResource{Resource: "events"}] < 4 && byResource[schema.GroupResource{Group: "events.k8s.io", Resource: "events"}] < 5 {
		t.Errorf("the no-op update covered no events: %v", byResource)
	}

	// 7. That kube-apiserver alive (on both etcds), and a key rotation to
	// make: refused, nothing written.
	enc.writeEncryptionConfig("encryption-config.yaml", encrypted, aescbcProvider("key3", 3), aescbcProvider("key2", 2), identityProvider)
	mainLive := rawUnder(t, mainCli, "/registry/secrets/")
	_, stderr, code = runTool(t, "migrate", "--apiserver-manifest", manifest)
	if code != 1 || !strings.Contains(stderr, "--allow-live-apiserver") {
		t.Errorf("migrate with a live kube-apiserver: exit %d, want 1\n%s", code, stderr)
	}
	sameBytes(t, "main etcd's secrets", mainLive, rawUnder(t, mainCli, "/registry/secrets/"))
	srv.Stop()
}

// createEvents creates n core/v1 Events about pods in ns.
func createEvents(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", prefix, i)},
			Reason:         "Started", Message: "started container", Type: corev1.EventTypeNormal,
		}
		if _, err := cs.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func overridesClient(t *testing.T, s *testetcd.Server, caFile, cert, key string) *clientv3.Client {
	t.Helper()
	cli, err := etcdscan.Connect(context.Background(), etcdscan.Config{Endpoints: []string{s.Endpoint}, CACert: caFile, Cert: cert, Key: key, DialTimeout: 5 * time.Second, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// rawUnder is every key under prefix with its bytes.
func rawUnder(t *testing.T, cli *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// rawAll is every key kube-apiserver keeps (under /registry/) with its
// bytes, but the master leases, which etcd removes when their lease
// expires (a stopped kube-apiserver's, whatever the tool does).
func rawAll(t *testing.T, cli *clientv3.Client) map[string]string {
	t.Helper()
	out := rawUnder(t, cli, "/registry/")
	for k := range out {
		if strings.HasPrefix(k, "/registry/masterleases/") {
			delete(out, k)
		}
	}
	return out
}

func sameBytes(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: %s is gone", what, k)
		case !bytes.Equal([]byte(g), []byte(v)):
			t.Errorf("%s: %s is not back byte for byte", what, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: %s was not there before", what, k)
		}
	}
}
