package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/undo"
)

// The KMS fault tests' keyspace: secrets written by ten kube-apiserver runs
// under a KMS v2 plugin, each run with its own data-key seed, one namespace
// a run (so the keys of a seed are together in key order, and a run reading
// them meets each seed, and so each call to the plugin, in turn).
const (
	kmsSeeds          = 10
	kmsSecretsPerSeed = 600
	kmsSecrets        = kmsSeeds * kmsSecretsPerSeed
	kmsPageSize       = "100"
)

// kmsCluster is an etcd with kmsSecrets secrets under a KMS v2 plugin whose
// key ID is kek-1 when they were written and kek-2 now: every secret is
// stale (the rotation a migrate does), and each seed needs the plugin.
func kmsCluster(t *testing.T) (*testcluster.Cluster, *kmstest.PluginV2, string) {
	t.Helper()
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := c.EncryptionConfig("kms.yaml", fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 3s}\n", plugin.Endpoint()), testcluster.Identity)
	seedKMSSecrets(t, c, cfg)
	if err := plugin.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	return c, plugin, cfg
}

// seedKMSSecrets writes the secrets, a fresh load of cfg (a kube-apiserver
// start: a new seed) per namespace.
func seedKMSSecrets(t *testing.T, c *testcluster.Cluster, cfg string) {
	t.Helper()
	ctx := context.Background()
	codec := c.Codec("", "", testcluster.SecretsGR)
	for s := 0; s < kmsSeeds; s++ {
		enc, err := encryption.Load(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var ops []clientv3.Op
		for i := 0; i < kmsSecretsPerSeed; i++ {
			ns, name := fmt.Sprintf("run%02d", s), fmt.Sprintf("s-%04d", i)
			key := "/registry/secrets/" + ns + "/" + name
			plain, err := runtime.Encode(codec, testcluster.Secret(ns, name, "pw-"+name))
			if err != nil {
				t.Fatal(err)
			}
			v, err := enc.Encrypt(ctx, testcluster.SecretsGR, key, plain)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(key, string(v)))
			if len(ops) == 100 {
				if _, err := c.Cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					t.Fatal(err)
				}
				ops = ops[:0]
			}
		}
		enc.Close()
	}
}

// kmsKeyIDs counts the secrets by the KMS v2 key ID of their envelope; a
// value that is not a KMS v2 envelope of the plugin "vault" (unencrypted,
// another provider, a body that does not parse) fails the test.
func kmsKeyIDs(t *testing.T, values map[string]string) map[string]int {
	t.Helper()
	out := map[string]int{}
	const prefix = "k8s:enc:kms:v2:vault:"
	for k, v := range values {
		if !strings.HasPrefix(v, prefix) {
			t.Errorf("%s: stored as %q..., not a KMS v2 envelope of vault", k, v[:min(len(v), 24)])
			continue
		}
		var o kmstypes.EncryptedObject
		if err := proto.Unmarshal([]byte(v[len(prefix):]), &o); err != nil || len(o.EncryptedData) == 0 {
			t.Errorf("%s: a KMS v2 envelope whose body does not parse (%v): half-written", k, err)
			continue
		}
		out[o.KeyID]++
	}
	return out
}

// tool runs the binary with the connection flags of c.
func toolOn(t *testing.T, c *testcluster.Cluster, args ...string) (string, string, int) {
	t.Helper()
	return runTool(t, append(args, "--endpoints", c.Srv.Endpoint)...)
}

// TestKMSPluginKilledMidMigrate: a rotation of 6,000 secrets of ten seeds
// under a KMS v2 plugin (its key ID moved from kek-1 to kek-2) that takes
// 400 ms to unwrap each data key, so that the run still decides (its later
// seeds) when it writes (what it decided during the window first); the
// plugin killed when etcd shows the run's first write. The run stops within
// seconds (not one timeout per object left), exit 1, its stderr naming the
// plugin as the configuration names it and its socket; every secret is
// either as it was or a whole KMS v2 envelope under the new key ID, each
// one written journaled. With the plugin back, the same migrate completes
// and verify exits 0; a rollback of both runs gives back every byte.
func TestKMSPluginKilledMidMigrate(t *testing.T) {
	kmsKilledMidMigrate(t, "kek-2")
}

