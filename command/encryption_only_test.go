package command

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/verify"
)

// TestEncryptionOnlyCLI is a key rotation with --encryption-only on real etcd,
// where some objects are also stale by storage version or media type: migrate
// moves every object of an encrypted resource to the new key (unencrypted ones
// included) and nothing else: each value's plaintext after decryption is byte
// for byte what it was, so version-stale objects stay in their old version.
// verify --encryption-only then exits 0; plain verify still exits 3 for the
// version- and media-type-stale objects.
func TestEncryptionOnlyCLI(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	config := func(name string, keys ...string) string {
		var b strings.Builder
		b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, configmaps, deviceclasses.resource.k8s.io]\n  providers:\n  - aescbc:\n      keys:\n")
		for _, k := range keys { // each name has its own key material
			fmt.Fprintf(&b, "      - name: %s\n        secret: %s\n", k, base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{k[len(k)-1]}, 32)))
		}
		b.WriteString("  - identity: {}\n")
		path := filepath.Join(c.Dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	oldCfg := config("old.yaml", "key1")
	newCfg := config("new.yaml", "key2", "key1") // key2 new, first

	dc := testcluster.DeviceClassGR
	rotated := map[string]bool{} // keys migrate --encryption-only must rewrite
	for i := range 3 {
		key := fmt.Sprintf("/registry/secrets/ns1/s%d", i)
		c.Put(key, testcluster.SecretsGR, testcluster.Secret("ns1", fmt.Sprintf("s%d", i), fmt.Sprintf("pw-%d", i)), "", "", oldCfg)
		rotated[key] = true
	}
	c.Put("/registry/configmaps/ns1/plain", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "plain"), "", "", "") // identity -> key2
	rotated["/registry/configmaps/ns1/plain"] = true
	c.Put("/registry/configmaps/ns1/json", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "json"), "", decode.MediaTypeJSON, oldCfg) // media type and key
	rotated["/registry/configmaps/ns1/json"] = true
	c.Put("/registry/deviceclasses/old-key1", dc, testcluster.DeviceClass("old-key1"), "1.34", "", oldCfg) // v1beta2 and key
	rotated["/registry/deviceclasses/old-key1"] = true
	c.Put("/registry/deviceclasses/old-key2", dc, testcluster.DeviceClass("old-key2"), "1.34", "", newCfg) // v1beta2 only
	c.Put("/registry/configmaps/ns1/current", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "current"), "", "", newCfg)
	keys := []string{"/registry/secrets/ns1/s0", "/registry/secrets/ns1/s1", "/registry/secrets/ns1/s2", "/registry/configmaps/ns1/plain",
		"/registry/configmaps/ns1/json", "/registry/deviceclasses/old-key1", "/registry/deviceclasses/old-key2", "/registry/configmaps/ns1/current"}

	enc := c.LoadEncryption(newCfg)
	grOf := func(key string) schema.GroupResource {
		switch {
		case strings.Contains(key, "/secrets/"):
			return testcluster.SecretsGR
		case strings.Contains(key, "/configmaps/"):
			return testcluster.ConfigMapsGR
		}
		return dc
	}
	type stored struct {
		plain  []byte
		modRev int64
		enc    encryption.Info
	}
	read := func() map[string]stored {
		out := map[string]stored{}
		for _, key := range keys {
			value, rev, _ := c.Get(key)
			plain, info, err := enc.Decrypt(context.Background(), grOf(key), key, value)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			out[key] = stored{plain: plain, modRev: rev, enc: info}
		}
		return out
	}
	before := read()

	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	verifyJSON := func(args ...string) (int, verify.Report) {
		t.Helper()
		code, out, stderr := runCLI(t, append(append([]string{"verify", "-o", "json"}, args...), conn...)...)
		var r verify.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("verify %v: exit %d, report is not JSON: %v\n%s%s", args, code, err, out, stderr)
		}
		return code, r
	}
	if code, r := verifyJSON("--encryption-only"); code != exitStale || r.Summary.Stale != int64(len(rotated)) || !r.EncryptionOnly {
		t.Fatalf("verify --encryption-only before: exit %d, %d stale, want exit %d, %d stale", code, r.Summary.Stale, exitStale, len(rotated))
	}
	if code, _, stderr := runCLI(t, append([]string{"migrate", "--encryption-only", "--record"}, conn...)...); code != exitUsage {
		t.Fatalf("migrate --encryption-only --record: exit %d, want %d\n%s", code, exitUsage, stderr)
	}

	code, out, stderr := runCLI(t, append([]string{"migrate", "--encryption-only", "-o", "json"}, conn...)...)
	if code != 0 {
		t.Fatalf("migrate --encryption-only: exit %d\n%s%s", code, out, stderr)
	}
	var sum migrate.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, out)
	}
	if sum.Summary.Rewritten != int64(len(rotated)) || sum.Summary.Failed != 0 {
		t.Fatalf("migrate --encryption-only rewrote %d (failed %d), want %d", sum.Summary.Rewritten, sum.Summary.Failed, len(rotated))
	}

	after := read()
	for _, key := range keys {
		b, a := before[key], after[key]
		if !bytes.Equal(a.plain, b.plain) {
			t.Errorf("%s: the decrypted value changed (%d bytes before, %d after)", key, len(b.plain), len(a.plain))
		}
		if a.enc.String() != "aescbc:key2" || a.enc.Stale {
			t.Errorf("%s: stored under %s (stale %v), want aescbc:key2", key, a.enc, a.enc.Stale)
		}
		if rewritten := a.modRev != b.modRev; rewritten != rotated[key] {
			t.Errorf("%s: rewritten %v, want %v", key, rewritten, rotated[key])
		}
	}
	// Still in their old version and media type: the bytes say so.
	for _, key := range []string{"/registry/deviceclasses/old-key1", "/registry/deviceclasses/old-key2"} {
		if !bytes.Contains(after[key].plain, []byte("resource.k8s.io/v1beta2")) {
			t.Errorf("%s: no longer stored as resource.k8s.io/v1beta2", key)
		}
	}
	if !json.Valid(bytes.TrimSpace(after["/registry/configmaps/ns1/json"].plain)) {
		t.Errorf("the JSON ConfigMap is no longer stored as JSON")
	}

	if code, r := verifyJSON("--encryption-only"); code != 0 || r.Summary.Stale != 0 {
		t.Errorf("verify --encryption-only after: exit %d, %d stale, want 0", code, r.Summary.Stale)
	}
	code, r := verifyJSON()
	if code != exitStale || r.Summary.Stale != 3 {
		t.Errorf("verify after: exit %d, %d stale, want exit %d with the 2 DeviceClasses and the JSON ConfigMap", code, r.Summary.Stale, exitStale)
	}
	for _, rr := range r.Resources {
		for reason := range rr.StaleBy {
			if reason == "encryption" {
				t.Errorf("%s: still stale by encryption", rr.Name())
			}
		}
	}
}
