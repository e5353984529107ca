package migrate

import (
	"bytes"
	"context"
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/target"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/rollback"
)

func run(t *testing.T, env *pipeline.Env, opts Options) *Summary {
	t.Helper()
	if opts.QuotaBackendBytes == 0 {
		opts.QuotaBackendBytes = guard.DefaultQuotaBackendBytes
	}
	if opts.LivenessWindow == 0 {
		opts.LivenessWindow = testWindow
	}
	sum, err := Run(context.Background(), env, opts)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return sum
}

// TestMigrateEachReason: storage version, encryption key, provider change and media
// type are each rewritten to exactly what the target writes, and a second run finds
// everything current.
func TestMigrateEachReason(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)

	c.Put("/registry/secrets/ns1/rotated", testcluster.SecretsGR, testcluster.Secret("ns1", "rotated", "hunter2"), "", "", oldCfg)
	c.Put("/registry/configmaps/ns1/plain", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "plain"), "", "", "") // identity -> aescbc key2
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")      // v1beta2 -> v1
	c.Put("/registry/configmaps/ns1/json", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "json"), "", decode.MediaTypeJSON, newCfg)
	c.Put("/registry/configmaps/ns1/current", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "current"), "", "", newCfg)
	currentBefore, currentRev, _ := c.Get("/registry/configmaps/ns1/current")

	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}})
	want := map[string]string{
		"/registry/secrets/ns1/rotated":  "encryption",
		"/registry/configmaps/ns1/plain": "encryption",
		"/registry/deviceclasses/gpu":    "storage-version",
		"/registry/configmaps/ns1/json":  "media-type",
	}
	for key, reason := range want {
		if d := testcluster.Decision(t, env, c, key); d.Status != reencode.Stale || d.ReasonStrings() != reason {
			t.Errorf("%s: %s %q, want stale %q", key, d.Status, d.ReasonStrings(), reason)
		}
	}
	sum := run(t, env, Options{PreflightOptions: guard.PreflightOptions{Journal: filepath.Join(c.Dir, "journal")}})
	if sum.Summary.Rewritten != 4 || sum.Summary.Current != 1 || sum.Summary.Failed != 0 || sum.Summary.Conflicts != 0 {
		t.Fatalf("summary %+v", sum.Summary)
	}
	// Each value is now what kube-apiserver 1.36 with the new config writes:
	// current for a fresh decision, under aescbc key2 for secrets and configmaps.
	env2 := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}})
	for key := range want {
		d := testcluster.Decision(t, env2, c, key)
		if d.Status != reencode.Current {
			t.Errorf("after migrate %s: %s %v", key, d.Status, d.Reasons)
		}
		value, _, _ := c.Get(key)
		if strings.Contains(key, "/secrets/") || strings.Contains(key, "/configmaps/") {
			if !bytes.HasPrefix(value, []byte("k8s:enc:aescbc:v1:key2:")) {
				t.Errorf("%s: not under aescbc key2", key)
			}
			if bytes.Contains(value, []byte("hunter2")) {
				t.Errorf("%s: plaintext in etcd", key)
			}
		}
	}
	if d := testcluster.Decision(t, env2, c, "/registry/deviceclasses/gpu"); d.From.Version != "resource.k8s.io/v1" {
		t.Errorf("deviceclass stored as %s", d.From.Version)
	}
	// The current object was not touched.
	after, rev, _ := c.Get("/registry/configmaps/ns1/current")
	if rev != currentRev || !bytes.Equal(after, currentBefore) {
		t.Errorf("current object rewritten")
	}
	// Decoded content is unchanged by the migration.
	assertSameSecret(t, c, env2, "/registry/secrets/ns1/rotated", "hunter2")

	// Second run: nothing to do.
	again := run(t, env2, Options{})
	if again.Summary.Rewritten != 0 || again.Summary.Current != 5 {
		t.Fatalf("second run %+v", again.Summary)
	}
}

