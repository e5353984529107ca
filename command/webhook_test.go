package command

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/plan"
)

// podWebhook is a conversion webhook pod: a real HTTPS server on loopback whose
// certificate is valid only for the Service's DNS name conv.webhooks.svc, signed
// by the CA the CRD's caBundle holds. It converts widgets by setting their
// apiVersion and the label converted-by=webhook, and records the paths called.
type podWebhook struct {
	srv      *httptest.Server
	caBundle []byte
	mu       sync.Mutex
	paths    []string
}

func startPodWebhook(t *testing.T) *podWebhook {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "webhook-ca")
	certFile, keyFile := ca.IssueServing(t, dir, "conv", "conv.webhooks.svc")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h := &podWebhook{caBundle: ca.PEM()}
	h.srv = httptest.NewUnstartedServer(h)
	h.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	h.srv.StartTLS()
	t.Cleanup(h.srv.Close)
	return h
}

func (h *podWebhook) port(t *testing.T) int32 {
	t.Helper()
	p, err := strconv.Atoi(strings.TrimPrefix(h.srv.URL, "https://127.0.0.1:"))
	if err != nil {
		t.Fatalf("webhook URL %s: %v", h.srv.URL, err)
	}
	return int32(p)
}

func (h *podWebhook) called() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.paths...)
}

func (h *podWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.paths = append(h.paths, r.URL.Path)
	h.mu.Unlock()
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

var endpointSlicesGR = schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}

// putWebhookService stores the webhook's Service (port 443 -> the pod's
// named port https) and its EndpointSlice with the given endpoint addresses
// (ready, at port), as kube-apiserver stores them.
func putWebhookService(c *testcluster.Cluster, port int32, ready []string, notReady ...string) {
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
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
	}
	for _, a := range ready {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	for _, a := range notReady {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}})
	}
	c.Put("/registry/endpointslices/webhooks/conv-x7k2p", endpointSlicesGR, es, "", "", "")
}

// putWebhookWidgetCRD stores the widgets CRD with its conversion webhook
// referencing the Service webhooks/conv (port 443, path /convert), the pod's
// CA as caBundle.
func putWebhookWidgetCRD(c *testcluster.Cluster, hook *podWebhook) {
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
}

// putOldWidgets stores n widgets at v1beta1 (not the storage version), as
// kube-apiserver wrote them before the storage version moved.
func putOldWidgets(t *testing.T, c *testcluster.Cluster, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		name := fmt.Sprintf("w-%02d", i)
		w, err := json.Marshal(map[string]any{"apiVersion": "example.com/v1beta1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": "ns", "uid": "uid-" + name, "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
			"spec":     map[string]any{"size": i, "tier": "gold"}})
		if err != nil {
			t.Fatal(err)
		}
		c.PutRaw("/registry/example.com/widgets/ns/"+name, append(w, '\n'))
	}
}

func storedWidgetObj(t *testing.T, c *testcluster.Cluster, name string) map[string]any {
	t.Helper()
	v, _, _ := c.Get("/registry/example.com/widgets/ns/" + name)
	var m map[string]any
	if err := json.Unmarshal(v, &m); err != nil {
		t.Fatalf("%s: %v (%q)", name, err, v)
	}
	return m
}

func widgetCounts(sum migrate.Summary) migrate.Counts {
	for _, r := range sum.Resources {
		if r.Group == "example.com" && r.Resource == "widgets" {
			return r.Counts
		}
	}
	return migrate.Counts{}
}

