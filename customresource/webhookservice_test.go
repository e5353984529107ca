package customresource

import (
	"bytes"
	"context"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/serviceresolver"
)

// convertOne decodes a v1beta1 widget and encodes it to the storage version v1.
func convertOne(t *testing.T, c *Codec) ([]byte, error) {
	t.Helper()
	u, _, err := c.Decode(apiserverJSON(t, storedWidget("v1beta1", map[string]interface{}{"oldName": "n"})))
	if err != nil {
		t.Fatal(err)
	}
	return c.Encode(context.Background(), u)
}

func lastPath(hook *convWebhook) string {
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if len(hook.requestPaths) == 0 {
		return ""
	}
	return hook.requestPaths[len(hook.requestPaths)-1]
}

// A Service-referenced webhook is dialled at the address given in WebhookURLs
// (with or without https://, its path in place of the CRD's when it has one), and
// its certificate is verified for <svc>.<ns>.svc against the caBundle.
func TestWebhookServiceReference(t *testing.T) {
	hook := &convWebhook{}
	srv, ca := newServiceTLSServer(t, hook, "conv.webhooks.svc")
	cc := apiextensionsv1.WebhookClientConfig{
		Service:  &apiextensionsv1.ServiceReference{Namespace: "webhooks", Name: "conv", Path: ptr.To("/crd-convert"), Port: ptr.To[int32](443)},
		CABundle: ca,
	}
	// Without an address nor endpoints: the codec reads, the conversion fails naming
	// the CRD, the service and the hint.
	c := mustCodec(t, webhookCRD("v1", cc, []string{"v1"}), Options{WebhookHint: func(s string) string { return "HINT " + s }})
	if _, err := convertOne(t, c); err == nil || !strings.Contains(err.Error(), "CRD widgets.stable.example.com: conversion webhook service webhooks/conv (port 443) cannot be reached") || !strings.Contains(err.Error(), "HINT webhooks/conv") {
		t.Fatalf("conversion without an address for the service: %v", err)
	}
	hp := hostPort(t, srv)
	for addr, wantPath := range map[string]string{
		srv.URL:                       "/crd-convert",
		hp:                            "/crd-convert",
		hp + "/given":                 "/given",
		srv.URL + "/given/too":        "/given/too",
		"https://" + hp + "/":         "/",
		"https://" + hp + "/v1/conv/": "/v1/conv", // as kube-apiserver's client calls a path
	} {
		c := mustCodec(t, webhookCRD("v1", cc, []string{"v1"}), Options{WebhookURLs: map[string]string{"webhooks/conv": addr}})
		out, err := convertOne(t, c)
		if err != nil {
			t.Fatalf("Encode via %s: %v", addr, err)
		}
		if !bytes.Contains(out, []byte(`"newName":"n"`)) {
			t.Fatalf("not converted via %s: %s", addr, out)
		}
		if got := lastPath(hook); got != wantPath {
			t.Fatalf("via %s the webhook was called at %q, want %q", addr, got, wantPath)
		}
	}
	for _, bad := range []string{"http://" + hp, "127.0.0.1", "https://user@" + hp, hp + "?x=1", "127.0.0.1:0", ":8443"} {
		if _, err := NewCodec(webhookCRD("v1", cc, []string{"v1"}), Options{WebhookURLs: map[string]string{"webhooks/conv": bad}}); err == nil || !strings.Contains(err.Error(), "webhooks/conv") {
			t.Errorf("address %q accepted: %v", bad, err)
		}
	}
}

func tcpPort(t *testing.T, srv *httptest.Server) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

func webhookService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "webhooks", Name: "conv"},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}},
		},
	}
}

func webhookSlice(name string, port int32, addrs ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "webhooks", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "conv"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(port)}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return es
}