func assertSameSecret(t *testing.T, c *testcluster.Cluster, env *pipeline.Env, key, password string) {
	t.Helper()
	value, rev, _ := c.Get(key)
	obj, err := env.Decoder.Decode(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: rev})
	if err != nil {
		t.Fatal(err)
	}
	s := obj.Internal.(*api.Secret)
	if string(s.Data["password"]) != password || s.UID == "" || s.Name == "" {
		t.Fatalf("%s: content changed", key)
	}
}

// TestMigrateToIdentity: a config whose first provider is identity decrypts and
// writes plaintext (disaster recovery away from a key).
func TestMigrateToIdentity(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.Identity, testcluster.AESCBC("key1", 1))
	c.Put("/registry/secrets/ns1/s", testcluster.SecretsGR, testcluster.Secret("ns1", "s", "pw"), "", "", oldCfg)
	sum := run(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{})
	if sum.Summary.Rewritten != 1 {
		t.Fatalf("%+v", sum.Summary)
	}
	value, _, _ := c.Get("/registry/secrets/ns1/s")
	if !bytes.HasPrefix(value, []byte("k8s\x00")) {
		t.Fatalf("not stored as plaintext protobuf")
	}
}

// TestLeaseKept: events keep their etcd lease and its TTL keeps counting down.
func TestLeaseKept(t *testing.T) { testetcd.Each(t, testLeaseKept) }

func testLeaseKept(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version})
	ctx := context.Background()
	lease, err := c.Cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	c.Put("/registry/events/ns1/e1", testcluster.EventsGR, testcluster.Event("ns1", "e1"), "", decode.MediaTypeJSON, "", clientv3.WithLease(lease.ID))
	sum := run(t, c.Env(pipeline.Config{}), Options{})
	if sum.Summary.Rewritten != 1 {
		t.Fatalf("%+v", sum.Summary)
	}
	value, _, got := c.Get("/registry/events/ns1/e1")
	if got != int64(lease.ID) {
		t.Fatalf("lease %x, want %x", got, lease.ID)
	}
	if !bytes.HasPrefix(value, []byte("k8s\x00")) {
		t.Fatalf("event not rewritten as protobuf")
	}
	ttl, err := c.Cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL <= 0 || ttl.TTL > 3600 || len(ttl.Keys) != 1 {
		t.Fatalf("lease TTL %d keys %d", ttl.TTL, len(ttl.Keys))
	}
}

// TestDryRunWritesNothing: the revision does not move and the report lists the work.
func TestDryRunWritesNothing(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	for i := 0; i < 30; i++ {
		c.Put(fmt.Sprintf("/registry/deviceclasses/dc-%02d", i), testcluster.DeviceClassGR, testcluster.DeviceClass(fmt.Sprintf("dc-%02d", i)), "1.34", "", "")
	}
	before := c.Revision()
	sum := run(t, c.Env(pipeline.Config{PageSize: 7}), Options{PreflightOptions: guard.PreflightOptions{Journal: filepath.Join(c.Dir, "j")}, DryRun: true})
	if c.Revision() != before {
		t.Fatalf("dry run moved the revision %d -> %d", before, c.Revision())
	}
	if sum.Summary.Stale != 30 || sum.Summary.Rewritten != 0 {
		t.Fatalf("%+v", sum.Summary)
	}
	for _, r := range sum.Resources {
		if r.Resource == testcluster.DeviceClassGR.Resource && r.Reasons[string(reencode.ReasonVersion)] != 30 {
			t.Fatalf("dry run should say why each would change: reasons %v", r.Reasons)
		}
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "j")); !os.IsNotExist(err) {
		t.Fatalf("dry run created the journal")
	}
}

// TestConcurrentWriterWins: a writer changing keys during the run keeps every one of
// its writes; those keys are conflicts, the rest are rewritten.
func TestConcurrentWriterWins(t *testing.T) { testetcd.Each(t, testConcurrentWriterWins) }

