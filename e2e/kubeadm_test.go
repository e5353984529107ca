package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/verify"
)

// TestKubeadmManifest: a control plane shaped like kubeadm's — etcd over TLS
// with client certificates, encryption at rest, a custom --etcd-prefix, a beta
// API enabled by --runtime-config and a non-default feature gate — whose
// encryption key is rotated. The tool, given nothing but the apiserver's
// static-pod manifest (its paths mapped through the hostPath volumes), verifies,
// migrates and verifies again; kube-apiserver started with the same flags then
// serves every object unchanged and rewrites none on a no-op update. The
// managedFields written through resource.k8s.io/v1beta2 survive because the
// manifest's --runtime-config keeps that version served. API Priority and
// Fairness is on, as in a kubeadm cluster, and its FlowSchemas and
// PriorityLevelConfigurations are encrypted too: the tool rewrites every one of
// the apiserver's bootstrap objects (status conditions included) under the new
// key, and the apiserver's no-op update then finds nothing to change in them.
func TestKubeadmManifest(t *testing.T) {
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
	etcd := testetcd.StartT(t, testetcd.Options{TLS: &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}})

	const (
		prefix        = "/cluster-a/registry"
		runtimeConfig = "resource.k8s.io/v1beta2=true"
		featureGates  = "DRAConsumableCapacity=false"
		ns            = "payments"
	)
	enc := &cluster{t: t, dir: encDir}
	encrypted := []string{"secrets", flowSchemas.String(), priorityLevels.String()}
	encFile := enc.writeEncryptionConfig("encryption-config.yaml", encrypted, aescbcProvider("key1", 1), identityProvider)
	opts := apiservertest.Options{
		EtcdURL: "https://" + etcd.Endpoint, EtcdCAFile: ca.File, EtcdCertFile: cliCert, EtcdKeyFile: cliKey,
		Prefix: prefix, EncryptionConfigPath: encFile, RuntimeConfig: runtimeConfig, FeatureGates: featureGates,
		PriorityAndFairness: true,
	}

	// 1. The cluster as it runs: secrets under key1, DRA objects applied
	// through the beta API the runtime config enables.
	srv := apiservertest.Start(t, opts)
	rc := srv.ClientConfig
	cs := kubernetes.NewForConfigOrDie(rc)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("db-%d", i)}, Data: secretData(i)}, metav1.CreateOptions{FieldManager: "kubectl-create"}); err != nil {
			t.Fatal(err)
		}
	}
	ssa := []byte(`{"apiVersion":"resource.k8s.io/v1beta2","kind":"DeviceClass","metadata":{"name":"fpga"},"spec":{"selectors":[{"cel":{"expression":"device.driver == \"fpga.example.com\""}}]}}`)
	if _, err := cs.ResourceV1beta2().DeviceClasses().Patch(ctx, "fpga", types.ApplyPatchType, ssa, metav1.PatchOptions{FieldManager: "kubectl", Force: ptrTrue()}); err != nil {
		t.Fatalf("server-side apply through v1beta2: %v", err)
	}
	if _, err := cs.ResourceV1beta2().DeviceClasses().Create(ctx, &resourcev1beta2.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "nic"},
		Spec:       resourcev1beta2.DeviceClassSpec{Selectors: []resourcev1beta2.DeviceSelector{{CEL: &resourcev1beta2.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}},
	}, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, rc, servedResources(t, rc))
	srv.Stop()

	// 2. Key rotation: key2 first, key1 still there to read.
	enc.writeEncryptionConfig("encryption-config.yaml", encrypted, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)

	// 3. The kubeadm manifest of this control plane: container paths under
	// /etc/kubernetes/pki and /etc/kubernetes/enc, mounted from this test's
	// directories.
	manifest := writeKubeadmManifest(t, dir, map[string]string{
		"--etcd-servers=https://127.0.0.1:2379": "--etcd-servers=https://" + etcd.Endpoint,
		"path: /etc/kubernetes/pki":             "path: " + pki,
		"path: /etc/kubernetes/encryption":      "path: " + encDir,
		"    - --advertise-address=10.0.0.5\n":  "    - --advertise-address=10.0.0.5\n    - --runtime-config=" + runtimeConfig + "\n    - --feature-gates=" + featureGates + "\n",
	})

	// 4. verify: stale (the secrets' and P&F objects' key), nothing else; it
	// says where its configuration came from.
	out, stderr, code := runTool(t, "verify", "--apiserver-manifest", manifest, "-o", "json")
	if code != 3 {
		t.Fatalf("verify before migrate: exit %d, want 3\n%s", code, stderr)
	}
	if want := "using kube-apiserver " + manifest + ": --etcd-servers=https://" + etcd.Endpoint + " (manifest)"; !strings.Contains(stderr, want) {
		t.Errorf("verify's report of its configuration lacks %q:\n%s", want, stderr)
	}
	for _, w := range []string{"--etcd-prefix=" + prefix + " (manifest)", "--runtime-config=" + runtimeConfig + " (manifest)", "--feature-gates=" + featureGates + " (manifest)", "--encryption-provider-config=" + filepath.Join(encDir, "encryption-config.yaml") + " (manifest)"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("verify's report of its configuration lacks %q", w)
		}
	}
	var rep verify.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify -o json: %v\n%s", err, out)
	}
	cli, err := etcdscan.Connect(ctx, etcdscan.Config{Endpoints: []string{etcd.Endpoint}, CACert: ca.File, Cert: cliCert, Key: cliKey, DialTimeout: 5 * time.Second, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	apf := apfBootstrapCounts(t, cli, prefix)
	reported := map[schema.GroupResource]bool{}
	for _, r := range rep.Resources {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		switch {
		case r.Name() == "secrets":
			if r.Stale != 3 || r.StaleBy[reencode.ReasonEncryption] != 3 {
				t.Errorf("secrets: stale %d by %v, want 3 by encryption", r.Stale, r.StaleBy)
			}
		case apf[gr] > 0:
			if r.Stale != int64(apf[gr]) || r.StaleBy[reencode.ReasonEncryption] != apf[gr] || len(r.StaleBy) != 1 {
				t.Errorf("%s: stale %d by %v, want all %d by encryption", gr, r.Stale, r.StaleBy, apf[gr])
			}
			reported[gr] = true
		case r.Stale > 0:
			// v1beta2 is served (--runtime-config in the manifest): its
			// managedFields entries stay, nothing else is stale.
			t.Errorf("%s: stale %d by %v, want nothing stale but the encrypted resources", r.Name(), r.Stale, r.StaleBy)
		}
	}
	for gr, n := range apf {
		if !reported[gr] {
			t.Errorf("verify does not report %s (etcd holds %d)", gr, n)
		}
	}

	// 5. migrate and verify again, with the manifest alone. The only
	// kube-apiserver was stopped by this test moments ago; its identity lease
	// is still fresh, hence the override.
	if _, stderr, code := runTool(t, "migrate", "--apiserver-manifest", manifest, "--allow-live-apiserver", "--journal", filepath.Join(dir, "journal")); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := runTool(t, "verify", "--apiserver-manifest", manifest); code != 0 {
		t.Fatalf("verify after migrate: exit %d, want 0\n%s", code, stderr)
	}
	for _, dir := range []string{prefix + "/secrets/" + ns + "/", prefix + "/flowschemas/", prefix + "/prioritylevelconfigurations/"} {
		resp, err := cli.Get(ctx, dir, clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("%s: %d keys, %v", dir, len(resp.Kvs), err)
		}
		for _, kv := range resp.Kvs {
			if v := kv.Value; !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key2:")) {
				t.Errorf("%s is not under key2 after migrate (starts %q)", kv.Key, v[:min(len(v), 24)])
			}
		}
	}

	// 6. kube-apiserver with the same flags: same content, same managedFields,
	// and a no-op update of every object of every resource writes nothing.
	srv = apiservertest.Start(t, opts)
	sameContent(t, srv.ClientConfig, before)
	byResource := noOpUpdatesByResource(t, srv.ClientConfig)
	srv.Stop()
	for gr, n := range apf {
		if byResource[gr] < n {
			t.Errorf("the no-op update covered %d %s, the tool rewrote %d", byResource[gr], gr, n)
		}
	}
	t.Logf("no-op update of %d objects, %d flowschemas and %d prioritylevelconfigurations among them", total(byResource), byResource[flowSchemas], byResource[priorityLevels])

	// A flag the manifest's kube-apiserver would reject is a usage error
	// naming it, and nothing runs.
	bad := writeKubeadmManifest(t, dir, map[string]string{"    - --advertise-address=10.0.0.5\n": "    - --advertise-address=10.0.0.5\n    - --feature-gates=NoSuchGate=true\n"})
	if _, stderr, code := runTool(t, "verify", "--apiserver-manifest", bad); code != 2 || !strings.Contains(stderr, "NoSuchGate") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("a manifest with an unknown feature gate: exit %d, stderr %q; want exit 2 and one line naming it", code, stderr)
	}
}

// writeKubeadmManifest writes testdata's kubeadm manifest with the given
// replacements, each of which must apply.
func writeKubeadmManifest(t *testing.T, dir string, repl map[string]string) string {
	t.Helper()
	data, err := os.ReadFile("../testdata/kubeadm/kube-apiserver.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for old, new := range repl {
		if !strings.Contains(s, old) {
			t.Fatalf("kubeadm manifest: %q not found", old)
		}
		s = strings.ReplaceAll(s, old, new)
	}
	f, err := os.CreateTemp(dir, "kube-apiserver-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return f.Name()
}
