package command

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/plan"
	"kube-etcd-migrate/undo"
)

// TestPlanNamesEveryBlocker: the plan, run as an operator runs it before the
// outage, against a cluster seeded to fail four of migrate's checks at once
// (the rewrite past etcd's quota, a full filesystem for the undo, the KMS
// plugin of the write provider down, a CRD whose conversion webhook does not
// answer): one line per blocker with its remedy, exit 1, nothing written.
func TestPlanNamesEveryBlocker(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{QuotaBackendBytes: 8 << 20})
	plugin := kmstest.StartV2T(t, "kek-1")
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", fmt.Sprintf("  - kms: {apiVersion: v2, name: vault, endpoint: %q, timeout: 1s}\n", plugin.Endpoint()), testcluster.AESCBC("key1", 1))
	c.Put("/registry/secrets/ns/s", testcluster.SecretsGR, testcluster.Secret("ns", "s", "pw"), "", "", oldCfg)
	// 5 MiB of Events stored as JSON (stale by media type) in an 8 MiB quota.
	for i := 0; i < 100; i++ {
		e := testcluster.Event("ns", fmt.Sprintf("e-%03d", i))
		e.Message = strings.Repeat("x", 48<<10)
		c.Put(fmt.Sprintf("/registry/events/ns/e-%03d", i), testcluster.EventsGR, e, "", "application/json", "")
	}
	crd := seed.WidgetCRD()
	url := "https://127.0.0.1:1/convert"
	crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: &url}, ConversionReviewVersions: []string{"v1"}}}
	c.Put("/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", decode.CRDGroupResource, crd, "", "", "")
	w, err := json.Marshal(map[string]any{"apiVersion": "example.com/v1beta1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "ns", "uid": "uid-w", "creationTimestamp": "2023-11-14T22:13:20Z", "generation": 1},
		"spec":     map[string]any{"size": 1}})
	if err != nil {
		t.Fatal(err)
	}
	c.PutRaw("/registry/example.com/widgets/ns/w", append(w, '\n'))
	plugin.Close()
	fsDir := smallFilesystem(t, 96<<20)
	if err := os.WriteFile(filepath.Join(fsDir, "filler"), make([]byte, 95<<20), 0o600); err != nil {
		t.Fatal(err)
	}

	before, rev := c.Raw(), c.Revision()
	code, out, stderr := runCLI(t, "plan", "--state-dir", filepath.Join(fsDir, "state"), "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37")
	t.Logf("plan: exit %d\n%s%s", code, out, stderr)
	if code != exitError {
		t.Fatalf("plan: exit %d, want %d", code, exitError)
	}
	for _, want := range []string{
		"BLOCKER (etcd quota): the rewrite would add about",
		"BLOCKER (disk space): not enough disk space on the filesystem of " + fsDir,
		// The library's errors, as the command line says them.
		"rerun with --compact-history to compact the history",
		"or give a --state-dir on another filesystem",
		"BLOCKER (encryption providers): write encryption provider:",
		"BLOCKER (conversion webhooks): 1 object(s) could not be converted, e.g. /registry/example.com/widgets/ns/w",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the plan does not say %q", want)
		}
	}
	if n := strings.Count(out, "BLOCKER ("); n != 4 || strings.Count(out, "; remedy: ") != 4 {
		t.Errorf("%d blocker lines, want 4, each with its remedy", n)
	}
	if c.Revision() != rev {
		t.Fatalf("the plan wrote to etcd (revision %d -> %d)", rev, c.Revision())
	}
	for k, v := range c.Raw() {
		if before[k] != v {
			t.Fatalf("%s changed", k)
		}
	}
	if _, err := os.Stat(filepath.Join(fsDir, "state")); err == nil {
		t.Error("the plan created the state directory")
	}
}