func testConcurrentWriterWins(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version})
	const n = 400
	for i := 0; i < n; i++ {
		c.Put(fmt.Sprintf("/registry/deviceclasses/dc-%03d", i), testcluster.DeviceClassGR, testcluster.DeviceClass(fmt.Sprintf("dc-%03d", i)), "1.34", "", "")
	}
	env := c.Env(pipeline.Config{PageSize: 20, Concurrency: 2})
	// The other writer stores its own marker values (as an apiserver would store a
	// fresh object) into every third key while the migration runs.
	ctx := context.Background()
	theirs := map[string][]byte{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i += 3 {
			key := fmt.Sprintf("/registry/deviceclasses/dc-%03d", i)
			sc, _ := decode.NewStorageConfig("")
			rc, _ := sc.Codec(testcluster.DeviceClassGR)
			dc := testcluster.DeviceClass(fmt.Sprintf("dc-%03d", i))
			dc.Labels = map[string]string{"written-by": "other"}
			v, _ := runtime.Encode(rc.Codec, dc)
			if _, err := c.Cli.Put(ctx, key, string(v)); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			theirs[key] = v
			mu.Unlock()
		}
	}()
	// The liveness check would see the other writer and refuse (as it must):
	// this test is of the compare-and-swap that protects a run that skipped it.
	sum := run(t, env, Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}, BatchOps: 8})
	<-done
	for key, v := range theirs {
		got, _, _ := c.Get(key)
		if !bytes.Equal(got, v) {
			t.Errorf("%s: the other writer's value was overwritten", key)
		}
	}
	s := sum.Summary
	if s.Rewritten+s.Conflicts+s.Current != n || s.Failed != 0 {
		t.Fatalf("summary %+v", s)
	}
	// Whatever was neither theirs nor current before is now v1.
	env2 := c.Env(pipeline.Config{})
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("/registry/deviceclasses/dc-%03d", i)
		if d := testcluster.Decision(t, env2, c, key); d.Status != reencode.Current {
			t.Errorf("%s: %s after migrate", key, d.Status)
		}
	}
}

// TestRollbackRestoresBytes: rollback gives back byte-identical values and keeps
// leases; a key changed after the migration is left alone.
func TestRollbackRestoresBytes(t *testing.T) { testetcd.Each(t, testRollbackRestoresBytes) }

func testRollbackRestoresBytes(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	ctx := context.Background()
	lease, err := c.Cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{}
	before := map[string][]byte{}
	for i := 0; i < 10; i++ {
		key := fmt.Sprintf("/registry/secrets/ns1/s%d", i)
		c.Put(key, testcluster.SecretsGR, testcluster.Secret("ns1", fmt.Sprintf("s%d", i), "pw"), "", "", oldCfg)
		keys = append(keys, key)
	}
	c.Put("/registry/events/ns1/e", testcluster.EventsGR, testcluster.Event("ns1", "e"), "", decode.MediaTypeJSON, "", clientv3.WithLease(lease.ID))
	keys = append(keys, "/registry/events/ns1/e")
	for _, k := range keys {
		before[k], _, _ = c.Get(k)
	}
	journal := filepath.Join(c.Dir, "journal")
	sum := run(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{PreflightOptions: guard.PreflightOptions{Journal: journal}})
	if sum.Summary.Rewritten != 11 {
		t.Fatalf("%+v", sum.Summary)
	}
	if fi, err := os.Stat(journal); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode: %v %v", fi.Mode(), err)
	}
	// Someone updates s0 after the migration: rollback must not undo that.
	c.Put("/registry/secrets/ns1/s0", testcluster.SecretsGR, testcluster.Secret("ns1", "s0", "changed"), "", "", newCfg)
	changed, _, _ := c.Get("/registry/secrets/ns1/s0")

	res, err := rollback.Rollback(ctx, c.Cli, journal, &etcdscan.Writer{Client: c.Cli})
	if err != nil {
		t.Fatal(err)
	}
	if res.Restored != 10 || res.Skipped != 1 || res.Failed != 0 {
		t.Fatalf("rollback %+v", res)
	}
	for _, k := range keys[1:] {
		got, _, l := c.Get(k)
		if !bytes.Equal(got, before[k]) {
			t.Errorf("%s: not byte-identical after rollback", k)
		}
		if strings.Contains(k, "events") && l != int64(lease.ID) {
			t.Errorf("%s: lease lost in rollback", k)
		}
	}
	if got, _, _ := c.Get("/registry/secrets/ns1/s0"); !bytes.Equal(got, changed) {
		t.Errorf("rollback overwrote a later change")
	}
}

