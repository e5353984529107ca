package pipeline

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/serviceresolver"
)

var (
	servicesResource       = schema.GroupResource{Resource: "services"}
	endpointSlicesResource = schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}
)

// webhookEndpoints resolves the Services of CRDs' conversion webhooks
// (customresource.ServiceEndpoints) from the Services and EndpointSlices read
// from etcd; a Service that could not be read answers with why.
type webhookEndpoints struct {
	resolver  *serviceresolver.Resolver
	errs      map[string]error   // namespace/name: the Service could not be read
	sliceErrs map[string][]error // namespace: EndpointSlices that could not be read
}

func (w *webhookEndpoints) Endpoints(namespace, name string, port int32) ([]string, error) {
	if err := w.errs[namespace+"/"+name]; err != nil {
		return nil, err
	}
	if w.resolver == nil {
		return nil, fmt.Errorf("service %s/%s was not read from etcd", namespace, name)
	}
	eps, err := w.resolver.Endpoints(namespace, name, port)
	if err != nil && len(w.sliceErrs[namespace]) > 0 {
		errs := w.sliceErrs[namespace]
		return nil, fmt.Errorf("%w (%d EndpointSlice(s) of namespace %s could not be read, e.g. %v)", err, len(errs), namespace, errs[0])
	}
	return eps, err
}

// loadWebhookEndpoints reads, at the run's revision, the Service of every
// CRD's conversion webhook that references one (and has no address in
// Config.WebhookURLs) and the EndpointSlices of its namespace, decoded and
// decrypted as every other object, converted to their v1 types as
// kube-apiserver's informers hold them. An object that cannot be read makes
// its Service's resolution fail with the reason, not the run: only the
// conversions that need it fail.
func (e *Env) loadWebhookEndpoints(ctx context.Context, crds []*apiextensionsv1.CustomResourceDefinition) (*webhookEndpoints, error) {
	w := &webhookEndpoints{errs: map[string]error{}, sliceErrs: map[string][]error{}}
	type ref struct{ namespace, name string }
	var refs []ref
	seen := map[ref]bool{}
	for _, crd := range crds {
		conv := crd.Spec.Conversion
		if conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook == nil || conv.Webhook.ClientConfig == nil || conv.Webhook.ClientConfig.Service == nil {
			continue
		}
		s := conv.Webhook.ClientConfig.Service
		r := ref{s.Namespace, s.Name}
		if _, given := e.Config.WebhookURLs[s.Namespace+"/"+s.Name]; given || seen[r] {
			continue
		}
		seen[r] = true
		refs = append(refs, r)
	}
	if len(refs) == 0 {
		return w, nil
	}
	sort.Slice(refs, func(i, j int) bool {
		return refs[i].namespace+"/"+refs[i].name < refs[j].namespace+"/"+refs[j].name
	})
	var services []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	namespaces := map[string]bool{}
	for _, r := range refs {
		key := r.namespace + "/" + r.name
		prefix, err := e.Resolver.KeyPrefix(servicesResource, r.namespace)
		if err != nil {
			return nil, err
		}
		kv, found, err := e.Source.Get(ctx, prefix+r.name, e.Config.Revision)
		if err != nil {
			return nil, fmt.Errorf("read service %s of a conversion webhook: %w", key, err)
		}
		if !found {
			w.errs[key] = fmt.Errorf("service %s is not in etcd (%s)", key, prefix+r.name)
			continue
		}
		svc := &corev1.Service{}
		if err := e.decodeV1(ctx, kv, svc); err != nil {
			w.errs[key] = err
			continue
		}
		services = append(services, svc)
		namespaces[r.namespace] = true
	}
	for ns := range namespaces {
		prefix, err := e.Resolver.KeyPrefix(endpointSlicesResource, ns)
		if err != nil {
			return nil, err
		}
		opts := etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: e.Config.PageSize, Revision: e.Config.Revision, KeepRevision: e.Config.Revision > 0}
		_, err = e.Source.Scan(ctx, opts, func(page []etcdscan.KV) error {
			for _, kv := range page {
				es := &discoveryv1.EndpointSlice{}
				if err := e.decodeV1(ctx, kv, es); err != nil {
					// It may have held the only ready endpoint: said
					// when a service of its namespace has none.
					w.sliceErrs[ns] = append(w.sliceErrs[ns], err)
					continue
				}
				slices = append(slices, es)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read endpointslices under %s for conversion webhooks: %w", prefix, err)
		}
	}
	r, err := serviceresolver.New(services, slices)
	if err != nil {
		return nil, err
	}
	w.resolver = r
	return w, nil
}

// decodeV1 decodes kv as kube-apiserver reads it and converts it to out's
// (v1) type.
func (e *Env) decodeV1(ctx context.Context, kv etcdscan.KV, out any) error {
	obj, err := e.Decoder.Decode(ctx, kv)
	if err != nil {
		return fmt.Errorf("%s: %w", kv.Key, err)
	}
	if err := legacyscheme.Scheme.Convert(obj.Internal, out, nil); err != nil {
		return fmt.Errorf("%s: convert to v1: %w", kv.Key, err)
	}
	return nil
}