func migrateJSON(t *testing.T, args ...string) (int, migrate.Summary, string) {
	t.Helper()
	code, out, stderr := runCLI(t, append([]string{"migrate", "-o", "json", "--liveness-window", "500ms"}, args...)...)
	var sum migrate.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("migrate -o json: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	return code, sum, out + stderr
}

// TestConversionWebhookThroughEndpointSlices: a CRD whose conversion webhook
// references a Service (no URL), with every kube-apiserver stopped: migrate, given
// no address, finds the Service and its EndpointSlice in etcd, tries the ready
// endpoints (one is a dead pod IP), and the live pod converts every widget at the
// CRD's path, its certificate checked for conv.webhooks.svc against the caBundle.
// When no endpoint answers, migrate names each address tried and the flag;
// --conversion-webhook NS/SVC=HOST:PORT/PATH (no scheme) then reaches it at that
// path.
func TestConversionWebhookThroughEndpointSlices(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	hook := startPodWebhook(t)
	port := hook.port(t)
	putWebhookWidgetCRD(c, hook)
	// 127.0.0.2 is a pod gone (nothing listens there), 127.0.0.3 is not ready.
	putWebhookService(c, port, []string{"127.0.0.2", "127.0.0.1"}, "127.0.0.3")
	putOldWidgets(t, c, 0, 4)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--target-version", "1.37"}

	code, sum, out := migrateJSON(t, conn...)
	if code != exitOK || sum.Summary.Failed != 0 || sum.Summary.Unreadable != 0 || widgetCounts(sum).Rewritten != 4 {
		t.Fatalf("migrate without --conversion-webhook: exit %d, %+v\n%s", code, sum.Summary, out)
	}
	for i := 0; i < 4; i++ {
		w := storedWidgetObj(t, c, fmt.Sprintf("w-%02d", i))
		labels, _ := w["metadata"].(map[string]any)["labels"].(map[string]any)
		if w["apiVersion"] != "example.com/v1" || labels["converted-by"] != "webhook" {
			t.Fatalf("w-%02d stored as %v: want example.com/v1 converted by the webhook", i, w)
		}
	}
	paths := hook.called()
	if len(paths) == 0 {
		t.Fatal("the webhook was never called")
	}
	for _, p := range paths {
		if p != "/convert" {
			t.Fatalf("the webhook was called at %q, want the CRD's path /convert", p)
		}
	}

	// The pod moved: only a dead address is ready. migrate fails for the new
	// widgets, saying which address it tried, why, and how to give one.
	putWebhookService(c, port, []string{"127.0.0.2"})
	putOldWidgets(t, c, 4, 2)
	code, sum, out = migrateJSON(t, conn...)
	t.Logf("migrate, no endpoint answering: exit %d\n%s", code, out)
	dead := net.JoinHostPort("127.0.0.2", strconv.Itoa(int(port)))
	for _, want := range []string{
		"CRD widgets.example.com: conversion webhook service webhooks/conv (port 443) cannot be reached: none of its 1 ready endpoint(s) in etcd answered (" + dead + ": dial tcp " + dead + ": connect: connection refused)",
		"--conversion-webhook webhooks/conv=HOST:PORT",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate with no endpoint answering (exit %d) does not say %q:\n%s", code, want, out)
		}
	}
	if code == exitOK || widgetCounts(sum).Rewritten != 0 || widgetCounts(sum).Unreadable != 2 {
		t.Fatalf("migrate with no endpoint answering: exit %d, %+v", code, sum.Summary)
	}
	if w := storedWidgetObj(t, c, "w-04"); w["apiVersion"] != "example.com/v1beta1" {
		t.Fatalf("w-04 changed though it could not be converted: %v", w)
	}

	// The operator gives the pod's address, no scheme, another path.
	code, sum, out = migrateJSON(t, append([]string{"--conversion-webhook", fmt.Sprintf("webhooks/conv=127.0.0.1:%d/alt-convert", port)}, conn...)...)
	if code != exitOK || widgetCounts(sum).Rewritten != 2 {
		t.Fatalf("migrate --conversion-webhook host:port/path: exit %d, %+v\n%s", code, sum.Summary, out)
	}
	if w := storedWidgetObj(t, c, "w-05"); w["apiVersion"] != "example.com/v1" {
		t.Fatalf("w-05 stored as %v", w)
	}
	if p := hook.called(); p[len(p)-1] != "/alt-convert" {
		t.Fatalf("with --conversion-webhook .../alt-convert the webhook was called at %q", p[len(p)-1])
	}
}

func TestConversionWebhookFlag(t *testing.T) {
	for _, ok := range []string{"ns/svc=127.0.0.1:8443", "ns/svc=127.0.0.1:8443/convert", "ns/svc=https://10.0.0.1:8443/convert", "ns/svc=https://conv.example:8443", "ns/svc=[fd00::1]:8443"} {
		if _, err := parseWebhooks([]string{ok}); err != nil {
			t.Errorf("--conversion-webhook %s: %v", ok, err)
		}
	}
	for _, bad := range []string{"svc=127.0.0.1:8443", "ns/svc", "ns/svc=http://127.0.0.1:8443", "ns/svc=127.0.0.1", "/svc=127.0.0.1:1", "ns/=127.0.0.1:1"} {
		if _, err := parseWebhooks([]string{bad}); err == nil || !strings.Contains(err.Error(), "--conversion-webhook") {
			t.Errorf("--conversion-webhook %s accepted: %v", bad, err)
		}
	}
}