// TestUnreadableAndNonObjectsAreNeverWritten: corrupt values, undecryptable values,
// orphaned keys and compact_rev_key are reported and left byte-identical.
func TestUnreadableAndNonObjectsAreNeverWritten(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	lostCfg := c.EncryptionConfig("lost.yaml", testcluster.AESCBC("lost", 9))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	c.Put("/registry/secrets/ns1/lost-key", testcluster.SecretsGR, testcluster.Secret("ns1", "lost-key", "pw"), "", "", lostCfg)
	ctx := context.Background()
	raw := map[string]string{
		"/registry/secrets/ns1/garbage":     "\x00\x01\x02garbage",
		"/registry/secrets/ns1/truncated":   "k8s\x00\x0a\x05",
		"/registry/gizmos/ns1/g":            "k8s\x00",
		"/registry/other.io/gadgets/ns1/g":  `{"apiVersion":"other.io/v1","kind":"Gadget"}`,
		"compact_rev_key":                   "12",
		"/registry/deviceclasses/wrongkind": "",
	}
	for k, v := range raw {
		if _, err := c.Cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	c.Put("/registry/deviceclasses/ok", testcluster.DeviceClassGR, testcluster.DeviceClass("ok"), "1.34", "", "")
	before := map[string][]byte{}
	for k := range raw {
		before[k], _, _ = c.Get(k)
	}
	before["/registry/secrets/ns1/lost-key"], _, _ = c.Get("/registry/secrets/ns1/lost-key")

	sum, err := Run(ctx, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if err != nil {
		t.Fatal(err)
	}
	// The two keys no resource owns are orphaned: left as they are, not failures.
	if sum.Summary.Rewritten != 1 || sum.Summary.Unreadable != 4 || sum.Summary.Orphaned != 2 || len(sum.Failures) != 4 {
		t.Fatalf("summary %+v failures %+v", sum.Summary, sum.Failures)
	}
	for k, v := range before {
		if got, _, _ := c.Get(k); !bytes.Equal(got, v) {
			t.Errorf("%s was written", k)
		}
	}
	for _, f := range sum.Failures {
		if f.Key == "/registry/secrets/ns1/lost-key" && !strings.Contains(f.Error, "lost") {
			t.Errorf("undecryptable error does not name the key it needs: %s", f.Error)
		}
		if strings.Contains(f.Error, "pw") && strings.Contains(f.Key, "secrets") && strings.Contains(f.Error, "password") {
			t.Errorf("error leaks secret: %s", f.Error)
		}
	}
}

// TestPreflightRefusesOverQuota: a rewrite that would not fit the backend quota is
// refused with the estimate and the compaction advice.
func TestPreflightRefusesOverQuota(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	for i := 0; i < 50; i++ {
		c.Put(fmt.Sprintf("/registry/deviceclasses/dc-%02d", i), testcluster.DeviceClassGR, testcluster.DeviceClass(fmt.Sprintf("dc-%02d", i)), "1.34", "", "")
	}
	st, err := etcdscan.Status(context.Background(), c.Cli)
	if err != nil {
		t.Fatal(err)
	}
	before := c.Revision()
	_, err = Run(context.Background(), c.Env(pipeline.Config{}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: st.DBSize + 100}})
	if err == nil || !strings.Contains(err.Error(), "quota") || !strings.Contains(err.Error(), "defragment") {
		t.Fatalf("err = %v", err)
	}
	if c.Revision() != before {
		t.Fatalf("wrote despite the quota")
	}
}

// TestPreflightRefusesAlarm: etcd's NOSPACE alarm stops the run.
func TestPreflightRefusesAlarm(t *testing.T) { testetcd.Each(t, testPreflightRefusesAlarm) }

func testPreflightRefusesAlarm(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version, QuotaBackendBytes: 1 << 20})
	ctx := context.Background()
	big := strings.Repeat("x", 64<<10)
	// etcd checks the quota against the committed backend size, which lags the
	// writes by its batch interval: keep writing, pausing, until it refuses.
	var full error
	for i := 0; i < 400 && full == nil; i++ {
		_, full = c.Cli.Put(ctx, fmt.Sprintf("/registry/zz-filler/%d", i), big)
		if i%8 == 7 {
			time.Sleep(120 * time.Millisecond)
		}
	}
	if full == nil {
		t.Fatal("could not fill a 1 MiB quota")
	}
	_, err := Run(ctx, c.Env(pipeline.Config{}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow}})
	if err == nil || !strings.Contains(err.Error(), "NOSPACE") {
		t.Fatalf("err = %v", err)
	}
}

