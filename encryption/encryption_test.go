package encryption

import (
	"bytes"
	"context"
	"crypto/aes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/testrig/enctest"
	"kube-etcd-migrate/internal/testrig/kmstest"
)

var (
	secretsGR = schema.GroupResource{Resource: "secrets"}
	secretKey = "/registry/secrets/default/db-credentials"
	otherKey  = "/registry/secrets/default/copied-here"
	testPlain = []byte("k8s\x00\n\x0c\n\x02v1\x12\x06Secret password: " + enctest.PlainMarker)
)

// keyed renders an aescbc/aesgcm/secretbox provider with keys given as name, material pairs.
func keyed(provider string, nameMaterial ...string) string {
	var keys []string
	for i := 0; i+1 < len(nameMaterial); i += 2 {
		keys = append(keys, fmt.Sprintf("{name: %q, secret: %q}", nameMaterial[i], enctest.B64(nameMaterial[i+1])))
	}
	return fmt.Sprintf("%s: {keys: [%s]}", provider, strings.Join(keys, ", "))
}

func kmsV2(name, endpoint string) string {
	return fmt.Sprintf("kms: {apiVersion: v2, name: %s, endpoint: %q, timeout: 3s}", name, endpoint)
}

func kmsV1(name, endpoint string) string {
	return fmt.Sprintf("kms: {name: %s, endpoint: %q, cachesize: 10, timeout: 3s}", name, endpoint)
}

const identityProvider = "identity: {}"

type entry struct {
	resources []string
	providers []string
}

func configYAML(entries ...entry) string {
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n")
	for _, e := range entries {
		q := make([]string, len(e.resources))
		for i, r := range e.resources {
			q[i] = fmt.Sprintf("%q", r)
		}
		fmt.Fprintf(&b, "- resources: [%s]\n  providers:\n", strings.Join(q, ", "))
		for _, p := range e.providers {
			fmt.Fprintf(&b, "  - %s\n", p)
		}
	}
	return b.String()
}

func secretsConfig(providers ...string) string {
	return configYAML(entry{[]string{"secrets"}, providers})
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "encryption-config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadT(t *testing.T, yaml string) *Transformers {
	t.Helper()
	e, err := Load(context.Background(), writeConfig(t, yaml))
	if err != nil {
		t.Fatalf("Load: %v\n%s", err, yaml)
	}
	t.Cleanup(e.Close)
	return e
}

func encryptT(t *testing.T, e *Transformers, key string, plain []byte) []byte {
	t.Helper()
	ct, err := e.Encrypt(context.Background(), secretsGR, key, plain)
	if err != nil {
		t.Fatalf("Encrypt: %v", err)
	}
	return ct
}

// The reasons package decode gives a DecryptError (DecryptError.Reason).
const (
	reasonUndecryptable   = "undecryptable"
	reasonCorruptEnvelope = "corrupt-envelope"
)

// wantDecodeError checks err is a *DecryptError with reason for key, that its message
// contains every want, and that it contains no plaintext and no key material.
func wantDecodeError(t *testing.T, err error, key string, reason string, want ...string) {
	t.Helper()
	var de *DecryptError
	if !errors.As(err, &de) {
		t.Fatalf("got error %v (%T), want *encryption.DecryptError %s", err, err, reason)
	}
	if de.Reason() != reason {
		t.Errorf("reason %s, want %s (%v)", de.Reason(), reason, err)
	}
	if de.Key != key {
		t.Errorf("error names key %q, want %q", de.Key, key)
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not mention %q", msg, w)
		}
	}
	enctest.AssertNoSecrets(t, msg)
}

