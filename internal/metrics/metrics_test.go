package metrics

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/verify"
)

func parse(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(f)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return mfs
}

// value returns the value of the sample of family name whose labels are exactly
// labels; it fails the test when there is none.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("no metric family %s", name)
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		default:
			t.Fatalf("%s: unexpected type %s", name, mf.GetType())
		}
	}
	t.Fatalf("%s%v: no such sample", name, labels)
	return 0
}

func fixedNow(t *testing.T) time.Time {
	at := time.Unix(1760000000, 0)
	old := now
	now = func() time.Time { return at }
	t.Cleanup(func() { now = old })
	return at
}

func TestWriteVerify(t *testing.T) {
	at := fixedNow(t)
	rep := &verify.Report{
		Revision:   4242,
		Consistent: true,
		Summary:    verify.Counts{Objects: 13, Current: 7, Stale: 5, Unreadable: 1, NotObjects: 2, Orphaned: 3},
		Orphaned: []decode.OrphanGroup{
			{Reason: decode.OrphanCRDMissing, Prefix: "/registry/example.com/gizmos/", Keys: 1},
			{Reason: decode.OrphanCRDMissing, Prefix: "/registry/example.com/gadgets/", Keys: 1},
			{Reason: decode.OrphanRemovedBuiltin, Prefix: "/registry/podsecuritypolicy/", Keys: 1},
		},
		Resources: []verify.ResourceReport{
			{Resource: "secrets", Counts: verify.Counts{Objects: 6, Current: 1, Stale: 4, Unreadable: 1}},
			{Group: "resource.k8s.io", Resource: "deviceclasses", Counts: verify.Counts{Objects: 7, Current: 6, Stale: 1}},
		},
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "kem.prom")
	if err := WriteVerify(path, rep); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 (node_exporter must read it)", st.Mode().Perm())
	}
	mfs := parse(t, path)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{RemainingObjects, map[string]string{"resource": "secrets"}, 4},
		{RemainingObjects, map[string]string{"resource": "deviceclasses.resource.k8s.io"}, 1},
		{VerifyObjects, map[string]string{"resource": "secrets", "status": "current"}, 1},
		{VerifyObjects, map[string]string{"resource": "secrets", "status": "stale"}, 4},
		{VerifyObjects, map[string]string{"resource": "secrets", "status": "unreadable"}, 1},
		{VerifyObjects, map[string]string{"resource": "deviceclasses.resource.k8s.io", "status": "current"}, 6},
		{VerifyObjects, map[string]string{"resource": "deviceclasses.resource.k8s.io", "status": "unreadable"}, 0},
		{VerifyNotObjects, nil, 2},
		{VerifyOrphaned, map[string]string{"reason": "crd-missing"}, 2},
		{VerifyOrphaned, map[string]string{"reason": "removed-built-in"}, 1},
		{VerifyRevision, nil, 4242},
		{VerifyConsistent, nil, 1},
		{VerifyExitCode, nil, verify.ExitUnreadable},
		{VerifyLastRun, nil, float64(at.Unix())},
	}
	for _, c := range checks {
		if got := value(t, mfs, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := mfs[RemainingObjects].GetType(); got != dto.MetricType_GAUGE {
		t.Errorf("%s is a %s, want a gauge as upstream", RemainingObjects, got)
	}
	checkBuildInfo(t, mfs)
	// Only the metrics file is left in the directory (no temporary file).
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only kem.prom", len(entries))
	}

	// A second run replaces the file: a resource that became current shows 0 stale.
	rep.Resources[0].Current, rep.Resources[0].Stale, rep.Resources[0].Unreadable = 6, 0, 0
	rep.Summary = verify.Counts{Objects: 13, Current: 12, Stale: 1}
	rep.Consistent = false
	if err := WriteVerify(path, rep); err != nil {
		t.Fatal(err)
	}
	mfs = parse(t, path)
	if got := value(t, mfs, RemainingObjects, map[string]string{"resource": "secrets"}); got != 0 {
		t.Errorf("after the second run secrets remaining = %v, want 0", got)
	}
	if got := value(t, mfs, VerifyExitCode, nil); got != verify.ExitStale {
		t.Errorf("exit code %v, want %d", got, verify.ExitStale)
	}
	if got := value(t, mfs, VerifyConsistent, nil); got != 0 {
		t.Errorf("consistent %v, want 0", got)
	}
}

func TestWriteMigrate(t *testing.T) {
	fixedNow(t)
	path := filepath.Join(t.TempDir(), "migrate.prom")
	figs := []MigrateFigures{
		{Resource: "secrets", Current: 2, Stale: 10, Rewritten: 7, Conflicts: 1, Failed: 2, Unreadable: 3},
		{Resource: "deviceclasses.resource.k8s.io", Stale: 4, Rewritten: 4},
	}
	if err := WriteMigrate(path, figs, 90*time.Second+500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	mfs := parse(t, path)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{MigratedObjects, map[string]string{"resource": "secrets"}, 7},
		{MigratedObjects, map[string]string{"resource": "deviceclasses.resource.k8s.io"}, 4},
		{RemainingObjects, map[string]string{"resource": "secrets"}, 3},
		{RemainingObjects, map[string]string{"resource": "deviceclasses.resource.k8s.io"}, 0},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "rewritten"}, 7},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "current"}, 2},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "stale"}, 10},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "conflict"}, 1},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "failed"}, 2},
		{MigrateObjects, map[string]string{"resource": "secrets", "status": "unreadable"}, 3},
		{MigrateFailures, map[string]string{"resource": "secrets", "kind": "write"}, 2},
		{MigrateFailures, map[string]string{"resource": "secrets", "kind": "conflict"}, 1},
		{MigrateFailures, map[string]string{"resource": "secrets", "kind": "unreadable"}, 3},
		{MigrateDuration, nil, 90.5},
	}
	for _, c := range checks {
		if got := value(t, mfs, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := mfs[MigratedObjects].GetType(); got != dto.MetricType_COUNTER {
		t.Errorf("%s is a %s, want a counter as upstream", MigratedObjects, got)
	}
	checkBuildInfo(t, mfs)
}

// checkBuildInfo: the file says which build wrote it and which Kubernetes release
// it carries. (Go records no module versions in the test binary of a library
// package, so Kubernetes is "unknown" here; the CLI's tests check the release
// through the binary's metrics file.)
func checkBuildInfo(t *testing.T, mfs map[string]*dto.MetricFamily) {
	t.Helper()
	b := buildinfo.Get()
	labels := map[string]string{"version": b.Version, "kubernetes": b.Kubernetes, "revision": b.Commit, "goversion": b.Go}
	if got := value(t, mfs, BuildInfo, labels); got != 1 {
		t.Errorf("%s%v = %v, want 1", BuildInfo, labels, got)
	}
}

func TestWriteErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir", "x.prom")
	if err := WriteMigrate(missing, nil, time.Second); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	if err := WriteVerify(filepath.Join(t.TempDir(), "x.prom"), nil); err == nil {
		t.Error("nil report accepted")
	}
}