// TestFailFastStopsAtUnreadable: with --fail-fast the run stops at the first
// unreadable object instead of going on, and says why.
func TestFailFastStopsAtUnreadable(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	if _, err := c.Cli.Put(context.Background(), "/registry/configmaps/a/bad", "k8s\x00garbage"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		c.Put(fmt.Sprintf("/registry/configmaps/b/cm-%02d", i), testcluster.ConfigMapsGR, testcluster.ConfigMap("b", fmt.Sprintf("cm-%02d", i)), "", decode.MediaTypeJSON, "")
	}
	sum, err := Run(context.Background(), c.Env(pipeline.Config{PageSize: 10}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}, FailFast: true})
	if err == nil || !strings.Contains(err.Error(), string(input.FailFast)) {
		t.Fatalf("err = %v", err)
	}
	if sum.Summary.Unreadable != 1 || sum.Summary.Rewritten != 0 || len(sum.Failures) != 1 || sum.Failures[0].Key != "/registry/configmaps/a/bad" {
		t.Fatalf("%+v %+v", sum.Summary, sum.Failures)
	}
	// Without it, the same keyspace is migrated around the bad key.
	sum = run(t, c.Env(pipeline.Config{PageSize: 10}), Options{})
	if sum.Summary.Rewritten != 40 || sum.Summary.Unreadable != 1 {
		t.Fatalf("%+v", sum.Summary)
	}
}

// TestSnapshotBeforeFirstWrite: --snapshot saves etcd (mode 0600) before anything
// is rewritten: the old values are in it.
func TestSnapshotBeforeFirstWrite(t *testing.T) { testetcd.Each(t, testSnapshotBeforeFirstWrite) }

func testSnapshotBeforeFirstWrite(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version})
	c.Put("/registry/configmaps/a/cm", testcluster.ConfigMapsGR, testcluster.ConfigMap("a", "cm"), "", decode.MediaTypeJSON, "")
	old, _, _ := c.Get("/registry/configmaps/a/cm")
	path := filepath.Join(c.Dir, "before.db")
	sum := run(t, c.Env(pipeline.Config{}), Options{PreflightOptions: guard.PreflightOptions{Snapshot: path}})
	if sum.Summary.Rewritten != 1 {
		t.Fatalf("%+v", sum.Summary)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot: %v %v", fi, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, old) {
		t.Fatal("the snapshot does not hold the value as it was before the migration")
	}
	if now, _, _ := c.Get("/registry/configmaps/a/cm"); bytes.Equal(now, old) {
		t.Fatal("not rewritten")
	}
}
