package command

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"k8s.io/kube-aggregator/pkg/apis/apiregistration"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/quarantine"
	"kube-etcd-migrate/verify"
)

// orphans are the leftovers of a cluster's history that no built-in resource or
// CRD owns: a PodSecurityPolicy 1.24 stored (protobuf, under the prefix 1.24
// used), a custom resource whose CRD was deleted, and the key of an
// uninstalled aggregated API server under a prefix of its own.
func orphans(t *testing.T) map[string]struct {
	value  []byte
	reason decode.Orphan
} {
	t.Helper()
	meta, err := (&metav1.ObjectMeta{Name: "restricted", UID: "6f1d0c3e-0000-4000-8000-000000000001"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// A PodSecurityPolicy message: field 1 (metadata), field 2 (an empty spec).
	body := append(append([]byte{0x0a, byte(len(meta))}, meta...), 0x12, 0x00)
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "policy/v1beta1", Kind: "PodSecurityPolicy"}, Raw: body}
	psp, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]struct {
		value  []byte
		reason decode.Orphan
	}{
		"/registry/podsecuritypolicy/restricted":  {append([]byte("k8s\x00"), psp...), decode.OrphanRemovedBuiltin},
		"/registry/example.com/gizmos/default/g1": {[]byte(`{"apiVersion":"example.com/v1","kind":"Gizmo","metadata":{"name":"g1","namespace":"default","uid":"6f1d0c3e-0000-4000-8000-000000000002"},"spec":{"size":3}}` + "\n"), decode.OrphanCRDMissing},
		"/registry/wardle/flunders/default/f1":    {[]byte(`{"apiVersion":"wardle.example.com/v1alpha1","kind":"Flunder","metadata":{"name":"f1"}}`), decode.OrphanUnknownPrefix},
	}
}

