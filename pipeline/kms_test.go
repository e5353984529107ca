package pipeline

import (
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestSetupWarnsOfStoppedKMSPlugin: Setup with the KMS v2 plugin of secrets
// stopped succeeds (other providers may read the rest) with one warning naming
// the plugin and its endpoint; a run over configmaps only, which it does not
// encrypt, has no warning; with the plugin up there is none.
func TestSetupWarnsOfStoppedKMSPlugin(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	endpoint := plugin.Endpoint()
	cfg := filepath.Join(t.TempDir(), "encryption-config.yaml")
	yaml := fmt.Sprintf("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 1s}\n  - identity: {}\n", endpoint)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	setup := func(resources ...string) []string {
		t.Helper()
		env, err := Setup(ctx, cli, Config{Target: target.Input{EncryptionConfig: cfg}, Resources: resources})
		if err != nil {
			t.Fatalf("Setup %v: %v", resources, err)
		}
		env.Close()
		return env.Warnings
	}
	if w := setup(); len(w) != 0 {
		t.Errorf("plugin up: warnings %q", w)
	}
	plugin.Close()
	w := setup()
	if len(w) != 1 || !strings.Contains(w[0], `KMS v2 plugin "vault" at `+endpoint+" is unreachable") || strings.Contains(w[0], "\n") {
		t.Errorf("plugin stopped: warnings %q, want one line naming %s as unreachable", w, endpoint)
	}
	if w := setup("configmaps"); len(w) != 0 {
		t.Errorf("configmaps only: warnings %q", w)
	}
}