// TestKMSPluginBackWithNewKeyID: the same, the plugin coming back with
// another key ID (kek-3): the rerun writes every secret under it, the ones
// the first run wrote under kek-2 included, and verify exits 0.
func TestKMSPluginBackWithNewKeyID(t *testing.T) {
	kmsKilledMidMigrate(t, "kek-3")
}

func kmsKilledMidMigrate(t *testing.T, backWith string) {
	c, plugin, cfg := kmsCluster(t)
	before := secretValues(t, c)
	state := testcluster.StateDir(t)
	migrate := []string{"migrate", "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "1s", "--page-size", kmsPageSize}

	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	plugin.SetDecryptDelay(400 * time.Millisecond)
	run := startTool(t, append(migrate, "--endpoints", c.Srv.Endpoint)...)
	select {
	case <-w.oursSeen:
	case <-run.done:
		t.Fatalf("the run ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the run seen:\n%s", run.stderr.String())
	}
	plugin.Stop()
	killed := time.Now()
	code := run.wait(t)
	took := time.Since(killed)
	w.stop()
	if code != 1 {
		t.Fatalf("exit %d, want 1 (stopped, nothing lost); stdout:\n%s", code, run.stdout.String())
	}
	if took > 20*time.Second {
		t.Errorf("the run took %s to stop after the plugin was killed: want seconds (the plugin's timeout is 3s)", took.Round(time.Millisecond))
	}
	stderr := run.stderr.String()
	want := fmt.Sprintf(`error: stopped: KMS v2 plugin "vault" at %s does not answer`, plugin.Endpoint())
	if !strings.Contains(stderr, want) || !strings.Contains(stderr, "journaled") || !strings.Contains(stderr, "run migrate again") {
		t.Errorf("stderr does not say %q, the journal and what to do:\n%s", want, stderr)
	}

	// Nothing half-written or unencrypted, every write journaled.
	after := secretValues(t, c)
	ids := kmsKeyIDs(t, after)
	journal := filepath.Join(state, "runs", "0001-migrate", undo.JournalFile)
	written := journaled(t, journal, before, after)
	if written == 0 || written == kmsSecrets || ids["kek-2"] != written || ids["kek-1"] != kmsSecrets-written {
		t.Errorf("%d of %d secrets rewritten, by key ID %v: want a run stopped part-way, what it wrote under kek-2", written, kmsSecrets, ids)
	}
	t.Logf("stopped %s after the plugin was killed, %d of %d secrets rewritten", took.Round(time.Millisecond), written, kmsSecrets)

	// The plugin back (its keys kept, answering at once), perhaps with a new key ID.
	plugin.SetDecryptDelay(0)
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	if err := plugin.SetKeyID(backWith); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := toolOn(t, c, migrate...); code != 0 {
		t.Fatalf("migrate with the plugin back: exit %d\n%s", code, stderr)
	}
	if ids := kmsKeyIDs(t, secretValues(t, c)); ids[backWith] != kmsSecrets {
		t.Errorf("after the rerun, by key ID: %v; want all %d under %s", ids, kmsSecrets, backWith)
	}
	if stdout, stderr, code := toolOn(t, c, "verify", "--encryption-provider-config", cfg, "--resource", "secrets"); code != 0 {
		t.Fatalf("verify after the rerun: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, stderr, code := toolOn(t, c, "rollback", "--run", "0001-migrate", "--encryption-provider-config", cfg, "--liveness-window", "1s"); code != 0 {
		t.Fatalf("rollback of both runs: exit %d\n%s", code, stderr)
	}
	sameSecrets(t, before, secretValues(t, c))
}

// TestKMSPluginKilledDuringWindow: the plugin killed at the third data key
// the run unwraps, while the liveness window (60 s) still runs and what the
// run decided is held for its first write. The run stops at once, without
// sitting out the window (within the plugin's 3 s timeout and seconds),
// exit 1, its stderr naming the plugin and saying nothing was written,
// no snapshot left half-saved in its run directory: every secret byte for
// byte as before. With the plugin back, migrate completes and verify exits 0.
func TestKMSPluginKilledDuringWindow(t *testing.T) {
	c, plugin, cfg := kmsCluster(t)
	before := secretValues(t, c)
	state := testcluster.StateDir(t)
	migrate := []string{"migrate", "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "60s", "--page-size", kmsPageSize}

	plugin.StopAtDecrypt(3)
	start := time.Now()
	_, stderr, code := toolOn(t, c, migrate...)
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (stopped before any write)\n%s", code, stderr)
	}
	want := fmt.Sprintf(`KMS v2 plugin "vault" at %s does not answer`, plugin.Endpoint())
	if !strings.Contains(stderr, want) || !strings.Contains(stderr, "stopped before its first write: nothing was written") {
		t.Errorf("stderr does not name the plugin (%q) and say nothing was written:\n%s", want, stderr)
	}
	if took > 30*time.Second {
		t.Errorf("the run took %s to stop: want seconds, not the window's 60 s", took.Round(time.Millisecond))
	}
	if left, _ := filepath.Glob(filepath.Join(state, "runs", "0001-migrate", undo.SnapshotFile+"*")); len(left) != 0 {
		t.Errorf("left in the run directory: %v; want no snapshot of a run that wrote nothing", left)
	}
	sameSecrets(t, before, secretValues(t, c))
	t.Logf("stopped after %s, nothing written", took.Round(time.Millisecond))

	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := toolOn(t, c, append(migrate[:len(migrate)-4], "--liveness-window", "1s")...); code != 0 {
		t.Fatalf("migrate with the plugin back: exit %d\n%s", code, stderr)
	}
	if ids := kmsKeyIDs(t, secretValues(t, c)); ids["kek-2"] != kmsSecrets {
		t.Errorf("after the rerun, by key ID: %v; want all %d under kek-2", ids, kmsSecrets)
	}
	if stdout, stderr, code := toolOn(t, c, "verify", "--encryption-provider-config", cfg, "--resource", "secrets"); code != 0 {
		t.Fatalf("verify after the rerun: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestKMSPluginKilledMidRollback: rollback talks to the plugin only before
// its first write, decrypting each value it will put back (a rollback puts
// back stored bytes, still encrypted). The plugin killed at the first
// decryption of that check (the second seed's) stops the rollback within
// seconds, exit 1, its stderr naming the plugin and socket, nothing
// written; with the plugin back, the same rollback gives back every byte.
// Killed once the rollback writes, it changes nothing: the rollback
// completes, byte for byte.
func TestKMSPluginKilledMidRollback(t *testing.T) {
	c, plugin, cfg := kmsCluster(t)
	before := secretValues(t, c)
	if _, stderr, code := toolOn(t, c, "migrate", "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "1s"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, stderr)
	}
	migrated := secretValues(t, c)
	rollback := []string{"rollback", "--run", "0001-migrate", "--encryption-provider-config", cfg, "--liveness-window", "1s"}

	// Killed at the check's second data key.
	plugin.StopAtDecrypt(2)
	start := time.Now()
	_, stderr, code := toolOn(t, c, rollback...)
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("rollback, the plugin killed in its check: exit %d, want 1\n%s", code, stderr)
	}
	want := fmt.Sprintf(`KMS v2 plugin "vault" at %s does not answer`, plugin.Endpoint())
	if !strings.Contains(stderr, "error: rollback stopped before its first write") || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("stderr does not say the rollback stopped, %q, nothing written:\n%s", want, stderr)
	}
	if took > 30*time.Second {
		t.Errorf("the rollback took %s with the plugin killed: want seconds", took.Round(time.Millisecond))
	}
	sameSecrets(t, migrated, secretValues(t, c))

	// Back: the rollback again, and the plugin killed at its first write.
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	run := startTool(t, append(rollback, "--endpoints", c.Srv.Endpoint)...)
	select {
	case <-w.oursSeen:
		plugin.Stop()
	case <-run.done:
		t.Fatalf("the rollback ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the rollback seen:\n%s", run.stderr.String())
	}
	if code := run.wait(t); code != 0 {
		t.Fatalf("rollback, the plugin killed at its first write: exit %d, want 0\n%s", code, run.stdout.String())
	}
	w.stop()
	sameSecrets(t, before, secretValues(t, c))
}

// killableWebhook is a conversion webhook pod: a real HTTPS server on
// loopback whose certificate is valid for the Service's name
// conv.webhooks.svc only, signed by the CA the CRD's caBundle holds. It
// converts widgets (apiVersion set, the label converted-by=webhook). Kill
// closes its listener and every connection (a pod killed); Start serves
// again on the same address.
type killableWebhook struct {
	addr     string
	cert     tls.Certificate
	caBundle []byte
	mu       sync.Mutex
	srv      *http.Server
}

func startKillableWebhook(t *testing.T) *killableWebhook {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "webhook-ca")
	certFile, keyFile := ca.IssueServing(t, dir, "conv", "conv.webhooks.svc")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := &killableWebhook{addr: "127.0.0.1:0", cert: cert, caBundle: ca.PEM()}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Kill)
	return h
}

func (h *killableWebhook) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		return err
	}
	h.addr = ln.Addr().String()
	h.srv = &http.Server{Handler: http.HandlerFunc(h.serve), TLSConfig: &tls.Config{Certificates: []tls.Certificate{h.cert}}}
	go func(srv *http.Server) { _ = srv.ServeTLS(ln, "", "") }(h.srv)
	return nil
}