// TestOrphanedCLI: in a cluster with three orphaned keys and stale objects,
// verify reports the orphans (by reason, with their keys) and judges the rest
// (exit 3, then 0 after migrate), --fail-on-orphaned makes them fail it (exit
// 4); migrate completes (exit 0) and leaves them byte for byte; quarantine
// --reason orphaned removes them, journaled; rollback --journal puts them back
// byte for byte.
func TestOrphanedCLI(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 20
	c.SeedMany(n, oldCfg)
	orph := orphans(t)
	for k, o := range orph {
		c.PutRaw(k, o.value)
	}
	unchanged := func(when string) {
		t.Helper()
		for k, o := range orph {
			if v, _, _ := c.Get(k); !bytes.Equal(v, o.value) {
				t.Errorf("%s: %s is %q, want it byte for byte %q", when, k, v, o.value)
			}
		}
	}
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"}

	verifyJSON := func(wantCode int, extra ...string) verify.Report {
		t.Helper()
		code, out, stderr := runCLI(t, append(append([]string{"verify", "-o", "json"}, extra...), conn...)...)
		if code != wantCode {
			t.Fatalf("verify %v: exit %d, want %d\n%s%s", extra, code, wantCode, out, stderr)
		}
		var rep verify.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("verify -o json: %v\n%s", err, out)
		}
		return rep
	}
	wantOrphans := func(rep verify.Report) {
		t.Helper()
		if rep.Summary.Orphaned != 3 || rep.Summary.Unreadable != 0 || len(rep.Orphaned) != 3 {
			t.Fatalf("summary %+v, orphaned %+v: want 3 orphaned, 0 unreadable", rep.Summary, rep.Orphaned)
		}
		for _, g := range rep.Orphaned {
			if len(g.SampleKeys) != 1 || g.Keys != 1 || orph[g.SampleKeys[0]].reason != g.Reason {
				t.Errorf("orphan group %+v: want one key of its reason", g)
			}
		}
	}

	rep := verifyJSON(exitStale)
	wantOrphans(rep)
	if rep.Summary.Stale != 2*n || rep.Summary.Objects != 2*n {
		t.Errorf("verify before migrate: %+v, want %d stale objects (the orphans apart)", rep.Summary, 2*n)
	}
	code, out, stderr := runCLI(t, append([]string{"verify"}, conn...)...)
	for _, want := range []string{"Orphaned keys", "removed-built-in", "/registry/podsecuritypolicy/", "policy/v1beta1 PodSecurityPolicy", "crd-missing", "no CRD gizmos.example.com", "unknown-prefix", "/registry/wardle/", "3 orphaned key(s) were left out"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify table (exit %d) does not say %q:\n%s%s", code, want, out, stderr)
		}
	}
	code, out, stderr = runCLI(t, append([]string{"inventory", "-o", "json"}, conn[:4]...)...)
	var inv inventory.Inventory
	if err := json.Unmarshal([]byte(out), &inv); code != exitOK || err != nil {
		t.Fatalf("inventory: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if inv.Total.Orphaned != 3 || inv.Total.Unreadable != 0 || len(inv.Orphaned) != 3 {
		t.Errorf("inventory totals %+v, orphaned %+v: want 3 orphaned, 0 unreadable", inv.Total, inv.Orphaned)
	}

	journal := filepath.Join(c.Dir, "migrate.journal")
	code, out, stderr = runCLI(t, append([]string{"migrate", "-o", "json", "--journal", journal}, conn...)...)
	var sum migrate.Summary
	if err := json.Unmarshal([]byte(out), &sum); code != exitOK || err != nil {
		t.Fatalf("migrate: exit %d (want 0), %v\n%s%s", code, err, out, stderr)
	}
	if sum.Summary.Rewritten != 2*n || sum.Summary.Orphaned != 3 || sum.Summary.Unreadable != 0 || len(sum.Failures) != 0 {
		t.Errorf("migrate summary %+v, failures %v: want %d rewritten, 3 orphaned", sum.Summary, sum.Failures, 2*n)
	}
	unchanged("after migrate")
	_, out, _ = runCLI(t, append([]string{"migrate", "--dry-run"}, conn...)...)
	if !strings.Contains(out, "3 orphaned key(s) left untouched") {
		t.Errorf("migrate's summary does not say it left the orphans:\n%s", out)
	}

	wantOrphans(verifyJSON(exitOK))
	if rep := verifyJSON(exitUnreadable, "--fail-on-orphaned"); !rep.FailOnOrphaned {
		t.Errorf("report does not say --fail-on-orphaned")
	}
	_, out, _ = runCLI(t, append([]string{"verify", "--fail-on-orphaned"}, conn...)...)
	if !strings.Contains(out, "(--fail-on-orphaned)") || !strings.Contains(out, "exit 4") {
		t.Errorf("verdict does not name --fail-on-orphaned:\n%s", out)
	}

	// quarantine: orphaned alone, never with --resource; dry run first.
	if code, _, stderr = runCLI(t, append([]string{"quarantine", "--reason", "orphaned", "--resource", "secrets", "--dry-run"}, conn[:4]...)...); code != exitUsage || !strings.Contains(stderr, "leave out --resource") {
		t.Errorf("quarantine --reason orphaned --resource: exit %d, %s", code, stderr)
	}
	if code, _, stderr = runCLI(t, append([]string{"quarantine", "--reason", "unknown-resource", "--resource", "secrets", "--dry-run"}, conn[:4]...)...); code != exitUsage || !strings.Contains(stderr, "--reason orphaned") {
		t.Errorf("quarantine --reason unknown-resource: exit %d, %s (want a pointer to orphaned)", code, stderr)
	}
	code, out, stderr = runCLI(t, append([]string{"quarantine", "--reason", "orphaned", "--dry-run"}, conn[:4]...)...)
	if code != exitOK || !strings.Contains(out, "would remove 3 of 3 orphaned key(s)") {
		t.Fatalf("quarantine --dry-run: exit %d\n%s%s", code, out, stderr)
	}
	unchanged("after quarantine --dry-run")

	qjournal := filepath.Join(c.Dir, "quarantine.journal")
	code, out, stderr = runCLI(t, append([]string{"quarantine", "--reason", "orphaned", "--journal", qjournal, "-o", "json"}, conn[:4]...)...)
	var res quarantine.Result
	if err := json.Unmarshal([]byte(out), &res); code != exitOK || err != nil {
		t.Fatalf("quarantine: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if res.Removed != 3 || res.Orphaned != 3 || res.Kept != 0 {
		t.Errorf("quarantine: %+v, want 3 orphaned keys removed", res)
	}
	for _, e := range res.Entries {
		if e.Status != quarantine.StatusRemoved || e.Reason != decode.ReasonOrphaned || e.Orphan != orph[e.Key].reason {
			t.Errorf("entry %+v", e)
		}
	}
	for k := range orph {
		if resp, err := c.Cli.Get(context.Background(), k); err != nil || len(resp.Kvs) != 0 {
			t.Errorf("%s still there after quarantine (%v)", k, err)
		}
	}
	rep = verifyJSON(exitOK, "--fail-on-orphaned")
	if rep.Summary.Orphaned != 0 || rep.Summary.Current != 2*n {
		t.Errorf("verify after quarantine: %+v", rep.Summary)
	}

	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--journal", qjournal)
	if code != exitOK || !strings.Contains(out, "restored 3") {
		t.Fatalf("rollback: exit %d\n%s%s", code, out, stderr)
	}
	unchanged("after rollback")
	wantOrphans(verifyJSON(exitOK))
}

// TestOrphanedAggregatedKept: keys laid out as custom resources of a group an
// APIService sends to an aggregated API server are orphaned (they block
// nothing) as "aggregated-api", and quarantine --reason orphaned keeps them
// byte for byte: that server may still use them.
func TestOrphanedAggregatedKept(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	port := int32(443)
	c.Put("/registry/apiregistration.k8s.io/apiservices/v1.metrics.example.io", decode.APIServiceGroupResource, &apiregistration.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1.metrics.example.io", UID: "6f1d0c3e-0000-4000-8000-000000000010", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: apiregistration.APIServiceSpec{Group: "metrics.example.io", Version: "v1", GroupPriorityMinimum: 100, VersionPriority: 100,
			Service: &apiregistration.ServiceReference{Namespace: "monitoring", Name: "metrics-server", Port: port}},
	}, "", "", "")
	key := "/registry/metrics.example.io/samples/default/s1"
	value := []byte(`{"apiVersion":"metrics.example.io/v1","kind":"Sample","metadata":{"name":"s1","namespace":"default"}}` + "\n")
	c.PutRaw(key, value)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--target-version", "1.37"}
	code, out, stderr := runCLI(t, append([]string{"verify", "-o", "json"}, conn...)...)
	var rep verify.Report
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.Summary.Orphaned != 1 || len(rep.Orphaned) != 1 || rep.Orphaned[0].Reason != decode.OrphanAggregated || !strings.Contains(rep.Orphaned[0].Detail, "service monitoring/metrics-server") {
		t.Fatalf("verify: exit %d, %+v\n%s%s", code, rep.Orphaned, out, stderr)
	}
	code, out, stderr = runCLI(t, "quarantine", "--reason", "orphaned", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint)
	if !strings.Contains(out, "aggregated API server, which may still use it") {
		t.Errorf("quarantine does not say why it keeps the key (exit %d):\n%s%s", code, out, stderr)
	}
	if v, _, _ := c.Get(key); !bytes.Equal(v, value) {
		t.Fatalf("quarantine --reason orphaned changed %s: %q", key, v)
	}
}
