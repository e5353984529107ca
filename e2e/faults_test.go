package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// The KMS fault tests' keyspace: secrets written by ten kube-apiserver runs
// under a KMS v2 plugin, each run with its own data-key seed, one namespace
// a run (so the keys of a seed are together in key order, and a run reading
// them meets each seed, and so each call to the plugin, in turn).
const (
	kmsSeeds          = 10
	kmsSecretsPerSeed = 600
	kmsSecrets        = kmsSeeds * kmsSecretsPerSeed
	kmsPageSize       = "100"
)

// kmsCluster is an etcd with kmsSecrets secrets under a KMS v2 plugin whose
// key ID is kek-1 when they were written and kek-2 now: every secret is
// stale (the rotation a migrate does), and each seed needs the plugin.
func kmsCluster(t *testing.T) (*testcluster.Cluster, *kmstest.PluginV2, string) {
	t.Helper()
	c := testcluster.New(t, testetcd.Options{})
	plugin := kmstest.StartV2T(t, "kek-1")
	cfg := c.EncryptionConfig("kms.yaml", fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 3s}\n", plugin.Endpoint()), testcluster.Identity)
	seedKMSSecrets(t, c, cfg)
	if err := plugin.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	return c, plugin, cfg
}

// seedKMSSecrets writes the secrets, a fresh load of cfg (a kube-apiserver
// start: a new seed) per namespace.
func seedKMSSecrets(t *testing.T, c *testcluster.Cluster, cfg string) {
	t.Helper()
	ctx := context.Background()
	codec := c.Codec("", "", testcluster.SecretsGR)
	for s := 0; s < kmsSeeds; s++ {
		enc, err := encryption.Load(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var ops []clientv3.Op
		for i := 0; i < kmsSecretsPerSeed; i++ {
			ns, name := fmt.Sprintf("run%02d", s), fmt.Sprintf("s-%04d", i)
			key := "/registry/secrets/" + ns + "/" + name
			plain, err := runtime.Encode(codec, testcluster.Secret(ns, name, "pw-"+name))
			if err != nil {
				t.Fatal(err)
			}
			v, err := enc.Encrypt(ctx, testcluster.SecretsGR, key, plain)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(key, string(v)))
			if len(ops) == 100 {
				if _, err := c.Cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					t.Fatal(err)
				}
				ops = ops[:0]
			}
		}
		enc.Close()
	}
}

// kmsKeyIDs counts the secrets by the KMS v2 key ID of their envelope; a
// value that is not a KMS v2 envelope of the plugin "vault" (unencrypted,
// another provider, a body that does not parse) fails the test.
func kmsKeyIDs(t *testing.T, values map[string]string) map[string]int {
	t.Helper()
	out := map[string]int{}
	const prefix = "k8s:enc:kms:v2:vault:"
	for k, v := range values {
		if !strings.HasPrefix(v, prefix) {
			t.Errorf("%s: stored as %q..., not a KMS v2 envelope of vault", k, v[:min(len(v), 24)])
			continue
		}
		var o kmstypes.EncryptedObject
		if err := proto.Unmarshal([]byte(v[len(prefix):]), &o); err != nil || len(o.EncryptedData) == 0 {
			t.Errorf("%s: a KMS v2 envelope whose body does not parse (%v): half-written", k, err)
			continue
		}
		out[o.KeyID]++
	}
	return out
}

// tool runs the binary with the connection flags of c.
func toolOn(t *testing.T, c *testcluster.Cluster, args ...string) (string, string, int) {
	t.Helper()
	return runTool(t, append(args, "--endpoints", c.Srv.Endpoint)...)
}

// TestKMSPluginKilledMidMigrate: a rotation of 6,000 secrets of ten seeds
// under a KMS v2 plugin (its key ID moved from kek-1 to kek-2), the plugin
// killed when etcd shows the run's first write. The run stops within
// seconds (not one timeout per object left), exit 1, its stderr naming the
// plugin as the configuration names it and its socket; every secret is
// either as it was or a whole KMS v2 envelope under the new key ID, each
// one written journaled. With the plugin back, the same migrate completes
// and verify exits 0; a rollback of both runs gives back every byte.
func TestKMSPluginKilledMidMigrate(t *testing.T) {
	kmsKilledMidMigrate(t, "kek-2")
}

// TestKMSPluginBackWithNewKeyID: the same, the plugin coming back with
// another key ID (kek-3): the rerun writes every secret under it, the ones
// the first run wrote under kek-2 included, and verify exits 0.
func TestKMSPluginBackWithNewKeyID(t *testing.T) {
	kmsKilledMidMigrate(t, "kek-3")
}

