package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/pipeline"
)

// placeholderIP stands in for the webhook pod's address while kube-apiserver
// validates the EndpointSlice, which refuses a loopback address; it has the
// length of loopbackIP, which then replaces it in the stored bytes (as a CNI
// whose pod addresses this node reaches): nothing ever connects to it, and
// every connection of the test stays on loopback.
const (
	placeholderIP = "192.0.2.1" // TEST-NET-1, documentation only
	loopbackIP    = "127.0.0.1"
)

// TestConversionWebhookServiceReference: a CRD whose conversion webhook
// references a Service (no URL), reached by kube-apiserver itself with
// --enable-aggregator-routing through the Service's EndpointSlice (a real
// HTTPS server standing in for the pod, its certificate valid only for
// conv.webhooks.svc and signed by the CRD's caBundle). Its objects, created
// through v1beta1, stay stored at v1beta1 after the storage version moves to
// v1. With the kube-apiserver stopped, migrate, given no address, finds the
// Service and the EndpointSlice in etcd, calls the webhook and rewrites them
// at v1; the restarted kube-apiserver serves them unchanged and a no-op update
// of every object keeps its resourceVersion.
func TestConversionWebhookServiceReference(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)

	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "webhook-ca")
	certFile, keyFile := ca.IssueServing(t, dir, "conv", "conv.webhooks.svc")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	hook := &conversionWebhook{}
	hook.srv = httptest.NewUnstartedServer(http.HandlerFunc(hook.serve))
	ln, err := net.Listen("tcp", net.JoinHostPort(loopbackIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hook.srv.Listener.Close()
	hook.srv.Listener = ln
	hook.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	hook.srv.StartTLS()
	t.Cleanup(hook.srv.Close)
	port := int32(ln.Addr().(*net.TCPAddr).Port)

	opts := apiservertest.Options{ExtraFlags: []string{"--enable-aggregator-routing=true"}}
	rc := c.start(opts)
	cs := kubernetes.NewForConfigOrDie(rc)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "webhooks"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services("webhooks").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "conv"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "conv"},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	// What the EndpointSlice controller writes for a ready pod.
	if _, err := cs.DiscoveryV1().EndpointSlices("webhooks").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "conv-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: "conv", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{placeholderIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpointslice: %v", err)
	}
	// The pod's address is the loopback one: swapped into the stored bytes
	// (same length, so the protobuf framing holds), then seen by
	// kube-apiserver's watch before anything converts.
	sliceKey := "/registry/endpointslices/webhooks/conv-abcde"
	resp, err := c.cli.Get(ctx, sliceKey)
	if err != nil || len(resp.Kvs) != 1 || !bytes.Contains(resp.Kvs[0].Value, []byte(placeholderIP)) {
		t.Fatalf("the stored EndpointSlice %s (%v): its address is not readable in place", sliceKey, err)
	}
	if _, err := c.cli.Put(ctx, sliceKey, string(bytes.Replace(resp.Kvs[0].Value, []byte(placeholderIP), []byte(loopbackIP), 1))); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		es, err := cs.DiscoveryV1().EndpointSlices("webhooks").Get(ctx, "conv-abcde", metav1.GetOptions{})
		return err == nil && len(es.Endpoints) == 1 && len(es.Endpoints[0].Addresses) == 1 && es.Endpoints[0].Addresses[0] == loopbackIP, nil
	}); err != nil {
		t.Fatalf("kube-apiserver never served the EndpointSlice with the loopback address: %v", err)
	}

	ext := apiextensionsclient.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)
	crd := twoVersionCRD("hook.example.com", "gadgets", "Gadget",
		map[string]apiextensionsv1.JSONSchemaProps{"oldName": {Type: "string"}},
		map[string]apiextensionsv1.JSONSchemaProps{"name": {Type: "string"}},
		&apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig: &apiextensionsv1.WebhookClientConfig{
				Service:  &apiextensionsv1.ServiceReference{Namespace: "webhooks", Name: "conv", Path: ptr.To("/convert"), Port: ptr.To[int32](443)},
				CABundle: ca.PEM(),
			},
			ConversionReviewVersions: []string{"v1"},
		}})
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	waitCRD(t, ext, crd.Name, "established", established)
	beta := schema.GroupVersionResource{Group: "hook.example.com", Version: "v1beta1", Resource: "gadgets"}
	v1 := beta
	v1.Version = "v1"
	for i := 0; i < 3; i++ {
		createCR(t, dyn, beta, "Gadget", "default", fmt.Sprintf("g%d", i), map[string]any{"oldName": fmt.Sprintf("gadget-%d", i)})
	}
	moveStorageToV1(ctx, t, ext, crd.Name)
	assertStoredJSON(t, c, "/registry/hook.example.com/gadgets/default/g0", "hook.example.com/v1beta1")
	// Served through v1: kube-apiserver itself converts through the Service.
	before := snapshot(t, rc, []schema.GroupVersionResource{v1})
	if len(before) != 3 || before[objKey{GVR: v1, Namespace: "default", Name: "g0"}].Object["spec"].(map[string]any)["name"] != "gadget-0" {
		t.Fatalf("kube-apiserver served %d gadgets through v1 (%v): its conversion through the Service failed", len(before), before)
	}
	c.stop()

	callsBefore := hook.calls.Load()
	cfg := pipeline.Config{Prefix: "/registry"} // no WebhookURLs: the Service is resolved from etcd
	sum := c.migrate(cfg)
	var rewritten int64
	for _, r := range sum.Resources {
		if r.Group == "hook.example.com" {
			rewritten += r.Rewritten
		}
	}
	if rewritten != 3 {
		t.Errorf("migrate rewrote %d gadgets, want the 3 stored at v1beta1 (summary %+v)", rewritten, sum.Summary)
	}
	if hook.calls.Load() == callsBefore {
		t.Errorf("the migration never called the conversion webhook")
	}
	for i := 0; i < 3; i++ {
		assertStoredJSON(t, c, fmt.Sprintf("/registry/hook.example.com/gadgets/default/g%d", i), "hook.example.com/v1")
	}
	c.expectCurrent(cfg)

	rc = c.start(opts)
	waitCRD(t, apiextensionsclient.NewForConfigOrDie(rc), crd.Name, "established after restart", established)
	sameContent(t, rc, before)
	t.Logf("no-op update of %d objects", noOpUpdates(t, rc))
}