// TestRoundTripAndStale: for every provider, a value written by the first provider
// reads back as not stale; the same value read by a configuration whose first
// provider/key is something else reads back as stale and names the key it was
// written with — what kube-apiserver's transformer reports.
func TestRoundTripAndStale(t *testing.T) {
	v2 := kmstest.StartV2T(t, "kek-1")
	v1 := kmstest.StartV1T(t)
	cases := []struct {
		name, provider, keyName, prefix string
		fresh, rotated                  []string // providers of the writing and the rotated configuration
	}{
		{"identity", ProviderIdentity, "", "",
			[]string{identityProvider}, []string{keyed("aescbc", "key2", enctest.Material2), identityProvider}},
		{"aescbc", ProviderAESCBC, "key1", "k8s:enc:aescbc:v1:key1:",
			[]string{keyed("aescbc", "key1", enctest.Material1)}, []string{keyed("aescbc", "key2", enctest.Material2, "key1", enctest.Material1)}},
		{"aescbc-separate-providers", ProviderAESCBC, "key1", "k8s:enc:aescbc:v1:key1:",
			[]string{keyed("aescbc", "key1", enctest.Material1)}, []string{keyed("aescbc", "key2", enctest.Material2), keyed("aescbc", "key1", enctest.Material1)}},
		{"aesgcm", ProviderAESGCM, "key1", "k8s:enc:aesgcm:v1:key1:",
			[]string{keyed("aesgcm", "key1", enctest.Material1)}, []string{keyed("aesgcm", "key2", enctest.Material2, "key1", enctest.Material1)}},
		{"secretbox", ProviderSecretbox, "key1", "k8s:enc:secretbox:v1:key1:",
			[]string{keyed("secretbox", "key1", enctest.Material1)}, []string{keyed("secretbox", "key2", enctest.Material2, "key1", enctest.Material1)}},
		{"kms-v1", ProviderKMSv1, "kms1a", "k8s:enc:kms:v1:kms1a:",
			[]string{kmsV1("kms1a", v1.Endpoint())}, []string{keyed("aesgcm", "key2", enctest.Material2), kmsV1("kms1a", v1.Endpoint())}},
		{"kms-v2", ProviderKMSv2, "kms2a", "k8s:enc:kms:v2:kms2a:",
			[]string{kmsV2("kms2a", v2.Endpoint())}, []string{keyed("secretbox", "key2", enctest.Material2), kmsV2("kms2a", v2.Endpoint())}},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fresh := loadT(t, secretsConfig(c.fresh...))
			rotated := loadT(t, secretsConfig(c.rotated...))
			want := Info{Provider: c.provider, KeyName: c.keyName}
			if got := fresh.WriteProvider(secretsGR); got != want {
				t.Errorf("WriteProvider = %v, want %v", got, want)
			}

			ct := encryptT(t, fresh, secretKey, testPlain)
			if c.prefix == "" && !bytes.Equal(ct, testPlain) {
				t.Errorf("identity wrote %q, want the plaintext unchanged", ct)
			}
			if c.prefix != "" && (!bytes.HasPrefix(ct, []byte(c.prefix)) || bytes.Contains(ct, []byte(enctest.PlainMarker))) {
				t.Errorf("stored value %q: want prefix %q and no plaintext", ct, c.prefix)
			}
			if got := EnvelopeInfo(ct); got != want {
				t.Errorf("EnvelopeInfo = %v, want %v", got, want)
			}

			pt, info, err := fresh.Decrypt(ctx, secretsGR, secretKey, ct)
			if err != nil {
				t.Fatalf("Decrypt with the writing config: %v", err)
			}
			if !bytes.Equal(pt, testPlain) || info != want {
				t.Errorf("Decrypt with the writing config = %q, %+v; want the plaintext, %+v", pt, info, want)
			}

			pt, info, err = rotated.Decrypt(ctx, secretsGR, secretKey, ct)
			if err != nil {
				t.Fatalf("Decrypt with the rotated config: %v", err)
			}
			want.Stale = true
			if !bytes.Equal(pt, testPlain) || info != want {
				t.Errorf("Decrypt with the rotated config = %q, %+v; want the plaintext, %+v", pt, info, want)
			}
		})
	}
}

// TestKMSv2KeyIDRotationIsStale: after the plugin's key ID changes, a value written
// under the old key ID is stale for a freshly loaded configuration (kube-apiserver
// compares the value's key ID with the plugin's current one), and a value written
// after the rotation is not.
func TestKMSv2KeyIDRotationIsStale(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := secretsConfig(kmsV2("vault", plugin.Endpoint()))
	before := loadT(t, cfg)
	ct := encryptT(t, before, secretKey, testPlain)
	if _, info, err := before.Decrypt(ctx, secretsGR, secretKey, ct); err != nil || info.Stale {
		t.Fatalf("before rotation: %+v, %v; want not stale", info, err)
	}

	if err := plugin.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	after := loadT(t, cfg)
	pt, info, err := after.Decrypt(ctx, secretsGR, secretKey, ct)
	if err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	want := Info{Provider: ProviderKMSv2, KeyName: "vault", Stale: true}
	if info != want || !bytes.Equal(pt, testPlain) {
		t.Errorf("after rotation: %+v, want %+v and the plaintext", info, want)
	}

	ct2 := encryptT(t, after, secretKey, testPlain)
	if _, info, err := after.Decrypt(ctx, secretsGR, secretKey, ct2); err != nil || info.Stale {
		t.Errorf("value written under kek-2: %+v, %v; want not stale", info, err)
	}

	// The old key is gone from the plugin: the old value can no longer be read.
	plugin.ForgetKeyID("kek-1")
	fresh := loadT(t, cfg)
	_, _, err = fresh.Decrypt(ctx, secretsGR, secretKey, ct)
	wantDecodeError(t, err, secretKey, reasonUndecryptable, "kms2:vault")
}

