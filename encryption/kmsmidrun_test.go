package encryption

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	kmsv2 "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2"

	"kube-etcd-migrate/internal/testrig/kmstest"
)

// TestKMSPluginStopsMidRun: a KMS v2 plugin that stops once the
// configuration is loaded (a run under way). kube-apiserver's transformer
// keeps what it has: a value under a data-key seed it already decrypted
// still decrypts, and new values are still encrypted under its current seed
// (a well-formed envelope the plugin's key opens once it is back). A value
// under a seed it has not decrypted needs the plugin: Decrypt fails within
// about the provider's timeout (1 s), with a DecryptError whose Plugin names
// the plugin and its endpoint as not answering (Unreachable), and a message
// that says so; the cause unwraps to the *KMSPluginError. A configuration
// loaded once the plugin is back reads every value, the one written while
// it was down included.
func TestKMSPluginStopsMidRun(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := secretsConfig(kmsV2Timeout("vault", plugin.Endpoint()), identityProvider)
	// Two kube-apiserver runs: a seed each.
	first, second := loadT(t, cfg), loadT(t, cfg)
	cached := encryptT(t, first, secretKey, testPlain)
	uncached := encryptT(t, second, otherKey, testPlain)
	if EnvelopeInfo(cached).Provider != ProviderKMSv2 {
		t.Fatalf("not a KMS v2 value: %+v", EnvelopeInfo(cached))
	}

	run := loadT(t, cfg) // the tool's
	if _, _, err := run.Decrypt(ctx, secretsGR, secretKey, cached); err != nil {
		t.Fatalf("plugin up: %v", err)
	}
	plugin.Stop()

	if pt, _, err := run.Decrypt(ctx, secretsGR, secretKey, cached); err != nil || string(pt) != string(testPlain) {
		t.Fatalf("a value under a seed already decrypted, plugin stopped: %v", err)
	}
	written, err := run.Encrypt(ctx, secretsGR, "/registry/secrets/default/new", testPlain)
	if err != nil {
		t.Fatalf("encrypt with the current data key, plugin stopped: %v", err)
	}

	start := time.Now()
	_, _, err = run.Decrypt(ctx, secretsGR, otherKey, uncached)
	took := time.Since(start)
	var de *DecryptError
	if !errors.As(err, &de) || de.Plugin == nil {
		t.Fatalf("a value under a seed not yet decrypted, plugin stopped: %v (%T), want a DecryptError naming the plugin", err, err)
	}
	if took > 5*time.Second {
		t.Errorf("the failure took %s: want about the provider's timeout (1s)", took)
	}
	p := de.Plugin
	if p.Name != "vault" || p.Endpoint != plugin.Endpoint() || p.Provider != ProviderKMSv2 || !p.Unreachable() {
		t.Errorf("plugin %+v (unreachable %v), want kms2 vault at %s, unreachable", p, p.Unreachable(), plugin.Endpoint())
	}
	var kp *KMSPluginError
	if !errors.As(err, &kp) || kp != p {
		t.Errorf("the error does not unwrap to its *KMSPluginError")
	}
	msg := err.Error()
	t.Logf("%s (after %s)", msg, took.Round(time.Millisecond))
	for _, want := range []string{otherKey, "kms2:vault", fmt.Sprintf("KMS v2 plugin %q at %s does not answer", "vault", plugin.Endpoint()), "decrypting the value's data key"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q", want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message is not one line")
	}

	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	back := loadT(t, cfg)
	for key, v := range map[string][]byte{secretKey: cached, otherKey: uncached, "/registry/secrets/default/new": written} {
		if pt, _, err := back.Decrypt(ctx, secretsGR, key, v); err != nil || string(pt) != string(testPlain) {
			t.Errorf("%s, plugin back: %v", key, err)
		}
	}
}

// TestKMSPluginRefusalIsTheValues: a plugin that answers, refusing (unhealthy,
// or a key ID it no longer has), is no plugin gone: the DecryptError has no
// Plugin, as for any value the configuration cannot read.
func TestKMSPluginRefusalIsTheValues(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := secretsConfig(kmsV2Timeout("vault", plugin.Endpoint()))
	old := encryptT(t, loadT(t, cfg), secretKey, testPlain)
	run := loadT(t, cfg)
	plugin.ForgetKeyID("kek-1")
	if err := plugin.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	_, _, err := run.Decrypt(ctx, secretsGR, secretKey, old)
	var de *DecryptError
	if !errors.As(err, &de) || de.Plugin != nil {
		t.Fatalf("a key ID the plugin no longer has: %v, want a DecryptError without Plugin", err)
	}
	t.Logf("%v", err)
}

// TestKMSWriteProviderStops: kube-apiserver's KMS v2 transformer keeps
// encrypting with its data key for a while after its plugin stopped
// answering status calls, then refuses every write. Encrypt's error then
// names the provider and the plugin and says the provider worked in this
// run (Stopped); a provider that never encrypted (its plugin down when the
// configuration was loaded) is not Stopped.
func TestKMSWriteProviderStops(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := secretsConfig(kmsV2Timeout("vault-expiring", plugin.Endpoint()))
	run := loadT(t, cfg)
	encryptT(t, run, secretKey, testPlain)
	plugin.Stop()
	later := time.Now().Add(time.Hour)
	defer kmsv2.SetNowFuncForTests("vault-expiring", func() time.Time { return later })()
	_, err := run.Encrypt(ctx, secretsGR, secretKey, testPlain)
	var ee *EncryptError
	if !errors.As(err, &ee) || !ee.Stopped || ee.Plugin == nil || ee.Plugin.Name != "vault-expiring" || ee.Plugin.Endpoint != plugin.Endpoint() {
		t.Fatalf("encrypt an hour after the plugin stopped: %v (%+v), want an EncryptError, stopped, naming the plugin", err, ee)
	}
	t.Log(err)

	never := loadT(t, cfg) // the plugin is down: no data key at all
	_, err = never.Encrypt(ctx, secretsGR, secretKey, testPlain)
	if !errors.As(err, &ee) || ee.Stopped {
		t.Fatalf("a provider that never encrypted: %v (%+v), want an EncryptError not Stopped", err, ee)
	}
}