// TestPlanSaysWhetherWebhooksAnswer: the plan says, for a CRD whose conversion
// webhook references a Service, whether it answered from here — the objects
// it converted in the decision and the endpoint, or, when none needs
// converting, a verified TLS handshake; a webhook that does not answer is a
// warning when nothing needs it, a blocker when objects do.
func TestPlanSaysWhetherWebhooksAnswer(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	hook := startPodWebhook(t)
	port := hook.port(t)
	putWebhookWidgetCRD(c, hook)
	putWebhookService(c, port, []string{"127.0.0.2", "127.0.0.1"})
	putOldWidgets(t, c, 0, 3)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--target-version", "1.37"}
	live := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	dead := net.JoinHostPort("127.0.0.2", strconv.Itoa(int(port)))
	planJSON := func() (int, plan.Plan) {
		t.Helper()
		code, out, stderr := runCLI(t, append([]string{"plan", "-o", "json"}, conn...)...)
		var p plan.Plan
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("plan -o json: exit %d, %v\n%s%s", code, err, out, stderr)
		}
		if len(p.Webhooks) != 1 || p.Webhooks[0].CRD != "widgets.example.com" || p.Webhooks[0].Target != "service webhooks/conv:443" {
			t.Fatalf("plan: conversion webhooks %+v, want widgets.example.com's service webhooks/conv:443", p.Webhooks)
		}
		return code, p
	}

	// Three widgets to convert: the live pod converts them in the decision.
	code, p := planJSON()
	if wh := p.Webhooks[0]; code != exitOK || !wh.Answered || wh.Conversions != 3 || wh.Failures != 0 || wh.Address != live {
		t.Errorf("plan with three widgets to convert: exit %d, %+v; want answered at %s, 3 converted", code, wh, live)
	}
	code, out, _ := runCLI(t, append([]string{"plan"}, conn...)...)
	if want := "ok: conversion webhook of widgets.example.com (service webhooks/conv:443) answered at " + live + ": 3 object(s) converted"; code != exitOK || !strings.Contains(out, want) {
		t.Errorf("plan: exit %d, no line %q\n%s", code, want, out)
	}

	// Migrated: nothing needs converting; the plan still checks the webhook answers.
	if code, _, out := migrateJSON(t, conn...); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	called := len(hook.called())
	code, p = planJSON()
	if wh := p.Webhooks[0]; code != exitOK || !wh.Answered || wh.Conversions != 0 || wh.Address != live {
		t.Errorf("plan with nothing to convert: exit %d, %+v; want answered at %s by a handshake", code, wh, live)
	}
	if n := len(hook.called()); n != called {
		t.Errorf("the plan sent %d conversion request(s) though nothing needed converting", n-called)
	}

	// The pod is gone: a warning while nothing needs it, a blocker once objects do.
	putWebhookService(c, port, []string{"127.0.0.2"})
	code, p = planJSON()
	if wh := p.Webhooks[0]; code != exitOK || wh.Answered || !strings.Contains(wh.Error, dead) || len(p.Blockers) != 0 {
		t.Errorf("plan, pod gone, nothing to convert: exit %d, %+v, blockers %+v; want not answered naming %s, no blocker", code, wh, p.Blockers, dead)
	}
	code, out, _ = runCLI(t, append([]string{"plan"}, conn...)...)
	if want := "warning: conversion webhook of widgets.example.com (service webhooks/conv:443) does not answer from here: "; code != exitOK || !strings.Contains(out, want) || !strings.Contains(out, "migrate will not call it; kube-apiserver will") {
		t.Errorf("plan, pod gone: exit %d, no line %q\n%s", code, want, out)
	}
	putOldWidgets(t, c, 3, 2)
	code, p = planJSON()
	if wh := p.Webhooks[0]; code != exitError || wh.Answered || wh.Failures != 2 || len(p.Blockers) != 1 || p.Blockers[0].Check != "conversion webhooks" {
		t.Errorf("plan, pod gone, two widgets to convert: exit %d, %+v, blockers %+v; want exit 1, 2 failures, the webhook blocker", code, wh, p.Blockers)
	}
}