// TestWildcardResourcesPickTheApiserversProvider: exact entries, "*." (core group),
// "*.apps" and "*.*" resolve as kube-apiserver resolves them. The provider the
// apiserver's own transformer writes (seen in the value's prefix) must be the one
// WriteProvider reports, and Decrypt must read it back as fresh.
func TestWildcardResourcesPickTheApiserversProvider(t *testing.T) {
	ctx := context.Background()
	e := loadT(t, configYAML(
		entry{[]string{"secrets", "deployments.apps"}, []string{keyed("aesgcm", "exact", enctest.Material1)}},
		entry{[]string{"*."}, []string{keyed("secretbox", "core", enctest.Material2)}},
		entry{[]string{"*.apps"}, []string{keyed("aescbc", "apps", enctest.Material3)}},
		entry{[]string{"*.*"}, []string{keyed("aesgcm", "everything", enctest.Material2)}},
	))
	cases := []struct {
		gr   schema.GroupResource
		want Info
	}{
		{schema.GroupResource{Resource: "secrets"}, Info{Provider: ProviderAESGCM, KeyName: "exact"}},
		{schema.GroupResource{Group: "apps", Resource: "deployments"}, Info{Provider: ProviderAESGCM, KeyName: "exact"}},
		{schema.GroupResource{Resource: "configmaps"}, Info{Provider: ProviderSecretbox, KeyName: "core"}},
		{schema.GroupResource{Group: "apps", Resource: "statefulsets"}, Info{Provider: ProviderAESCBC, KeyName: "apps"}},
		{schema.GroupResource{Group: "batch", Resource: "jobs"}, Info{Provider: ProviderAESGCM, KeyName: "everything"}},
		{schema.GroupResource{Group: "example.com", Resource: "widgets"}, Info{Provider: ProviderAESGCM, KeyName: "everything"}},
	}
	for _, c := range cases {
		if got := e.WriteProvider(c.gr); got != c.want {
			t.Errorf("%s: WriteProvider = %v, want %v", c.gr, got, c.want)
		}
		key := "/registry/" + c.gr.Resource + "/default/x"
		ct, err := e.Encrypt(ctx, c.gr, key, testPlain)
		if err != nil {
			t.Fatalf("%s: Encrypt: %v", c.gr, err)
		}
		if got := EnvelopeInfo(ct); got != c.want {
			t.Errorf("%s: kube-apiserver's transformer wrote %v, WriteProvider says %v", c.gr, got, c.want)
		}
		if _, info, err := e.Decrypt(ctx, c.gr, key, ct); err != nil || info != c.want {
			t.Errorf("%s: Decrypt = %+v, %v; want %+v", c.gr, info, err, c.want)
		}
	}

	// kube-apiserver refuses a file where a wildcard masks a later entry.
	_, err := Load(ctx, writeConfig(t, configYAML(
		entry{[]string{"*.apps"}, []string{identityProvider}},
		entry{[]string{"deployments.apps"}, []string{keyed("aescbc", "k", enctest.Material1)}},
	)))
	if err == nil || !strings.Contains(err.Error(), "masked") {
		t.Errorf("wildcard masking a later entry: err = %v, want the apiserver's 'masked' error", err)
	}
}

