package customresource

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/rest"

	"kube-etcd-migrate/internal/textfmt"
)

// webhookConverter reproduces conversion.webhookConverter
// (apiextensions-apiserver/pkg/apiserver/conversion/webhook_converter.go) for single
// objects, with a context (the upstream one uses context.TODO()) and a timeout. The HTTP
// client is the apiserver's own: webhook.ClientManager.HookClient, configured as
// newWebhookConverterFactory does, so TLS (caBundle, server name <svc>.<ns>.svc for
// service references, HTTP/1.1), the request encoding and the response decoding are
// those of kube-apiserver.
type webhookConverter struct {
	name                     string
	restClient               *rest.RESTClient
	conversionReviewVersions []string
	timeout                  time.Duration

	// What the webhook did in this run (WebhookStatus).
	mu          sync.Mutex
	conversions int64
	failures    int64
	lastErr     string
	// answered: the webhook converted an object in this run (this
	// converter's or the field manager's CR converter's call): a failure to
	// reach it from then on is its going away (WebhookDownError).
	answered atomic.Bool
}

// count records the outcome of one conversion.
func (w *webhookConverter) count(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.failures++
		w.lastErr = err.Error()
		return
	}
	w.conversions++
	w.answered.Store(true)
}

// ServiceEndpoints gives the ready endpoints ("host:port") of a port of a
// Service, as kube-apiserver's resolver would pick among them
// (serviceresolver.Resolver, over the Services and EndpointSlices in etcd).
type ServiceEndpoints interface {
	Endpoints(namespace, name string, port int32) ([]string, error)
}

// ProbeTimeout bounds the TLS handshake with one endpoint of a webhook's Service.
const ProbeTimeout = 5 * time.Second

// probeRetry is how long a failure of every endpoint is given as the answer
// before they are tried again: one round of timeouts per object would make a
// run over many objects of a dead webhook take hours.
const probeRetry = 10 * time.Second

// offlineServiceResolver resolves the Service of one CRD's conversion webhook
// (a webhook.ServiceResolver, called by kube-apiserver's webhook client for
// every new connection) to an address reachable with every kube-apiserver
// stopped: the address the operator gave for it (Options.WebhookURLs), or else
// one of the ready endpoints of its EndpointSlices (Options.ServiceEndpoints),
// the first that completes a TLS handshake verified as kube-apiserver's client
// verifies it (the CRD's caBundle, server name <name>.<namespace>.svc), the one
// that answered last tried first.
type offlineServiceResolver struct {
	crd       string
	urls      map[string]string
	endpoints ServiceEndpoints
	caBundle  []byte
	hint      func(service string) string

	mu       sync.Mutex
	last     string // the endpoint that answered last
	failed   error  // every endpoint failed...
	failedAt time.Time
}

