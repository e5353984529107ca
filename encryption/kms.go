package encryption

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/envelope"
	envelopekmsv2 "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2"
	kmsservice "k8s.io/kms/pkg/service"

	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/textfmt"
)

// kmsPlugin is how messages name a KMS plugin: KMS v2 plugin "vault" at unix:///... .
func kmsPlugin(provider, name, endpoint string) string {
	v := "v2"
	if provider == ProviderKMSv1 {
		v = "v1"
	}
	return fmt.Sprintf("KMS %s plugin %q at %s", v, name, endpoint)
}

// Preflight checks that each resource's write provider works before anything is
// written: it encrypts a probe value under a key that is never stored and reads it
// back, and for a KMS provider it also asks the plugin itself (KMS v2: Status must
// be healthy with a key ID, then a wrap/unwrap; KMS v1: a wrap/unwrap, as
// kube-apiserver's healthz does). The transformer alone is not enough: a KMS v2
// transformer keeps writing with its cached DEK for minutes after the plugin went
// down or unhealthy. Errors name the provider and the resources it is written for.
func (e *Transformers) Preflight(ctx context.Context, grs []schema.GroupResource) error {
	type target struct {
		gr       schema.GroupResource
		provider apiserverconfig.ProviderConfiguration
		grs      []string
	}
	var order []string
	targets := map[string]*target{}
	for _, gr := range grs {
		w := e.WriteProvider(gr)
		if w.Provider == ProviderIdentity {
			continue
		}
		t := targets[w.String()]
		if t == nil {
			t = &target{gr: gr, provider: e.resourceProviders(gr)[0]}
			targets[w.String()] = t
			order = append(order, w.String())
		}
		t.grs = append(t.grs, gr.String())
	}
	var errs []error
	probe := []byte("kube-etcd-migrate preflight")
	for _, name := range order {
		t := targets[name]
		var err error
		if t.provider.KMS != nil {
			err = probeKMS(ctx, t.provider.KMS)
		}
		if err == nil {
			key := "/kube-etcd-migrate/preflight/" + t.gr.String()
			var ct []byte
			ct, err = e.transformer(t.gr).TransformToStorage(ctx, probe, value.DefaultContext(key))
			if err == nil {
				var pt []byte
				pt, _, err = e.transformer(t.gr).TransformFromStorage(ctx, ct, value.DefaultContext(key))
				if err == nil && !bytes.Equal(pt, probe) {
					err = errors.New("probe value did not read back")
				}
				if err == nil {
					e.encrypted.Store(name, true)
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("write provider %s for %s does not work: %w", name, strings.Join(t.grs, ", "), err))
		}
	}
	return errors.Join(errs...)
}

// KMSPluginError is a KMS plugin of the configuration that does not work, as
// probeKMS found: unreachable, or answering unhealthy or with an error.
type KMSPluginError struct {
	Provider string // ProviderKMSv2 or ProviderKMSv1
	Name     string // the provider's name in the configuration
	Endpoint string // the endpoint dialled (after any mapping)
	// Op is what the plugin was asked for when it failed in the middle of a
	// run ("decrypting the value's data key", "encrypting"); "" for a probe.
	Op string
	// Timeout is the provider's timeout (0: not known), for the message.
	Timeout time.Duration
	Err     error
}

func (e *KMSPluginError) Error() string {
	msg := truncate(textfmt.OneLine(e.Err.Error()), 300)
	switch {
	case e.Op != "" && e.Unreachable():
		why := "the connection to it failed"
		if status.Code(e.Err) == codes.DeadlineExceeded || errors.Is(e.Err, context.DeadlineExceeded) {
			why = "no answer within its timeout"
			if e.Timeout > 0 {
				why += " of " + e.Timeout.String()
			}
		}
		return fmt.Sprintf("%s does not answer (%s: %s: %s)", kmsPlugin(e.Provider, e.Name, e.Endpoint), e.Op, why, msg)
	case e.Op != "":
		return fmt.Sprintf("%s: %s: %s", kmsPlugin(e.Provider, e.Name, e.Endpoint), e.Op, msg)
	}
	return kmsPlugin(e.Provider, e.Name, e.Endpoint) + ": " + msg
}

func (e *KMSPluginError) Unwrap() error { return e.Err }

// Unreachable reports whether the plugin did not answer at all (no socket, no
// server, or no answer within the provider's timeout), as opposed to answering
// unhealthy or with an error.
func (e *KMSPluginError) Unreachable() bool {
	switch status.Code(e.Err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(e.Err, context.DeadlineExceeded)
}

// ReadWarning is the one line for an operator of a read-only run: which plugin,
// where, what it said, and that nothing it encrypted can be read.
func (e *KMSPluginError) ReadWarning() string {
	state := "does not work"
	if e.Unreachable() {
		state = "is unreachable"
	}
	return fmt.Sprintf("%s %s (%s): nothing it encrypted can be decrypted, those objects are reported undecryptable", kmsPlugin(e.Provider, e.Name, e.Endpoint), state, truncate(textfmt.OneLine(e.Err.Error()), 300))
}

// CheckKMSPlugins asks every KMS plugin that the providers of grs read with
// (grs nil: of every resource in the configuration) whether it works, as
// Preflight asks the write provider's (probeKMS: KMS v2 Status, then a
// wrap/unwrap; KMS v1 a wrap/unwrap), each plugin once, at the same time,
// on connections of their own. kube-apiserver's KMS v2 transformer has
// nothing to decrypt with until its plugin has answered a healthy Status,
// and then fails each value with a message that names no plugin: this names
// it once. The result is in configuration order, nil when all work.
func (e *Transformers) CheckKMSPlugins(ctx context.Context, grs []schema.GroupResource) []*KMSPluginError {
	var providers []apiserverconfig.ProviderConfiguration
	if grs == nil {
		for _, rc := range e.config.Resources {
			providers = append(providers, rc.Providers...)
		}
	} else {
		for _, gr := range grs {
			providers = append(providers, e.resourceProviders(gr)...)
		}
	}
	var plugins []*apiserverconfig.KMSConfiguration
	seen := map[string]bool{}
	for _, p := range providers {
		if p.KMS == nil {
			continue
		}
		id := p.KMS.APIVersion + "\x00" + p.KMS.Name + "\x00" + p.KMS.Endpoint
		if !seen[id] {
			seen[id] = true
			plugins = append(plugins, p.KMS)
		}
	}
	errs := make([]error, len(plugins))
	var wg sync.WaitGroup
	for i, cfg := range plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer crash.Recover("asking KMS plugin "+cfg.Name, &errs[i])
			errs[i] = probeKMS(ctx, cfg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if p, ok := err.(*crash.Panic); ok {
			panic(p) // to the caller's goroutine, the command's (crash.New)
		}
	}
	var out []*KMSPluginError
	for _, err := range errs {
		var perr *KMSPluginError
		if errors.As(err, &perr) {
			out = append(out, perr)
		}
	}
	return out
}

// probeKMS asks a KMS plugin directly whether it works, on a connection of its
// own; a failure is a *KMSPluginError.
func probeKMS(ctx context.Context, cfg *apiserverconfig.KMSConfiguration) error {
	if err := askKMS(ctx, cfg); err != nil {
		return &KMSPluginError{Provider: providerInfo(apiserverconfig.ProviderConfiguration{KMS: cfg}).Provider, Name: cfg.Name, Endpoint: cfg.Endpoint, Err: err}
	}
	return nil
}

// askKMS is probeKMS's conversation with the plugin.
func askKMS(ctx context.Context, cfg *apiserverconfig.KMSConfiguration) error {
	timeout := 3 * time.Second
	if cfg.Timeout != nil && cfg.Timeout.Duration > 0 {
		timeout = cfg.Timeout.Duration
	}
	pctx, cancel := context.WithCancel(ctx) // closes the connection
	defer cancel()
	dek := []byte("kube-etcd-migrate-preflight-dek!")
	if cfg.APIVersion != "v2" {
		svc, err := envelope.NewGRPCService(pctx, cfg.Endpoint, timeout)
		if err != nil {
			return err
		}
		ct, err := svc.Encrypt(dek)
		if err != nil {
			return fmt.Errorf("encrypt: %w", err)
		}
		pt, err := svc.Decrypt(ct)
		if err != nil {
			return fmt.Errorf("decrypt: %w", err)
		}
		if !bytes.Equal(pt, dek) {
			return errors.New("decrypt did not return what was encrypted")
		}
		return nil
	}
	svc, err := envelopekmsv2.NewGRPCService(pctx, cfg.Endpoint, cfg.Name, timeout)
	if err != nil {
		return err
	}
	st, err := svc.Status(pctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if st.Healthz != "ok" {
		return fmt.Errorf("status is %q, not ok", truncate(st.Healthz, 200))
	}
	if st.Version != envelopekmsv2.KMSAPIVersionv2 && st.Version != envelopekmsv2.KMSAPIVersionv2beta1 {
		return fmt.Errorf("API version %q, want %s", truncate(st.Version, 50), envelopekmsv2.KMSAPIVersionv2)
	}
	if _, err := envelopekmsv2.ValidateKeyID(st.KeyID); err != nil {
		return fmt.Errorf("status key ID: %w", err)
	}
	uid := "kube-etcd-migrate-preflight"
	enc, err := svc.Encrypt(pctx, uid, dek)
	if err != nil {
		return fmt.Errorf("encrypt: %w", err)
	}
	pt, err := svc.Decrypt(pctx, uid, &kmsservice.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: enc.KeyID, Annotations: enc.Annotations})
	if err != nil {
		return fmt.Errorf("decrypt: %w", err)
	}
	if !bytes.Equal(pt, dek) {
		return errors.New("decrypt did not return what was encrypted")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