func (h *killableWebhook) Kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.srv != nil {
		_ = h.srv.Close() // the listener and every connection, at once
		h.srv = nil
	}
}

func (h *killableWebhook) port(t *testing.T) int32 {
	t.Helper()
	_, p, _ := net.SplitHostPort(h.addr)
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

func (h *killableWebhook) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var review apiextensionsv1.ConversionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, raw := range review.Request.Objects {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw.Raw); err != nil {
			http.Error(w, "bad object", http.StatusBadRequest)
			return
		}
		u.SetAPIVersion(review.Request.DesiredAPIVersion)
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["converted-by"] = "webhook"
		u.SetLabels(labels)
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Object: u})
	}
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// putWebhookWidgets stores the widgets CRD, its conversion webhook the
// Service webhooks/conv (port 443, path /convert) with one ready endpoint,
// the pod at 127.0.0.1:port, as kube-apiserver stores them, and n widgets
// at v1beta1 (the storage version is v1).
func putWebhookWidgets(t *testing.T, c *testcluster.Cluster, hook *killableWebhook, n int) {
	t.Helper()
	crd := seed.WidgetCRD()
	crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig: &apiextensionsv1.WebhookClientConfig{
				Service:  &apiextensionsv1.ServiceReference{Namespace: "webhooks", Name: "conv", Path: ptr.To("/convert"), Port: ptr.To[int32](443)},
				CABundle: hook.caBundle,
			},
			ConversionReviewVersions: []string{"v1"},
		}}
	c.Put("/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", decode.CRDGroupResource, crd, "", "", "")
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "webhooks", Name: "conv", UID: "uid-svc-conv", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicySingleStack),
			Selector: map[string]string{"app": "conv"},
			Ports:    []corev1.ServicePort{{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromString("https")}},
		},
	}
	c.Put("/registry/services/specs/webhooks/conv", schema.GroupResource{Resource: "services"}, svc, "", "", "")
	es := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Namespace: "webhooks", Name: "conv-x7k2p", UID: "uid-es-conv", CreationTimestamp: metav1.Unix(1700000000, 0), Labels: map[string]string{discoveryv1.LabelServiceName: "conv", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(hook.port(t))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	c.Put("/registry/endpointslices/webhooks/conv-x7k2p", schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, es, "", "", "")
	var ops []clientv3.Op
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w-%05d", i)
		w, err := json.Marshal(map[string]any{"apiVersion": "example.com/v1beta1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": "ns", "uid": "uid-" + name, "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
			"spec":     map[string]any{"size": i, "tier": "gold"}})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut("/registry/example.com/widgets/ns/"+name, string(append(w, '\n'))))
		if len(ops) == 100 || i == n-1 {
			if _, err := c.Cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
}