// TestRawStorageIsNeverEncrypted: kube-apiserver keeps the service range
// allocations and masterleases in plaintext even when "*.*" is encrypted (it
// refuses a configuration naming them: they have no REST API); the tool
// reads them as identity, writes them unchanged and refuses an encrypted
// one, as the apiserver's storage does.
func TestRawStorageIsNeverEncrypted(t *testing.T) {
	ctx := context.Background()
	e := loadT(t, configYAML(entry{[]string{"*.*"}, []string{keyed("aescbc", "everything", enctest.Material2)}}))
	for _, c := range []struct {
		gr  schema.GroupResource
		key string
	}{
		{schema.GroupResource{Resource: "servicenodeportallocations"}, "/registry/ranges/servicenodeports"},
		{schema.GroupResource{Resource: "serviceipallocations"}, "/registry/ranges/serviceips"},
		{schema.GroupResource{Resource: "apiServerIPInfo"}, "/registry/masterleases/192.0.2.1"},
	} {
		if got := e.WriteProvider(c.gr); got.Provider != ProviderIdentity {
			t.Errorf("%s: WriteProvider = %v, want identity", c.gr, got)
		}
		ct, err := e.Encrypt(ctx, c.gr, c.key, testPlain)
		if err != nil || !bytes.Equal(ct, testPlain) {
			t.Errorf("%s: Encrypt = %q, %v; want the plaintext", c.gr, ct, err)
		}
		pt, info, err := e.Decrypt(ctx, c.gr, c.key, testPlain)
		if err != nil || info != (Info{Provider: ProviderIdentity}) || !bytes.Equal(pt, testPlain) {
			t.Errorf("%s: Decrypt = %+v, %v; want the plaintext, identity, not stale", c.gr, info, err)
		}
		encrypted := encryptT(t, e, secretKey, testPlain)
		if _, _, err := e.Decrypt(ctx, c.gr, c.key, encrypted); err == nil {
			t.Errorf("%s: an encrypted value decrypted; kube-apiserver's storage refuses it", c.gr)
		}
	}
}

// TestResourceInTwoEntries: kube-apiserver accepts the same resource in two entries
// and reads with the providers of both (writes with the first entry's first).
func TestResourceInTwoEntries(t *testing.T) {
	ctx := context.Background()
	old := loadT(t, secretsConfig(keyed("aescbc", "old", enctest.Material1)))
	ct := encryptT(t, old, secretKey, testPlain)

	both := loadT(t, configYAML(
		entry{[]string{"secrets"}, []string{keyed("aesgcm", "new", enctest.Material2)}},
		entry{[]string{"configmaps", "secrets"}, []string{keyed("aescbc", "old", enctest.Material1)}},
	))
	if got, want := both.WriteProvider(secretsGR), (Info{Provider: ProviderAESGCM, KeyName: "new"}); got != want {
		t.Errorf("WriteProvider = %v, want %v", got, want)
	}
	pt, info, err := both.Decrypt(ctx, secretsGR, secretKey, ct)
	if err != nil {
		t.Fatalf("value written with the second entry's key: %v", err)
	}
	if want := (Info{Provider: ProviderAESCBC, KeyName: "old", Stale: true}); info != want || !bytes.Equal(pt, testPlain) {
		t.Errorf("Decrypt = %+v, want %+v and the plaintext", info, want)
	}
}

// TestFullKeyIsAuthenticatedData: a value copied under another etcd key does not
// decrypt with the providers that authenticate the key (aesgcm, KMS v1 and v2).
// aescbc and secretbox do not authenticate it in kube-apiserver either: the copy reads.
func TestFullKeyIsAuthenticatedData(t *testing.T) {
	ctx := context.Background()
	v2 := kmstest.StartV2T(t, "kek-1")
	v1 := kmstest.StartV1T(t)
	cases := []struct {
		name, provider string
		authenticated  bool
	}{
		{"aesgcm", keyed("aesgcm", "key1", enctest.Material1), true},
		{"kms", kmsV1("kms1a", v1.Endpoint()), true},
		{"kms2", kmsV2("kms2a", v2.Endpoint()), true},
		{"aescbc", keyed("aescbc", "key1", enctest.Material1), false},
		{"secretbox", keyed("secretbox", "key1", enctest.Material1), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := loadT(t, secretsConfig(c.provider))
			ct := encryptT(t, e, secretKey, testPlain)
			if _, _, err := e.Decrypt(ctx, secretsGR, secretKey, ct); err != nil {
				t.Fatalf("under its own key: %v", err)
			}
			pt, _, err := e.Decrypt(ctx, secretsGR, otherKey, ct)
			if !c.authenticated {
				if err != nil || !bytes.Equal(pt, testPlain) {
					t.Errorf("%s does not authenticate the key in kube-apiserver, copy should read: %v", c.name, err)
				}
				return
			}
			wantDecodeError(t, err, otherKey, reasonUndecryptable, EnvelopeInfo(ct).String())
		})
	}
}

