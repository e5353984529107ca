package serviceresolver

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func service(ns, name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       typ,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090)},
				{Name: "https", Port: 443, TargetPort: intstr.FromString("webhook")},
			},
		},
	}
}

func slice(ns, name, svc string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("metrics"), Port: ptr.To[int32](9090)},
			{Name: ptr.To("https"), Port: ptr.To(port)},
		},
		Endpoints: eps,
	}
}

func ep(addr string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// Every ready endpoint of the service's port 443 (the slices' port named like it),
// of every slice of the service, and nothing else.
func TestEndpoints(t *testing.T) {
	r, err := New(
		[]*corev1.Service{service("hooks", "conv", corev1.ServiceTypeClusterIP), service("hooks", "other", corev1.ServiceTypeClusterIP), service("hooks", "ext", corev1.ServiceTypeExternalName)},
		[]*discoveryv1.EndpointSlice{
			slice("hooks", "conv-a", "conv", 8443, ep("10.0.0.1", ptr.To(true)), ep("10.0.0.2", ptr.To(false)), ep("10.0.0.3", nil)),
			slice("hooks", "conv-b", "conv", 8443, ep("10.0.1.1", ptr.To(true)), discoveryv1.Endpoint{}),
			slice("hooks", "other-a", "other", 7443, ep("10.0.9.9", ptr.To(true))),
			slice("elsewhere", "conv-x", "conv", 8443, ep("10.9.9.9", ptr.To(true))),
			slice("hooks", "none", "empty", 8443, ep("10.0.2.1", ptr.To(false))),
		})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Endpoints("hooks", "conv", 443)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"10.0.0.1:8443", "10.0.0.3:8443", "10.0.1.1:8443"}; !slices.Equal(got, want) {
		t.Fatalf("Endpoints = %v, want %v", got, want)
	}
	if got, err := r.Endpoints("hooks", "other", 443); err != nil || !slices.Equal(got, []string{"10.0.9.9:7443"}) {
		t.Fatalf("Endpoints(other) = %v, %v", got, err)
	}
	for _, c := range []struct {
		name string
		port int32
		want string
	}{
		{"missing", 443, `"missing" not found`},
		{"conv", 8443, "no service port 8443"},
		{"ext", 443, "unsupported service type"},
	} {
		_, err := r.Endpoints("hooks", c.name, c.port)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Endpoints(%s, %d) error = %v, want %q", c.name, c.port, err, c.want)
		}
	}
	svcEmpty := service("hooks", "empty", corev1.ServiceTypeClusterIP)
	r2, err := New([]*corev1.Service{svcEmpty}, []*discoveryv1.EndpointSlice{slice("hooks", "none", "empty", 8443, ep("10.0.2.1", ptr.To(false)))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Endpoints("hooks", "empty", 443); err == nil || !strings.Contains(err.Error(), "no endpoints available") {
		t.Fatalf("Endpoints with no ready endpoint: %v", err)
	}
}