// widgetsConvertedWhole fails unless every widget is as it was before or
// whole at v1, converted by the webhook; it returns how many are converted.
func widgetsConvertedWhole(t *testing.T, before, after map[string]string) int {
	t.Helper()
	converted := 0
	for k, v := range after {
		if !strings.HasPrefix(k, "/registry/example.com/widgets/") || v == before[k] {
			continue
		}
		var w struct {
			APIVersion string `json:"apiVersion"`
			Metadata   struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec map[string]any `json:"spec"`
		}
		if err := json.Unmarshal([]byte(v), &w); err != nil || w.APIVersion != "example.com/v1" || w.Metadata.Labels["converted-by"] != "webhook" || w.Spec["tier"] != "gold" {
			t.Errorf("%s: neither as it was nor converted whole (%v): %s", k, err, v)
			continue
		}
		converted++
	}
	return converted
}

// TestWebhookKilledMidMigrate: 3,000 custom resources converted by a
// webhook behind a Service (reached through its EndpointSlice, as with
// every kube-apiserver stopped), the webhook killed when etcd shows the
// run's first write of one. The run stops (not each object left reported
// unreadable), exit 1, its stderr naming the CRD, the Service and the
// address; every widget is as it was or converted whole, each write
// journaled. With the webhook back, the same migrate completes, verify
// exits 0, and a rollback of both runs gives back every byte of etcd.
func TestWebhookKilledMidMigrate(t *testing.T) {
	const widgets = 3000
	c := testcluster.New(t, testetcd.Options{})
	hook := startKillableWebhook(t)
	putWebhookWidgets(t, c, hook, widgets)
	before := c.Raw()
	state := testcluster.StateDir(t)
	migrate := []string{"migrate", "--target-version", "1.37", "--liveness-window", "1s", "--page-size", "100"}

	w := watchWrites(t, c.Cli, c.Revision(), "/registry/example.com/widgets/")
	run := startTool(t, append(migrate, "--endpoints", c.Srv.Endpoint)...)
	select {
	case <-w.oursSeen:
	case <-run.done:
		t.Fatalf("the run ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the run seen:\n%s", run.stderr.String())
	}
	hook.Kill()
	code := run.wait(t)
	w.stop()
	if code != 1 {
		t.Fatalf("exit %d, want 1 (stopped, nothing lost); stdout:\n%s", code, run.stdout.String())
	}
	stderr := run.stderr.String()
	want := "error: stopped: CRD widgets.example.com: conversion webhook service webhooks/conv:443 at " + hook.addr + " stopped answering"
	if !strings.Contains(stderr, want) || !strings.Contains(stderr, "journaled") {
		t.Errorf("stderr does not say %q and where the journal is:\n%s", want, stderr)
	}
	after := c.Raw()
	converted := widgetsConvertedWhole(t, before, after)
	written := journaled(t, filepath.Join(state, "runs", "0001-migrate", undo.JournalFile), before, after)
	if converted == 0 || converted == widgets || written < converted {
		t.Errorf("%d of %d widgets converted, %d keys written: want a run stopped part-way", converted, widgets, written)
	}
	t.Logf("stopped after %d of %d widgets converted", converted, widgets)

	if err := hook.Start(); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := toolOn(t, c, migrate...); code != 0 {
		t.Fatalf("migrate with the webhook back: exit %d\n%s", code, stderr)
	}
	if n := widgetsConvertedWhole(t, before, c.Raw()); n != widgets {
		t.Errorf("after the rerun %d of %d widgets converted", n, widgets)
	}
	if stdout, stderr, code := toolOn(t, c, "verify"); code != 0 {
		t.Fatalf("verify after the rerun: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, stderr, code := toolOn(t, c, "rollback", "--run", "0001-migrate", "--liveness-window", "1s"); code != 0 {
		t.Fatalf("rollback of both runs: exit %d\n%s", code, stderr)
	}
	sameKeys(t, before, c.Raw())
}

// sameKeys fails unless etcd holds exactly the keys of before, each with
// its value of before, byte for byte.
func sameKeys(t *testing.T, before, after map[string]string) {
	t.Helper()
	bad := 0
	for k, v := range before {
		if got, ok := after[k]; !ok || got != v {
			if bad++; bad <= 5 {
				t.Errorf("%s: not its value of before (present %v)", k, ok)
			}
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: not there before", k)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d key(s) differ from before", bad)
	}
}

// memberSecrets is the number of secrets the member tests rotate: enough
// that the run still writes once a member is stopped at its first write.
const memberSecrets = 4000

// TestMemberStoppedMidMigrate: a key rotation of 4,000 secrets on a
// 3-member etcd, the member of the first endpoint stopped (a crash: no
// leadership handed on) when etcd shows the run's first write. Given every
// member's endpoint, the run goes on through the others, or stops cleanly
// (exit 1); given that member's only, it stops cleanly, exit 1, saying etcd
// could not be reached. Either way every secret is as it was or rewritten
// whole under the new key, each write journaled; with the member back, the
// same migrate completes, verify exits 0, and a rollback of every run gives
// back every byte.
func TestMemberStoppedMidMigrate(t *testing.T) {
	for _, tc := range []struct {
		name string
		only bool // the tool given the stopped member's endpoint only
	}{{"every endpoint", false}, {"its endpoint only", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ec := testetcd.StartClusterT(t, 3)
			cli := ec.ClientT(t)
			c := testcluster.NewOn(t, cli)
			oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
			newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
			c.SeedMany(memberSecrets, oldCfg)
			before := c.Raw()
			beforeSecrets := secretValues(t, c)
			state := testcluster.StateDir(t)
			all := strings.Join(ec.Endpoints(), ",")
			endpoints := all
			if tc.only {
				endpoints = ec.Members[0].Endpoint
			}
			migrate := []string{"migrate", "--encryption-provider-config", newCfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "1s"}

			w := watchWrites(t, cli, c.Revision(), "/registry/secrets/")
			// One key per transaction, one writer: the run is still
			// writing when the member is stopped at its first write.
			run := startTool(t, append(migrate, "--endpoints", endpoints, "--writers", "1", "--batch-ops", "1")...)
			select {
			case <-w.oursSeen:
			case <-run.done:
				t.Fatalf("the run ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
			case <-time.After(3 * time.Minute):
				t.Fatalf("no write of the run seen:\n%s", run.stderr.String())
			}
			atKill := c.Revision()
			killing := time.Now()
			ec.Members[0].Kill()
			stopped := time.Now()
			killedAt := c.Revision() // through the members left
			t.Logf("the member stopped in %s, etcd at revision %d then, %d when it was told to stop", stopped.Sub(killing).Round(time.Millisecond), killedAt, atKill)
			if tc.only {
				// Each write waits out etcd's retries (about a minute at
				// the default --command-timeout), not one per batch left.
				select {
				case <-run.done:
				case <-time.After(150 * time.Second):
					t.Fatalf("the run goes on %s after its only etcd member was stopped:\n%s", time.Since(stopped).Round(time.Second), run.stderr.String())
				}
			}
			code := run.wait(t)
			t.Logf("the run ended %s after the member was stopped", time.Since(stopped).Round(time.Millisecond))
			w.stop()
			switch {
			case tc.only && code != 1:
				t.Fatalf("exit %d, want 1: the only member it was given is gone; stdout:\n%s", code, run.stdout.String())
			case code != 0 && code != 1:
				t.Fatalf("exit %d, want 0 (went on through the others) or 1 (stopped cleanly); stdout:\n%s", code, run.stdout.String())
			}
			if code == 1 && !strings.Contains(run.stderr.String(), "error: ") {
				t.Errorf("stopped without saying why:\n%s", run.stderr.String())
			}
			if tc.only {
				// One line naming etcd, the endpoint, the journal kept.
				line := errorLine(run.stderr.String())
				for _, want := range []string{"etcd is unavailable", ec.Members[0].Endpoint, "journal " + filepath.Join(state, "runs", "0001-migrate", undo.JournalFile) + " is intact", "--endpoints"} {
					if !strings.Contains(line, want) {
						t.Errorf("stderr's error line does not say %q:\n%s", want, line)
					}
				}
			}
			after := secretValues(t, c)
			written, unconfirmed := journaledInFlight(t, filepath.Join(state, "runs", "0001-migrate", undo.JournalFile), beforeSecrets, after)
			for k, v := range after {
				if v != beforeSecrets[k] && !strings.HasPrefix(v, "k8s:enc:aescbc:v1:key2:") {
					t.Errorf("%s: rewritten, but not under the new key", k)
				}
			}
			t.Logf("exit %d, %d of %d secrets rewritten (%d of them in flight when the member stopped: journaled, unconfirmed)", code, written, memberSecrets, unconfirmed)
			if tc.only && (written == 0 || written == memberSecrets) {
				t.Errorf("%d of %d secrets rewritten: want a run stopped part-way", written, memberSecrets)
			}
			if after := keysWrittenSince(t, cli, "/registry/secrets/", atKill); !tc.only && code == 0 {
				// Went on through the others: it wrote after the member was
				// gone. Its raft stops at once (Kill); closing its listeners
				// takes seconds more, in which a quick run may finish through
				// the others: counted from the revision at the kill.
				t.Logf("%d secret(s) written after the member was stopped (revision %d)", after, atKill)
				if after == 0 {
					t.Errorf("nothing written after the member was stopped: the test did not stop it mid-run")
				}
			}

			if err := ec.Members[0].Restart(); err != nil {
				t.Fatal(err)
			}
			if _, stderr, code := runTool(t, append(migrate, "--endpoints", all)...); code != 0 {
				t.Fatalf("migrate with the member back: exit %d\n%s", code, stderr)
			}
			if stdout, stderr, code := runTool(t, "verify", "--endpoints", all, "--encryption-provider-config", newCfg, "--resource", "secrets"); code != 0 {
				t.Fatalf("verify after the rerun: exit %d\n%s%s", code, stdout, stderr)
			}
			if _, stderr, code := runTool(t, "rollback", "--endpoints", all, "--run", "0001-migrate", "--encryption-provider-config", newCfg, "--liveness-window", "1s"); code != 0 {
				t.Fatalf("rollback of every run: exit %d\n%s", code, stderr)
			}
			sameKeys(t, before, c.Raw())
		})
	}
}

// errorLine is the line of stderr that starts "error: " ("" when none).
func errorLine(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "error: ") {
			return l
		}
	}
	return ""
}