func TestUndecryptable(t *testing.T) {
	ctx := context.Background()
	right := loadT(t, secretsConfig(keyed("aescbc", "key1", enctest.Material1)))
	wrong := loadT(t, secretsConfig(keyed("aescbc", "key1", enctest.Material2), identityProvider))
	cbc := enctest.CBCValue(t, "key1", enctest.Material1, testPlain)
	if pt, info, err := right.Decrypt(ctx, secretsGR, secretKey, cbc); err != nil || !bytes.Equal(pt, testPlain) || info.Stale {
		t.Fatalf("hand-built aescbc value does not read with the right key: %+v %v", info, err)
	}

	t.Run("wrong key material, same name", func(t *testing.T) {
		_, info, err := wrong.Decrypt(ctx, secretsGR, secretKey, cbc)
		wantDecodeError(t, err, secretKey, reasonUndecryptable, "aescbc:key1")
		if info.Provider != ProviderAESCBC || info.KeyName != "key1" {
			t.Errorf("info %+v, want aescbc key1", info)
		}
		for _, p := range []string{"aesgcm", "secretbox"} {
			ct := encryptT(t, loadT(t, secretsConfig(keyed(p, "key1", enctest.Material1))), secretKey, testPlain)
			_, _, err := loadT(t, secretsConfig(keyed(p, "key1", enctest.Material3))).Decrypt(ctx, secretsGR, secretKey, ct)
			wantDecodeError(t, err, secretKey, reasonUndecryptable, p+":key1")
		}
	})

	t.Run("key name not in config", func(t *testing.T) {
		v := enctest.CBCValue(t, "key7", enctest.Material1, testPlain)
		_, _, err := right.Decrypt(ctx, secretsGR, secretKey, v)
		wantDecodeError(t, err, secretKey, reasonUndecryptable, "aescbc:key7", "aescbc:key1")
	})

	t.Run("encrypted value, no config", func(t *testing.T) {
		none, err := Load(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		defer none.Close()
		_, _, err = none.Decrypt(ctx, secretsGR, secretKey, cbc)
		wantDecodeError(t, err, secretKey, reasonUndecryptable, "aescbc:key1", "--encryption-provider-config")
		// ... while plaintext reads, and is not stale.
		pt, info, err := none.Decrypt(ctx, secretsGR, secretKey, testPlain)
		if err != nil || !bytes.Equal(pt, testPlain) || info != (Info{Provider: ProviderIdentity}) {
			t.Errorf("plaintext with no config: %+v, %v", info, err)
		}
	})

	t.Run("plaintext, config without identity", func(t *testing.T) {
		_, _, err := right.Decrypt(ctx, secretsGR, secretKey, testPlain)
		wantDecodeError(t, err, secretKey, reasonUndecryptable, "identity", "aescbc:key1")
	})

	t.Run("other resource is identity", func(t *testing.T) {
		cm := schema.GroupResource{Resource: "configmaps"}
		if _, info, err := right.Decrypt(ctx, cm, "/registry/configmaps/default/c", testPlain); err != nil || info.Stale {
			t.Errorf("configmap with no entry: %+v, %v", info, err)
		}
		_, _, err := right.Decrypt(ctx, cm, "/registry/configmaps/default/c", cbc)
		wantDecodeError(t, err, "/registry/configmaps/default/c", reasonUndecryptable, "aescbc:key1")
	})
}

func TestCorruptEnvelope(t *testing.T) {
	ctx := context.Background()
	v2 := kmstest.StartV2T(t, "kek-1")
	v1 := kmstest.StartV1T(t)
	e := loadT(t, secretsConfig(
		keyed("aescbc", "key1", enctest.Material1),
		keyed("aesgcm", "key1", enctest.Material1),
		keyed("secretbox", "key1", enctest.Material1),
		kmsV1("kms1a", v1.Endpoint()),
		kmsV2("kms2a", v2.Endpoint()),
		identityProvider,
	))
	kms2 := encryptT(t, loadT(t, secretsConfig(kmsV2("kms2a", v2.Endpoint()))), secretKey, testPlain)
	kms2Prefix := len("k8s:enc:kms:v2:kms2a:")
	kms1 := encryptT(t, loadT(t, secretsConfig(kmsV1("kms1a", v1.Endpoint()))), secretKey, testPlain)

	cases := []struct {
		name  string
		value []byte
		want  []string
	}{
		{"unknown provider prefix", []byte("k8s:enc:foo:v1:key1:" + enctest.PlainMarker), []string{"k8s:enc:"}},
		{"bare reserved prefix", []byte("k8s:enc:"), nil},
		{"name not terminated", []byte("k8s:enc:aescbc:v1:key1"), []string{"aescbc"}},
		{"aescbc empty body", []byte("k8s:enc:aescbc:v1:key1:"), []string{"aescbc:key1"}},
		{"aescbc IV only (16 bytes)", []byte("k8s:enc:aescbc:v1:key1:0123456789abcdef"), []string{"aescbc:key1"}},
		{"aescbc not whole blocks", enctest.CBCValue(t, "key1", enctest.Material1, testPlain)[:len("k8s:enc:aescbc:v1:key1:")+40], []string{"aescbc:key1"}},
		{"aesgcm short", []byte("k8s:enc:aesgcm:v1:key1:0123456789"), []string{"aesgcm:key1"}},
		{"secretbox short", []byte("k8s:enc:secretbox:v1:key1:0123456789abcdef0123"), []string{"secretbox:key1"}},
		{"kms v1 no length", []byte("k8s:enc:kms:v1:kms1a:\x01"), []string{"kms:kms1a"}},
		{"kms v1 length past end", []byte("k8s:enc:kms:v1:kms1a:\x01\x00abc"), []string{"kms:kms1a"}},
		{"kms v1 cut", kms1[:len("k8s:enc:kms:v1:kms1a:")+20], []string{"kms:kms1a"}},
		{"kms v2 empty", kms2[:kms2Prefix], []string{"kms2:kms2a"}},
		{"kms v2 cut in the data field", kms2[:kms2Prefix+10], []string{"kms2:kms2a"}},
		{"kms v2 cut at half", kms2[:kms2Prefix+(len(kms2)-kms2Prefix)/2], []string{"kms2:kms2a"}},
		{"kms v2 garbage", append([]byte("k8s:enc:kms:v2:kms2a:"), bytes.Repeat([]byte{0xff}, 40)...), []string{"kms2:kms2a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pt, _, err := e.Decrypt(ctx, secretsGR, secretKey, c.value)
			if err == nil {
				t.Fatalf("decrypted a corrupt envelope to %d bytes", len(pt))
			}
			wantDecodeError(t, err, secretKey, reasonCorruptEnvelope, c.want...)
		})
	}

	// Every truncation of real KMS v2 / v1 / aescbc values: an error, never a panic or
	// a success, and always a typed reason.
	for name, v := range map[string][]byte{"kms2": kms2, "kms": kms1, "aescbc": enctest.CBCValue(t, "key1", enctest.Material1, testPlain)} {
		_, prefix := splitEnvelope(v)
		// AES-CBC (aescbc, and KMS v1's data after its length-prefixed DEK)
		// authenticates nothing: a value cut at a block boundary decrypts
		// whenever its last block happens to end in valid PKCS#7 padding
		// (about 1 in 256), as in kube-apiserver; the decoder then finds
		// the payload corrupt. Only there may a cut decrypt.
		cbcData := -1
		switch name {
		case "aescbc":
			cbcData = prefix
		case "kms":
			cbcData = prefix + 2 + int(v[prefix])<<8 + int(v[prefix+1])
		}
		for n := prefix; n < len(v); n++ {
			_, _, err := e.Decrypt(ctx, secretsGR, secretKey, v[:n])
			if err == nil && cbcData >= 0 && n-cbcData >= 2*aes.BlockSize && (n-cbcData)%aes.BlockSize == 0 {
				continue
			}
			var de *DecryptError
			if !errors.As(err, &de) || (de.Reason() != reasonCorruptEnvelope && de.Reason() != reasonUndecryptable) {
				t.Fatalf("%s cut to %d bytes: %v, want corrupt-envelope or undecryptable", name, n, err)
			}
			enctest.AssertNoSecrets(t, err.Error())
		}
	}
}

// TestKeyNameIsPrintable: a name in a garbage prefix is quoted in messages.
func TestKeyNameIsPrintable(t *testing.T) {
	e := loadT(t, secretsConfig(keyed("aescbc", "key1", enctest.Material1)))
	v := []byte("k8s:enc:aescbc:v1:bad\x1b[31mname\n:" + strings.Repeat("x", 32))
	_, _, err := e.Decrypt(context.Background(), secretsGR, secretKey, v)
	wantDecodeError(t, err, secretKey, reasonUndecryptable)
	if err != nil && strings.ContainsAny(err.Error(), "\x1b\n") {
		t.Errorf("control characters from the value reach the message: %q", err.Error())
	}
}

func TestPreflight(t *testing.T) {
	ctx := context.Background()
	grs := []schema.GroupResource{secretsGR, {Resource: "configmaps"}}

	t.Run("healthy", func(t *testing.T) {
		p := kmstest.StartV2T(t, "kek-1")
		e := loadT(t, secretsConfig(kmsV2("vault", p.Endpoint())))
		if err := e.Preflight(ctx, grs); err != nil {
			t.Errorf("healthy plugin: %v", err)
		}
	})
	check := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("Preflight passed with a broken KMS plugin")
		}
		for _, w := range []string{"secrets", "kms2:vault"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not name %q", err, w)
			}
		}
		if strings.Contains(err.Error(), "configmaps") {
			t.Errorf("error blames configmaps, which are not encrypted: %v", err)
		}
	}
	t.Run("unhealthy at load", func(t *testing.T) {
		p := kmstest.StartV2T(t, "kek-1")
		p.SetHealthy(false)
		e := loadT(t, secretsConfig(kmsV2("vault", p.Endpoint())))
		check(t, e.Preflight(ctx, grs))
	})
	t.Run("unhealthy after load", func(t *testing.T) {
		p := kmstest.StartV2T(t, "kek-1")
		e := loadT(t, secretsConfig(kmsV2("vault", p.Endpoint())))
		p.SetHealthy(false)
		check(t, e.Preflight(ctx, grs))
		p.SetHealthy(true)
		if err := e.Preflight(ctx, grs); err != nil {
			t.Errorf("plugin healthy again: %v", err)
		}
	})
	t.Run("stopped at load", func(t *testing.T) {
		p := kmstest.StartV2T(t, "kek-1")
		endpoint := p.Endpoint()
		p.Close()
		e := loadT(t, secretsConfig(kmsV2("vault", endpoint)))
		check(t, e.Preflight(ctx, grs))
	})
	t.Run("stopped after load", func(t *testing.T) {
		p := kmstest.StartV2T(t, "kek-1")
		e := loadT(t, secretsConfig(kmsV2("vault", p.Endpoint())))
		p.Close()
		check(t, e.Preflight(ctx, grs))
	})
	t.Run("kms v1 unhealthy", func(t *testing.T) {
		p := kmstest.StartV1T(t)
		e := loadT(t, secretsConfig(kmsV1("legacy", p.Endpoint())))
		if err := e.Preflight(ctx, grs); err != nil {
			t.Fatalf("healthy: %v", err)
		}
		p.SetHealthy(false)
		err := e.Preflight(ctx, grs)
		if err == nil || !strings.Contains(err.Error(), "secrets") || !strings.Contains(err.Error(), "kms:legacy") {
			t.Errorf("unhealthy KMS v1 plugin: %v", err)
		}
	})
}

// TestRawStoragePeerLeasesAndMessage: the peer endpoint leases
// (/registry/peerserverleases/, UnknownVersionInteroperabilityProxy) are raw
// storage too, and an encrypted raw-storage value is undecryptable with the
// reason named (kube-apiserver cannot read it either).
func TestRawStoragePeerLeasesAndMessage(t *testing.T) {
	ctx := context.Background()
	e := loadT(t, configYAML(entry{[]string{"*.*"}, []string{keyed("aescbc", "everything", enctest.Material2)}}))
	gr := schema.GroupResource{Resource: "apiServerPeerIPInfo"}
	if got := e.WriteProvider(gr); got.Provider != ProviderIdentity {
		t.Errorf("%s: WriteProvider = %v, want identity", gr, got)
	}
	_, _, err := e.Decrypt(ctx, gr, "/registry/peerserverleases/apiserver-1", encryptT(t, e, secretKey, testPlain))
	var de *DecryptError
	if !errors.As(err, &de) || de.Reason() != reasonUndecryptable || !strings.Contains(err.Error(), "unencrypted whatever its encryption configuration says") {
		t.Errorf("encrypted peer lease: %v, want undecryptable and why", err)
	}
}
