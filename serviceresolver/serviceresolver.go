// Package serviceresolver resolves the Service a CRD's conversion webhook
// references to the addresses of its ready endpoints, offline, from the
// Services and EndpointSlices read from etcd. It uses kube-apiserver's own
// resolver, k8s.io/apiserver/pkg/util/proxy.ResolveEndpoint (what
// kube-apiserver calls with --enable-aggregator-routing: the Service's type
// and port checked, the port found by number, the EndpointSlices of the
// service by their kubernetes.io/service-name label, the service's primary IP
// family first, a ready endpoint's first address and the slice's port of the
// same name), fed by listers over those objects where kube-apiserver has
// informers. With every kube-apiserver stopped there is no cluster DNS and no
// Service proxy the tool can count on, but the webhook pods keep running and
// their IPs keep answering.
package serviceresolver

import (
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/util/proxy"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoveryv1listers "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// Resolver answers for the Services and EndpointSlices it was given.
type Resolver struct {
	services listersv1.ServiceLister
	slices   proxy.EndpointSliceGetter
}

// New builds a Resolver over services and slices (not modified).
func New(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) (*Resolver, error) {
	svcIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range services {
		if err := svcIndexer.Add(s); err != nil {
			return nil, fmt.Errorf("service %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	sliceIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range slices {
		if err := sliceIndexer.Add(s); err != nil {
			return nil, fmt.Errorf("endpointslice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	getter, err := proxy.NewEndpointSliceListerGetter(discoveryv1listers.NewEndpointSliceLister(sliceIndexer))
	if err != nil {
		return nil, err
	}
	return &Resolver{services: listersv1.NewServiceLister(svcIndexer), slices: getter}, nil
}

// Endpoints returns every ready endpoint ("host:port") of port of the service
// namespace/name, in the order kube-apiserver's resolver would pick them (at
// random, the service's primary IP family first): proxy.ResolveEndpoint is
// asked again with each endpoint it picked hidden, until it finds none. The
// error is ResolveEndpoint's first: no such Service, no such port, an
// unsupported type, no ready endpoint.
func (r *Resolver) Endpoints(namespace, name string, port int32) ([]string, error) {
	h := &hiding{getter: r.slices, hidden: map[string]bool{}}
	var out []string
	for {
		u, err := proxy.ResolveEndpoint(r.services, h, namespace, name, port)
		if err != nil {
			if len(out) > 0 && apierrors.IsServiceUnavailable(err) {
				return out, nil
			}
			return nil, err
		}
		if h.hidden[u.Host] {
			// Cannot happen (hidden endpoints are not offered); never loop.
			return out, nil
		}
		h.hidden[u.Host] = true
		out = append(out, u.Host)
	}
}

// hiding offers the EndpointSlices of a service without the endpoints already
// picked (an endpoint is hidden when its first address, with any of its
// slice's ports, was picked), and without endpoints that have no address
// (which EndpointSlice validation refuses, and proxy.RandomEndpoint would
// index).
type hiding struct {
	getter proxy.EndpointSliceGetter
	hidden map[string]bool
}

func (h *hiding) GetEndpointSlices(namespace, service string) ([]*discoveryv1.EndpointSlice, error) {
	slices, err := h.getter.GetEndpointSlices(namespace, service)
	if err != nil {
		return nil, err
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(slices))
	for _, s := range slices {
		c := s.DeepCopy()
		c.Endpoints = nil
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || h.picked(ep.Addresses[0], s.Ports) {
				continue
			}
			c.Endpoints = append(c.Endpoints, *ep.DeepCopy())
		}
		out = append(out, c)
	}
	return out, nil
}

func (h *hiding) picked(addr string, ports []discoveryv1.EndpointPort) bool {
	for _, p := range ports {
		if p.Port != nil && h.hidden[net.JoinHostPort(addr, strconv.Itoa(int(*p.Port)))] {
			return true
		}
	}
	return false
}