func (r *offlineServiceResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	key := namespace + "/" + name
	if addr, ok := r.urls[key]; ok {
		hostPort, _, err := ParseWebhookAddress(addr)
		if err != nil {
			return nil, fmt.Errorf("address for conversion webhook service %s: %w", key, err)
		}
		return &url.URL{Scheme: "https", Host: hostPort}, nil
	}
	if r.endpoints == nil {
		return nil, &WebhookUnreachableError{CRD: r.crd, Service: key, Port: port, Reason: "no address given for it and its Service was not read from etcd", Hint: r.hintFor(key)}
	}
	candidates, err := r.endpoints.Endpoints(namespace, name, port)
	if err != nil {
		return nil, &WebhookUnreachableError{CRD: r.crd, Service: key, Port: port, Reason: err.Error(), Hint: r.hintFor(key)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != nil && time.Since(r.failedAt) < probeRetry {
		return nil, r.failed
	}
	if i := slices.Index(candidates, r.last); i > 0 {
		candidates = append([]string{r.last}, slices.Delete(slices.Clone(candidates), i, i+1)...)
	}
	serverName := name + "." + namespace + ".svc"
	unreachable := &WebhookUnreachableError{CRD: r.crd, Service: key, Port: port, Hint: r.hintFor(key)}
	for _, addr := range candidates {
		// webhook.ServiceResolver gives no context: the handshake's own timeout bounds it.
		if err := probe(context.Background(), addr, serverName, r.caBundle); err != nil {
			unreachable.Attempts = append(unreachable.Attempts, WebhookAttempt{Address: addr, Err: err.Error()})
			continue
		}
		r.last, r.failed = addr, nil
		return &url.URL{Scheme: "https", Host: addr}, nil
	}
	r.failed, r.failedAt = unreachable, time.Now()
	return nil, unreachable
}

func (r *offlineServiceResolver) hintFor(service string) string {
	if r.hint == nil {
		return ""
	}
	return r.hint(service)
}

// probe completes a TLS handshake with addr as kube-apiserver's webhook client
// would: serverName checked against caBundle (the system's roots without one),
// HTTP/1.1 offered.
func probe(ctx context.Context, addr, serverName string, caBundle []byte) error {
	cfg := &tls.Config{ServerName: serverName, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	if len(caBundle) > 0 {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(caBundle) {
			return errors.New("the CRD's caBundle holds no PEM certificate")
		}
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: ProbeTimeout}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// WebhookStatus is what a CRD's conversion webhook did for this codec: how
// many objects it converted and how many conversions failed, the address that
// answered, and, when it converted nothing, whether it can be reached at all
// (a TLS handshake checked as kube-apiserver's client checks it).
type WebhookStatus struct {
	// Target is the webhook as the CRD names it: service NAMESPACE/NAME:PORT,
	// or its URL's host.
	Target string
	// Given is the address the operator gave for the service, if any.
	Given       string
	Answered    bool
	Address     string // the address that answered last
	Conversions int64
	Failures    int64
	// Err is why it did not answer, or the last failed conversion.
	Err string
}

// Webhook says what the CRD's conversion webhook did in this run; when it
// converted nothing it is probed (a TLS handshake with each ready endpoint of
// its Service, or its URL's host). ok is false for a CRD without one.
func (c *Codec) Webhook(ctx context.Context) (status WebhookStatus, ok bool) {
	if c.webhook == nil {
		return WebhookStatus{}, false
	}
	w := c.webhook
	w.mu.Lock()
	status.Conversions, status.Failures, status.Err = w.conversions, w.failures, w.lastErr
	w.mu.Unlock()

	cc := c.crd.Spec.Conversion.Webhook.ClientConfig
	if cc.Service != nil {
		port := int32(443)
		if cc.Service.Port != nil {
			port = *cc.Service.Port
		}
		key := cc.Service.Namespace + "/" + cc.Service.Name
		status.Target = fmt.Sprintf("service %s:%d", key, port)
		status.Given = c.resolver.urls[key]
		if status.Conversions > 0 {
			status.Answered = true
			c.resolver.mu.Lock()
			status.Address = c.resolver.last
			c.resolver.mu.Unlock()
			if addr, given := c.resolver.urls[key]; given {
				status.Address, _, _ = ParseWebhookAddress(addr)
			}
			return status, true
		}
		u, err := c.resolver.ResolveEndpoint(cc.Service.Namespace, cc.Service.Name, port)
		if err == nil {
			// An address the operator gave is not probed by the resolver.
			if _, given := c.resolver.urls[key]; given {
				err = probe(ctx, u.Host, cc.Service.Name+"."+cc.Service.Namespace+".svc", c.resolver.caBundle)
			}
		}
		if err != nil {
			status.Err = err.Error()
			return status, true
		}
		status.Answered, status.Address = true, u.Host
		return status, true
	}
	if cc.URL == nil {
		status.Err = "no service and no URL in the CRD's conversion webhook clientConfig"
		return status, true
	}
	u, err := url.Parse(*cc.URL)
	if err != nil {
		status.Target = *cc.URL
		status.Err = err.Error()
		return status, true
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	status.Target = "url host " + host
	if status.Conversions > 0 {
		status.Answered, status.Address = true, host
		return status, true
	}
	if err := probe(ctx, host, u.Hostname(), c.resolver.caBundle); err != nil {
		status.Err = err.Error()
		return status, true
	}
	status.Answered, status.Address = true, host
	return status, true
}

// WebhookAttempt is one endpoint tried and why it did not answer.
type WebhookAttempt struct {
	Address string
	Err     string
}

// WebhookUnreachableError says that the Service of a CRD's conversion webhook
// could not be reached: no endpoint found (Reason), or none that answered
// (Attempts).
type WebhookUnreachableError struct {
	CRD      string
	Service  string // namespace/name
	Port     int32
	Reason   string
	Attempts []WebhookAttempt
	// Hint is how the operator gives an address instead (the command's flag).
	Hint string
}

func (e *WebhookUnreachableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CRD %s: conversion webhook service %s (port %d) cannot be reached: ", e.CRD, e.Service, e.Port)
	if len(e.Attempts) == 0 {
		b.WriteString(e.Reason)
	} else {
		fmt.Fprintf(&b, "none of its %d ready endpoint(s) in etcd answered (", len(e.Attempts))
		for i, a := range e.Attempts {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s: %s", a.Address, a.Err)
		}
		b.WriteString(")")
	}
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// ParseWebhookAddress reads an address given for a conversion webhook's
// Service: https://HOST[:PORT][/PATH] or HOST:PORT[/PATH] (https assumed;
// port 443 by default with the scheme). It returns host:port and the path
// ("" when none is given: the CRD's path is used).
func ParseWebhookAddress(s string) (hostPort, path string, err error) {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", "", fmt.Errorf("%q: %w", s, err)
		}
		if u.Scheme != "https" {
			return "", "", fmt.Errorf("%q: want https (conversion webhooks are called over TLS)", s)
		}
		if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return "", "", fmt.Errorf("%q: want https://HOST:PORT[/PATH]", s)
		}
		hostPort = u.Host
		if u.Port() == "" {
			hostPort = net.JoinHostPort(u.Hostname(), "443")
		}
		return hostPort, u.Path, nil
	}
	hostPort, rest, found := strings.Cut(s, "/")
	if found {
		path = "/" + rest
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil || host == "" || port == "" {
		return "", "", fmt.Errorf("%q: want HOST:PORT[/PATH] or https://HOST:PORT[/PATH]", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	return hostPort, path, nil
}

// webhookClientConfigForCRD is conversion.webhookClientConfigForCRD.
func webhookClientConfigForCRD(crd *apiextensionsv1.CustomResourceDefinition) (*webhook.ClientConfig, error) {
	if crd.Spec.Conversion.Webhook == nil || crd.Spec.Conversion.Webhook.ClientConfig == nil {
		return nil, errors.New("strategy Webhook without webhook.clientConfig")
	}
	apiConfig := crd.Spec.Conversion.Webhook.ClientConfig
	caBundle := apiConfig.CABundle
	if len(caBundle) > 0 && len(bytes.TrimSpace(caBundle)) == 0 {
		// treat whitespace-only caBundle as empty
		caBundle = nil
	}
	ret := webhook.ClientConfig{
		Name:     fmt.Sprintf("conversion_webhook_for_%s", crd.Name),
		CABundle: caBundle,
	}
	if apiConfig.URL != nil {
		ret.URL = *apiConfig.URL
	}
	if apiConfig.Service != nil {
		ret.Service = &webhook.ClientConfigService{
			Name:      apiConfig.Service.Name,
			Namespace: apiConfig.Service.Namespace,
			Port:      443,
		}
		if apiConfig.Service.Port != nil {
			ret.Service.Port = *apiConfig.Service.Port
		}
		if apiConfig.Service.Path != nil {
			ret.Service.Path = *apiConfig.Service.Path
		}
	}
	return &ret, nil
}

func newWebhookConverter(crd *apiextensionsv1.CustomResourceDefinition, resolver *offlineServiceResolver, opts Options) (*webhookConverter, error) {
	cc, err := webhookClientConfigForCRD(crd)
	if err != nil {
		return nil, err
	}
	// newWebhookConverterFactory
	cm, err := webhook.NewClientManager(
		[]schema.GroupVersion{apiextensionsv1.SchemeGroupVersion, apiextensionsv1beta1.SchemeGroupVersion},
		apiextensionsv1beta1.AddToScheme,
		apiextensionsv1.AddToScheme,
	)
	if err != nil {
		return nil, err
	}
	authInfoResolver, err := webhook.NewDefaultAuthenticationInfoResolver("")
	if err != nil {
		return nil, err
	}
	cm.SetAuthenticationInfoResolver(authInfoResolver)
	cm.SetServiceResolver(resolver)
	restClient, err := cm.HookClient(*cc)
	if err != nil {
		return nil, err
	}
	timeout := opts.HTTPTimeout
	if timeout <= 0 {
		timeout = DefaultHTTPTimeout
	}
	return &webhookConverter{
		name:                     crd.Name,
		restClient:               restClient,
		conversionReviewVersions: crd.Spec.Conversion.Webhook.ConversionReviewVersions,
		timeout:                  timeout,
	}, nil
}

// WebhookDownError is a CRD's conversion webhook that converted objects
// earlier in the run and then could not be reached: a conversion failed and
// a TLS handshake with the webhook's address (its Service's endpoints, the
// address given for it, or its URL's host) failed after it. Every object of
// the CRD that needs converting would fail the same way, each after its own
// attempt: a run stops at it (pipeline.DependencyError) instead of reporting
// them unreadable.
type WebhookDownError struct {
	CRD string
	// Target is the webhook as the CRD names it: "service NAMESPACE/NAME:PORT"
	// or "url URL".
	Target string
	// Address is the address it was reached at last (host:port), "" when
	// not known.
	Address string
	// Err is the failed conversion's error; Probe the handshake's.
	Err   error
	Probe error
}

func (e *WebhookDownError) Error() string {
	at := ""
	if e.Address != "" {
		at = " at " + e.Address
	}
	// The handshake's failure says it all (the conversion's error wraps
	// the same failure of the connection, in the client's words): the
	// addresses tried and why each failed, without the advice on giving
	// an address (the webhook was reached before).
	why := textfmt.OneLine(e.Probe.Error())
	var unreachable *WebhookUnreachableError
	if errors.As(e.Probe, &unreachable) {
		var tried []string
		for _, a := range unreachable.Attempts {
			tried = append(tried, a.Address+": "+textfmt.OneLine(a.Err))
		}
		why = unreachable.Reason
		if len(tried) > 0 {
			why = strings.Join(tried, "; ")
		}
	}
	return fmt.Sprintf("CRD %s: conversion webhook %s%s stopped answering: it converted objects earlier in this run, then a conversion failed and a TLS handshake with it fails (%s)",
		e.CRD, e.Target, at, why)
}

func (e *WebhookDownError) Unwrap() error { return e.Err }

// webhookDown is a *WebhookDownError when err, a failed conversion by the
// CRD's webhook, is the webhook gone: it answered earlier in this run and a
// TLS handshake with it fails now. nil when it never answered (every object
// is then reported as it fails, as before any run could know it) or answers
// the handshake (the failure is the object's).
func (c *Codec) webhookDown(ctx context.Context, err error) error {
	if c.webhook == nil || !c.webhook.answered.Load() || ctx.Err() != nil {
		return nil
	}
	target, addr, perr := c.reach(ctx)
	if perr == nil {
		return nil
	}
	return &WebhookDownError{CRD: c.name, Target: target, Address: addr, Err: err, Probe: perr}
}

// reach is a TLS handshake with the CRD's conversion webhook as
// kube-apiserver's client makes it, at the address the converters would use
// now: the address given for its Service, else the endpoint that answered
// last (then any other ready one, as the resolver tries them), else its
// URL's host. It gives the webhook as the CRD names it and the address tried.
func (c *Codec) reach(ctx context.Context) (target, addr string, err error) {
	cc := c.crd.Spec.Conversion.Webhook.ClientConfig
	if cc.Service != nil {
		port := int32(443)
		if cc.Service.Port != nil {
			port = *cc.Service.Port
		}
		key := cc.Service.Namespace + "/" + cc.Service.Name
		target = fmt.Sprintf("service %s:%d", key, port)
		serverName := cc.Service.Name + "." + cc.Service.Namespace + ".svc"
		if given, ok := c.resolver.urls[key]; ok {
			addr, _, err = ParseWebhookAddress(given)
			if err == nil {
				err = probe(ctx, addr, serverName, c.resolver.caBundle)
			}
			return target, addr, err
		}
		c.resolver.mu.Lock()
		addr = c.resolver.last
		c.resolver.mu.Unlock()
		if addr != "" && probe(ctx, addr, serverName, c.resolver.caBundle) == nil {
			return target, addr, nil
		}
		u, err := c.resolver.ResolveEndpoint(cc.Service.Namespace, cc.Service.Name, port)
		if err != nil {
			return target, addr, err
		}
		return target, u.Host, nil
	}
	if cc.URL == nil {
		return "", "", errors.New("no service and no URL in the CRD's conversion webhook clientConfig")
	}
	target = "url " + *cc.URL
	u, err := url.Parse(*cc.URL)
	if err != nil {
		return target, "", err
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "443")
	}
	return target, addr, probe(ctx, addr, u.Hostname(), c.resolver.caBundle)
}
