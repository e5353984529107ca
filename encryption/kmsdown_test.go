package encryption

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/testrig/enctest"
	"kube-etcd-migrate/internal/testrig/kmstest"
)

// kmsV2Timeout is kmsV2 with a short timeout: a stopped plugin costs a load and
// a probe that timeout each.
func kmsV2Timeout(name, endpoint string) string {
	return fmt.Sprintf("kms: {apiVersion: v2, name: %s, endpoint: %q, timeout: 1s}", name, endpoint)
}

// TestKMSPluginDown: with a KMS v2 plugin stopped, CheckKMSPlugins names that
// plugin and its endpoint once, as unreachable, and no other; a value it
// encrypted is undecryptable with an error naming the plugin and endpoint
// (not the apiserver's "got unexpected nil transformer"), while the
// configuration's other provider still reads its values. A plugin that
// answers unhealthy is named as not working; healthy plugins give nothing.
func TestKMSPluginDown(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	other := kmstest.StartV2T(t, "kek-9")
	endpoint := plugin.Endpoint()
	cfg := configYAML(
		entry{[]string{"secrets"}, []string{kmsV2Timeout("vault", endpoint), keyed("aescbc", "key1", enctest.Material1)}},
		entry{[]string{"configmaps"}, []string{kmsV2Timeout("other", other.Endpoint())}},
	)
	up := loadT(t, cfg)
	if errs := up.CheckKMSPlugins(ctx, nil); errs != nil {
		t.Fatalf("healthy plugins: %v", errs)
	}
	ct := encryptT(t, up, secretKey, testPlain)
	cbc := encryptT(t, loadT(t, secretsConfig(keyed("aescbc", "key1", enctest.Material1))), secretKey, testPlain)

	plugin.Close()
	down := loadT(t, cfg)
	errs := down.CheckKMSPlugins(ctx, nil)
	if len(errs) != 1 {
		t.Fatalf("CheckKMSPlugins with one plugin stopped: %v, want one error", errs)
	}
	e := errs[0]
	if e.Name != "vault" || e.Endpoint != endpoint || e.Provider != ProviderKMSv2 || !e.Unreachable() {
		t.Errorf("got %+v (unreachable %v), want kms2 vault at %s, unreachable", e, e.Unreachable(), endpoint)
	}
	w := e.ReadWarning()
	t.Logf("warning: %s", w)
	for _, want := range []string{`KMS v2 plugin "vault" at ` + endpoint + " is unreachable", "nothing it encrypted can be decrypted"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	if strings.Contains(w, "\n") {
		t.Errorf("warning is not one line: %q", w)
	}
	if errs := down.CheckKMSPlugins(ctx, []schema.GroupResource{{Resource: "configmaps"}}); errs != nil {
		t.Errorf("configmaps only (their plugin works): %v", errs)
	}

	_, info, err := down.Decrypt(ctx, secretsGR, secretKey, ct)
	wantDecodeError(t, err, secretKey, reasonUndecryptable, "kms2:vault", `KMS v2 plugin "vault" at `+endpoint+" could not decrypt it", "unreachable or unhealthy")
	t.Logf("per-object: %v", err)
	if strings.Contains(err.Error(), kmsv2NoState) {
		t.Errorf("error still gives the apiserver's bare text: %v", err)
	}
	if info.Provider != ProviderKMSv2 || info.KeyName != "vault" {
		t.Errorf("info %+v, want kms2 vault", info)
	}
	if pt, _, err := down.Decrypt(ctx, secretsGR, secretKey, cbc); err != nil || string(pt) != string(testPlain) {
		t.Errorf("aescbc value with the KMS plugin down: %v", err)
	}

	other.SetHealthy(false)
	errs = down.CheckKMSPlugins(ctx, []schema.GroupResource{{Resource: "configmaps"}})
	if len(errs) != 1 || errs[0].Name != "other" || errs[0].Unreachable() || !strings.Contains(errs[0].ReadWarning(), `KMS v2 plugin "other" at `+other.Endpoint()+" does not work") {
		t.Errorf("unhealthy plugin: %v", errs)
	}
}