// TestPlanMemberDownThenProceeds: on a 3-member etcd, a member down is a
// blocker named with its endpoint; with the member back the plan exits 0
// and migrate, with the same flags, then succeeds.
func TestPlanMemberDownThenProceeds(t *testing.T) {
	ec := testetcd.StartClusterT(t, 3)
	c := testcluster.NewOn(t, ec.ClientT(t))
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(50, oldCfg)
	// The tool is given the members that answer (kube-apiserver's manifest names
	// its own node's); it finds the others in the member list.
	down := (ec.Leader() + 1) % 3
	var eps []string
	for i, m := range ec.Members {
		if i != down {
			eps = append(eps, m.URL)
		}
	}
	flags := []string{"--endpoints", strings.Join(eps, ","), "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	ec.Members[down].Kill()
	code, out, stderr := runCLI(t, append([]string{"plan"}, flags...)...)
	if code != exitError || !strings.Contains(out, "BLOCKER (etcd members): member "+ec.Members[down].Name()+" ("+ec.Members[down].URL+") does not answer") || !strings.Contains(out, "etcdctl member remove") {
		t.Fatalf("plan with a member down: exit %d\n%s%s", code, out, stderr)
	}
	if err := ec.Members[down].Restart(); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runCLI(t, append([]string{"plan", "-o", "json"}, flags...)...)
	var p plan.Plan
	if code != exitOK || json.Unmarshal([]byte(out), &p) != nil || !p.Proceeds() || p.Summary.Stale != 100 || len(p.Members) != 3 || p.Estimate.Seconds <= 0 {
		t.Fatalf("plan on a healthy cluster: exit %d\n%s%s", code, out, stderr)
	}
	// Far below etcd's quota, the undo fits without compaction.
	if p.Undo == nil || p.Undo.NeedsCompaction || p.Undo.RollbackBytes <= 0 || p.Undo.RoomAfter < p.Undo.RollbackBytes {
		t.Fatalf("the plan's undo %+v: want a rollback that fits", p.Undo)
	}
	// With no undo kept, the plan says nothing of a rollback.
	code, out, stderr = runCLI(t, append([]string{"plan", "-o", "json", "--no-undo"}, flags...)...)
	var noUndo plan.Plan
	if code != exitOK || json.Unmarshal([]byte(out), &noUndo) != nil || noUndo.Undo != nil {
		t.Fatalf("plan --no-undo: exit %d, undo %+v\n%s%s", code, noUndo.Undo, out, stderr)
	}
	if code, out, stderr := runCLI(t, append([]string{"migrate", "--liveness-window", "500ms"}, flags...)...); code != exitOK {
		t.Fatalf("migrate after the plan: exit %d\n%s%s", code, out, stderr)
	}
}

// TestPlanStateDirBlockers: a state directory others may read, or one a run
// holds, is a blocker of the plan, as it would refuse migrate.
func TestPlanStateDirBlockers(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.SeedMany(5, oldCfg)
	state := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	flags := []string{"plan", "--state-dir", state, "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	code, out, stderr := runCLI(t, flags...)
	if code != exitError || !strings.Contains(out, "BLOCKER (state directory): state directory "+state+" has mode -rwxr-xr-x") || !strings.Contains(out, "chmod 700") {
		t.Fatalf("plan with a shared state directory: exit %d\n%s%s", code, out, stderr)
	}
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	held, err := undo.StateDir(state).Open()
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runCLI(t, flags...)
	held.Close()
	if code != exitError || !strings.Contains(out, "BLOCKER (state directory): state directory "+state+" is in use by another run (pid ") {
		t.Fatalf("plan beside a held state directory: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runCLI(t, flags...); code != exitOK {
		t.Fatalf("plan with the state directory free: exit %d\n%s%s", code, out, stderr)
	}
}

// TestPlanEstimatesARange: plan, before the outage, says how long migrate
// with the same flags would take as a range, part by part, from what it
// timed here and what etcd reports of its own costs (its metrics), with
// --compact-history the compactions too; it writes nothing to etcd (the
// revision is unchanged: no snapshot sample, no metrics read, writes).
func TestPlanEstimatesARange(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.SeedMany(200, oldCfg)
	flags := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}
	before, rev := c.Raw(), c.Revision()

	code, out, stderr := runCLI(t, append([]string{"plan"}, flags...)...)
	t.Logf("plan:\n%s%s", out, stderr)
	if code != exitOK {
		t.Fatalf("plan: exit %d", code)
	}
	if !regexp.MustCompile(`(?m)^estimate: migrate takes [0-9.]+–[0-9.]+ (s|min) on this machine`).MatchString(out) {
		t.Errorf("the plan does not give a range for migrate")
	}
	for _, part := range []string{"setup", "snapshot", "decisions and writes", "compactions", "end"} {
		if !regexp.MustCompile(`(?m)^  ` + part + ` +[0-9.]+–[0-9.]+ (s|min): `).MatchString(out) {
			t.Errorf("the plan does not give the part %q", part)
		}
	}
	if !strings.Contains(out, "its applies take") || !strings.Contains(out, "the 15s liveness window") {
		t.Errorf("the plan does not say etcd's apply time and the window")
	}

	code, out, stderr = runCLI(t, append([]string{"plan", "-o", "json", "--compact-history"}, flags...)...)
	var p plan.Plan
	if code != exitOK || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("plan -o json: exit %d\n%s%s", code, out, stderr)
	}
	e := p.Estimate
	if e.Low <= 0 || e.High < e.Low || e.Seconds < e.Low || e.Seconds > e.High || e.LivenessSeconds != 15 || e.DecideSeconds <= 0 || e.Basis == "" || len(e.Parts) != 5 {
		t.Errorf("the estimate: %+v", e)
	}
	// The writes wait for the window: the range starts after it.
	if e.Low < e.LivenessSeconds {
		t.Errorf("the range %.1f–%.1fs starts before the %.0fs window ends", e.Low, e.High, e.LivenessSeconds)
	}
	if e.Etcd == nil || e.Etcd.Error != "" || e.Etcd.ApplyPerWrite <= 0 || e.Etcd.WALFsync <= 0 || e.Etcd.Keys < 200 || !strings.HasPrefix(e.Etcd.Metrics, c.Srv.URL) {
		t.Errorf("etcd's costs, from its metrics: %+v", e.Etcd)
	}
	if e.Parts[3].Name != "compactions" || !strings.Contains(e.Parts[3].Basis, "compaction(s)") || e.Compactions[1] < e.Compactions[0] {
		t.Errorf("with --compact-history: compactions %v, %+v", e.Compactions, e.Parts[3])
	}

	if c.Revision() != rev {
		t.Fatalf("the plan wrote to etcd (revision %d -> %d)", rev, c.Revision())
	}
	for k, v := range c.Raw() {
		if before[k] != v {
			t.Fatalf("%s changed", k)
		}
	}
}