// journaledInFlight fails unless every secret whose value differs from
// before has the intent of that very value (its sha256) in the run's
// journal. A write sent when etcd stopped answering may have landed
// without the run seeing it: its intent is journaled, its "done" is not
// (unconfirmed); a rollback tells it by that sha256.
func journaledInFlight(t *testing.T, journal string, before, after map[string]string) (written, unconfirmed int) {
	t.Helper()
	intents, done := map[string]map[string]bool{}, map[string]bool{}
	if err := undo.ReadJournal(journal, func(r undo.JournalRecord) error {
		switch r.Op {
		case "intent":
			if intents[r.Key] == nil {
				intents[r.Key] = map[string]bool{}
			}
			intents[r.Key][r.NewSHA256] = true
		case "done":
			done[r.Key] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for k, v := range after {
		if v == before[k] {
			continue
		}
		written++
		sum := sha256.Sum256([]byte(v))
		switch {
		case !intents[k][hex.EncodeToString(sum[:])]:
			t.Errorf("%s written but its value is in no intent of the journal", k)
		case !done[k]:
			unconfirmed++
		}
	}
	return written, unconfirmed
}

// keysWrittenSince counts the keys under prefix last written after revision rev.
func keysWrittenSince(t *testing.T, cli *clientv3.Client, prefix string, rev int64) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if kv.ModRevision > rev {
			n++
		}
	}
	return n
}