// Without an address given, a Service-referenced webhook is reached through the
// ready endpoints of its EndpointSlices: each is tried (a TLS handshake checked
// against the caBundle for <svc>.<ns>.svc) until one answers, by both the
// tool's converter and the CR converter of the no-op update; when none answers,
// the error names every address tried and why.
func TestWebhookServiceEndpoints(t *testing.T) {
	hook := &convWebhook{}
	good, ca := newServiceTLSServer(t, hook, "conv.webhooks.svc")
	impostor := &convWebhook{}
	wrongName, _ := newServiceTLSServer(t, impostor, "other.webhooks.svc") // another CA, another name
	goodPort, wrongPort := tcpPort(t, good), tcpPort(t, wrongName)
	// 127.0.0.2 has no listener on the good server's port (it listens on 127.0.0.1 only).
	dead := net.JoinHostPort("127.0.0.2", strconv.Itoa(int(goodPort)))
	cc := apiextensionsv1.WebhookClientConfig{
		Service:  &apiextensionsv1.ServiceReference{Namespace: "webhooks", Name: "conv", Path: ptr.To("/crd-convert"), Port: ptr.To[int32](443)},
		CABundle: ca,
	}

	r, err := serviceresolver.New([]*corev1.Service{webhookService()}, []*discoveryv1.EndpointSlice{
		webhookSlice("conv-a", goodPort, "127.0.0.2", "127.0.0.1"),
		webhookSlice("conv-b", wrongPort, "127.0.0.1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	crd := webhookCRD("v1", cc, []string{"v1"})
	for i := 0; i < 5; i++ { // the endpoints come in a random order
		c := mustCodec(t, crd, Options{ServiceEndpoints: r})
		out, err := convertOne(t, c)
		if err != nil {
			t.Fatalf("Encode through the service's endpoints: %v", err)
		}
		if !bytes.Contains(out, []byte(`"newName":"n"`)) || lastPath(hook) != "/crd-convert" {
			t.Fatalf("not converted by the service's endpoint at the CRD's path (%q): %s", lastPath(hook), out)
		}
	}
	impostor.mu.Lock()
	if impostor.calls != 0 {
		t.Fatalf("the endpoint whose certificate is not the service's was called %d times", impostor.calls)
	}
	impostor.mu.Unlock()

	// None answers.
	r, err = serviceresolver.New([]*corev1.Service{webhookService()}, []*discoveryv1.EndpointSlice{
		webhookSlice("conv-a", goodPort, "127.0.0.2"),
		webhookSlice("conv-b", wrongPort, "127.0.0.1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	c := mustCodec(t, crd, Options{ServiceEndpoints: r, WebhookHint: func(s string) string { return "give one for " + s }})
	_, err = convertOne(t, c)
	wrong := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(wrongPort)))
	for _, want := range []string{
		"CRD widgets.stable.example.com: conversion webhook service webhooks/conv (port 443) cannot be reached: none of its 2 ready endpoint(s) in etcd answered",
		dead + ": dial tcp " + dead + ": connect: connection refused",
		wrong + ": tls: failed to verify certificate",
		"give one for webhooks/conv",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("no endpoint answers: error %v\nwant it to say %q", err, want)
		}
	}

	// No ready endpoint, no Service: kube-apiserver's resolver says why.
	r, err = serviceresolver.New([]*corev1.Service{webhookService()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c = mustCodec(t, crd, Options{ServiceEndpoints: r})
	if _, err := convertOne(t, c); err == nil || !strings.Contains(err.Error(), `webhooks/conv (port 443) cannot be reached: no endpoints available for service "conv"`) {
		t.Fatalf("no endpoints: %v", err)
	}
	r, err = serviceresolver.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c = mustCodec(t, crd, Options{ServiceEndpoints: r})
	if _, err := convertOne(t, c); err == nil || !strings.Contains(err.Error(), `webhooks/conv (port 443) cannot be reached: service "conv" not found`) {
		t.Fatalf("no service: %v", err)
	}
}