func kmsKilledMidMigrate(t *testing.T, backWith string) {
	c, plugin, cfg := kmsCluster(t)
	before := secretValues(t, c)
	state := testcluster.StateDir(t)
	migrate := []string{"migrate", "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "1s", "--page-size", kmsPageSize}

	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	run := startTool(t, append(migrate, "--endpoints", c.Srv.Endpoint)...)
	select {
	case <-w.oursSeen:
	case <-run.done:
		t.Fatalf("the run ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the run seen:\n%s", run.stderr.String())
	}
	plugin.Stop()
	killed := time.Now()
	code := run.wait(t)
	took := time.Since(killed)
	w.stop()
	if code != 1 {
		t.Fatalf("exit %d, want 1 (stopped, nothing lost); stdout:\n%s", code, run.stdout.String())
	}
	if took > 20*time.Second {
		t.Errorf("the run took %s to stop after the plugin was killed: want seconds (the plugin's timeout is 3s)", took.Round(time.Millisecond))
	}
	stderr := run.stderr.String()
	want := fmt.Sprintf(`error: stopped: KMS v2 plugin "vault" at %s does not answer`, plugin.Endpoint())
	if !strings.Contains(stderr, want) || !strings.Contains(stderr, "journaled") || !strings.Contains(stderr, "run migrate again") {
		t.Errorf("stderr does not say %q, the journal and what to do:\n%s", want, stderr)
	}

	// Nothing half-written or unencrypted, every write journaled.
	after := secretValues(t, c)
	ids := kmsKeyIDs(t, after)
	journal := filepath.Join(state, "runs", "0001-migrate", undo.JournalFile)
	written := journaled(t, journal, before, after)
	if written == 0 || written == kmsSecrets || ids["kek-2"] != written || ids["kek-1"] != kmsSecrets-written {
		t.Errorf("%d of %d secrets rewritten, by key ID %v: want a run stopped part-way, what it wrote under kek-2", written, kmsSecrets, ids)
	}
	t.Logf("stopped %s after the plugin was killed, %d of %d secrets rewritten", took.Round(time.Millisecond), written, kmsSecrets)

	// The plugin back (its keys kept), perhaps with a new key ID.
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	if err := plugin.SetKeyID(backWith); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := toolOn(t, c, migrate...); code != 0 {
		t.Fatalf("migrate with the plugin back: exit %d\n%s", code, stderr)
	}
	if ids := kmsKeyIDs(t, secretValues(t, c)); ids[backWith] != kmsSecrets {
		t.Errorf("after the rerun, by key ID: %v; want all %d under %s", ids, kmsSecrets, backWith)
	}
	if stdout, stderr, code := toolOn(t, c, "verify", "--encryption-provider-config", cfg, "--resource", "secrets"); code != 0 {
		t.Fatalf("verify after the rerun: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, stderr, code := toolOn(t, c, "rollback", "--run", "0001-migrate", "--encryption-provider-config", cfg, "--liveness-window", "1s"); code != 0 {
		t.Fatalf("rollback of both runs: exit %d\n%s", code, stderr)
	}
	sameSecrets(t, before, secretValues(t, c))
}

// TestKMSPluginKilledMidRollback: rollback talks to the plugin only before
// its first write, decrypting each value it will put back (a rollback puts
// back stored bytes, still encrypted). The plugin killed at the first
// decryption of that check (the second seed's) stops the rollback within
// seconds, exit 1, its stderr naming the plugin and socket, nothing
// written; with the plugin back, the same rollback gives back every byte.
// Killed once the rollback writes, it changes nothing: the rollback
// completes, byte for byte.
func TestKMSPluginKilledMidRollback(t *testing.T) {
	c, plugin, cfg := kmsCluster(t)
	before := secretValues(t, c)
	if _, stderr, code := toolOn(t, c, "migrate", "--encryption-provider-config", cfg, "--target-version", "1.37", "--resource", "secrets", "--liveness-window", "1s"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, stderr)
	}
	migrated := secretValues(t, c)
	rollback := []string{"rollback", "--run", "0001-migrate", "--encryption-provider-config", cfg, "--liveness-window", "1s"}

	// Killed at the check's second data key.
	plugin.StopAtDecrypt(2)
	start := time.Now()
	_, stderr, code := toolOn(t, c, rollback...)
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("rollback, the plugin killed in its check: exit %d, want 1\n%s", code, stderr)
	}
	want := fmt.Sprintf(`KMS v2 plugin "vault" at %s does not answer`, plugin.Endpoint())
	if !strings.Contains(stderr, "error: rollback stopped before its first write") || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("stderr does not say the rollback stopped, %q, nothing written:\n%s", want, stderr)
	}
	if took > 30*time.Second {
		t.Errorf("the rollback took %s with the plugin killed: want seconds", took.Round(time.Millisecond))
	}
	sameSecrets(t, migrated, secretValues(t, c))

	// Back: the rollback again, and the plugin killed at its first write.
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	w := watchWrites(t, c.Cli, c.Revision(), "/registry/secrets/")
	run := startTool(t, append(rollback, "--endpoints", c.Srv.Endpoint)...)
	select {
	case <-w.oursSeen:
		plugin.Stop()
	case <-run.done:
		t.Fatalf("the rollback ended before its first write was seen (exit %d):\n%s", run.code, run.stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("no write of the rollback seen:\n%s", run.stderr.String())
	}
	if code := run.wait(t); code != 0 {
		t.Fatalf("rollback, the plugin killed at its first write: exit %d, want 0\n%s", code, run.stdout.String())
	}
	w.stop()
	sameSecrets(t, before, secretValues(t, c))
}
