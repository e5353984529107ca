package migrate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/apis/coordination"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/target"
	"kube-etcd-migrate/undo"
)

// testWindow is the liveness window of tests: a "kube-apiserver" in them
// renews every 150 ms.
const testWindow = 600 * time.Millisecond

// dump is every key under /registry with its value and mod revision.
func dump(t *testing.T, c *testcluster.Cluster) map[string]string {
	t.Helper()
	resp, err := c.Cli.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = fmt.Sprintf("%q@%d", kv.Value, kv.ModRevision)
	}
	return out
}

// sameExcept fails unless every key of before, but those in except, is in
// etcd byte for byte at the same mod revision, and no key was added.
func sameExcept(t *testing.T, c *testcluster.Cluster, before map[string]string, except ...string) {
	t.Helper()
	after := dump(t, c)
	skip := map[string]bool{}
	for _, k := range except {
		skip[k] = true
	}
	for k, v := range before {
		if !skip[k] && !bytes.Equal([]byte(after[k]), []byte(v)) {
			t.Errorf("%s was written", k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok && !skip[k] {
			t.Errorf("%s was created", k)
		}
	}
}

// TestLiveAPIServerWithSlowClock: a kube-apiserver renewing its identity lease
// every 150 ms, whose node's clock is 10 minutes behind (renewTime reads 10
// minutes old), is alive: the run is refused, nothing written, and the refusal
// names its key, its node and the revisions it moved by. A second node's
// stopped apiserver, whose lease reads 10 minutes in the future, is not named.
func TestLiveAPIServerWithSlowClock(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.PutRaw("/registry/leases/kube-system/apiserver-stopped", c.IdentityLease("apiserver-stopped", "cp-2", time.Now().Add(10*time.Minute)))
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	live := "/registry/leases/kube-system/apiserver-abc"
	stop := c.Renewer(t, "apiserver-abc", "cp-1", -10*time.Minute)
	before := dump(t, c)

	_, err := Run(context.Background(), c.Env(pipeline.Config{}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	stop()
	var pe *guard.PreflightError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a preflight refusal", err)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"a kube-apiserver is alive", "cp-1: " + live + " written", "mod revision", "not used", string(input.AllowLiveAPIServer), "nothing was written"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "apiserver-stopped") {
		t.Errorf("refusal names the stopped apiserver's lease: %s", msg)
	}
	sameExcept(t, c, before, live)
}

// TestStoppedAPIServerWithFastClock: a lease nobody renews whose renewTime
// is 10 minutes ahead of this clock (its node's clock is fast) does not block
// the run, nor one 10 minutes behind.
func TestStoppedAPIServerWithFastClock(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	c.PutRaw("/registry/leases/kube-system/apiserver-future", c.IdentityLease("apiserver-future", "cp-1", time.Now().Add(10*time.Minute)))
	c.PutRaw("/registry/leases/kube-system/apiserver-past", c.IdentityLease("apiserver-past", "cp-2", time.Now().Add(-10*time.Minute)))
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	sum, err := Run(context.Background(), c.Env(pipeline.Config{}), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if err != nil || sum.Summary.Rewritten != 1 {
		t.Fatalf("err %v summary %+v", err, sum.Summary)
	}
	if !strings.Contains(strings.Join(sum.Preflight, "\n"), "no key under /registry written while watched for 600ms") {
		t.Errorf("preflight %q does not say what it watched", sum.Preflight)
	}
}

// TestOtherWritersAndMasterLeases: with no kube-apiserver lease moving, a
// kube-controller-manager leader lease renewed during the window (only a
// kube-apiserver writes there) refuses the run and is named; a master lease
// whose etcd lease has time left refuses it with "wait and rerun"; keys etcd
// deletes with their lease meanwhile (an Event's, a stopped kube-apiserver's
// master lease) do not.
func TestOtherWritersAndMasterLeases(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	ctx := context.Background()
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	evLease, err := c.Cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	c.Put("/registry/events/default/e1", schema.GroupResource{Resource: "events"}, testcluster.Event("default", "e1"), "", "", "", clientv3.WithLease(evLease.ID))
	kcm := "/registry/leases/kube-system/kube-controller-manager"
	holder := "cp-1_x"
	value := c.Encode(kcm, testcluster.LeasesGR, &coordination.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: "kube-system", UID: "u", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       coordination.LeaseSpec{HolderIdentity: &holder},
	}, "", "", "")
	env := c.Env(pipeline.Config{})
	stop := c.KeepWriting(t, kcm, [][]byte{value})
	before := dump(t, c)
	_, err = Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	stop()
	if err == nil || !strings.Contains(err.Error(), "something is writing under /registry") || !strings.Contains(err.Error(), kcm+" written") {
		t.Fatalf("err = %v, want the kube-controller-manager lease named", err)
	}
	sameExcept(t, c, before, kcm)

	// A master lease kept by an etcd lease of 60 s: not written, but held.
	held, err := c.Cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ep := &api.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.1", UID: "m", CreationTimestamp: metav1.Unix(1700000000, 0)}}
	c.Put("/registry/masterleases/10.0.0.1", schema.GroupResource{Resource: "endpoints"}, ep, "", "", "", clientv3.WithLease(held.ID))
	before = dump(t, c)
	_, err = Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if err == nil || !strings.Contains(err.Error(), "/registry/masterleases/10.0.0.1 has") || !strings.Contains(err.Error(), "wait that long and rerun") {
		t.Fatalf("err = %v, want the held master lease named", err)
	}
	sameExcept(t, c, before)

	// Both leases end during the window (as etcd expires them): the run proceeds.
	done := make(chan error, 1)
	go func() {
		time.Sleep(400 * time.Millisecond)
		_, err := c.Cli.Revoke(ctx, held.ID)
		if err == nil {
			_, err = c.Cli.Revoke(ctx, evLease.ID)
		}
		done <- err
	}()
	sum, err := Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: time.Second, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil || sum.Summary.Rewritten != 1 {
		t.Fatalf("err %v summary %+v", err, sum.Summary)
	}
	if p := strings.Join(sum.Preflight, "\n"); !strings.Contains(p, "2 key(s) expired with their etcd lease meanwhile") {
		t.Errorf("preflight %q does not count the expired keys", p)
	}
}

// TestWriterAppearsMidRun: once the run writes, another writer (a
// kube-controller-manager lease renewed every 150 ms, as only a
// kube-apiserver would write it) stops the run: no batch is sent a second
// after etcd shows the first of its writes, the error names the key, every
// write of the run is journaled; the rerun, once the writer is gone, picks up
// from what was written, and rolling both runs back gives every secret back
// byte for byte.
func TestWriterAppearsMidRun(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 1500
	c.SeedMany(n, oldCfg)
	secrets := func() map[string]string {
		out := map[string]string{}
		for k, v := range c.Raw() {
			if strings.HasPrefix(k, "/registry/secrets/") {
				out[k] = v
			}
		}
		return out
	}
	before := secrets()
	cfg := pipeline.Config{Resources: []string{"secrets"}, PageSize: 50, Target: target.Input{EncryptionConfig: newCfg}}
	kcm := "/registry/leases/kube-system/kube-controller-manager"
	holder := "cp-1_x"
	lease := c.Encode(kcm, testcluster.LeasesGR, &coordination.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: "kube-system", UID: "u", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       coordination.LeaseSpec{HolderIdentity: &holder},
	}, "", "", "")

	// The test's own watch: when etcd showed the other writer's first write,
	// and the run's last.
	ctx := context.Background()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var firstOther, lastOurs time.Time
	var firstOtherRev int64
	watched := make(chan struct{})
	wch := c.Cli.Watch(wctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(c.Revision()+1))
	go func() {
		defer close(watched)
		for resp := range wch {
			for _, ev := range resp.Events {
				switch k := string(ev.Kv.Key); {
				case k == kcm && firstOther.IsZero():
					firstOther, firstOtherRev = time.Now(), ev.Kv.ModRevision
				case strings.HasPrefix(k, "/registry/secrets/"):
					lastOurs = time.Now()
				}
			}
		}
	}()

	journal1 := filepath.Join(c.Dir, "journal-1")
	var stop func()
	sum, err := Run(ctx, c.Env(cfg), Options{
		PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, Journal: journal1, QuotaBackendBytes: guard.DefaultQuotaBackendBytes},
		Writers:          2, BatchOps: 4,
		Progress: func(p Counts) {
			if stop == nil && p.Rewritten >= 100 {
				stop = c.KeepWriting(t, kcm, [][]byte{lease})
			}
		},
	})
	if stop == nil {
		t.Fatalf("the other writer never started (summary %+v, err %v)", sum.Summary, err)
	}
	var we *liveness.WriterError
	if !errors.As(err, &we) {
		t.Fatalf("err = %v, want a writer's stop (summary %+v)", err, sum.Summary)
	}
	msg := err.Error()
	t.Log(msg)
	if !strings.Contains(msg, "stopped: a writer appeared") || !strings.Contains(msg, kcm+" written") {
		t.Errorf("error does not name the other writer's key: %s", msg)
	}
	if s := sum.Summary; s.Rewritten == 0 || s.Rewritten >= n || s.Failed != 0 {
		t.Fatalf("summary %+v: want a run stopped part-way, nothing failed", s)
	}
	stop()
	time.Sleep(200 * time.Millisecond) // the test's watch sees the last writes
	cancel()
	<-watched
	if d := lastOurs.Sub(firstOther); d > time.Second {
		t.Errorf("the run wrote for %s after etcd showed the other writer's first write (revision %d)", d, firstOtherRev)
	}

	// Every secret the run changed is journaled, intent and done.
	intents, done := map[string]bool{}, map[string]bool{}
	if err := undo.ReadJournal(journal1, func(r undo.JournalRecord) error {
		switch r.Op {
		case "intent":
			intents[r.Key] = true
		case "done":
			done[r.Key] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	changed := 0
	for k, v := range secrets() {
		if v != before[k] {
			changed++
			if !intents[k] || !done[k] {
				t.Errorf("%s rewritten but not journaled (intent %v, done %v)", k, intents[k], done[k])
			}
		}
	}
	if int64(changed) != sum.Summary.Rewritten {
		t.Errorf("%d secrets changed, the summary says %d rewritten", changed, sum.Summary.Rewritten)
	}

	// The rerun picks up from what was written.
	journal2 := filepath.Join(c.Dir, "journal-2")
	again := run(t, c.Env(cfg), Options{PreflightOptions: guard.PreflightOptions{Journal: journal2}})
	if again.Summary.Rewritten != n-sum.Summary.Rewritten || again.Summary.Current != sum.Summary.Rewritten {
		t.Fatalf("rerun %+v after %d rewritten", again.Summary, sum.Summary.Rewritten)
	}
	res, err := rollback.RollbackJournals(ctx, c.Cli, &etcdscan.Writer{Client: c.Cli}, []string{journal2, journal1}, rollback.RollbackOptions{})
	if err != nil || res.Restored != n {
		t.Fatalf("rollback: %+v, %v", res, err)
	}
	for k, v := range secrets() {
		if before[k] != v {
			t.Errorf("%s not restored byte for byte", k)
		}
	}
}

// TestWindowWhileSnapshotSaved: the liveness window runs while the snapshot
// is saved and the first decisions are made, and its verdict still comes
// before any write: a writer that appears while the snapshot is being saved
// refuses the run as before (nothing written, the snapshot removed), and a
// run with no writer sends its first write only after the window's end (its
// revision above the window's last, its time past the window), having saved
// the snapshot and decided every object meanwhile.
func TestWindowWhileSnapshotSaved(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(300, oldCfg)
	// A database of some 40 MB (outside the prefix): its snapshot takes a while.
	filler := strings.Repeat("x", 1<<20)
	for i := range 40 {
		c.PutRaw(fmt.Sprintf("/filler/%02d", i), []byte(filler))
	}
	cfg := pipeline.Config{Resources: []string{"secrets"}, Target: target.Input{EncryptionConfig: newCfg}}
	ctx := context.Background()
	const window = 2 * time.Second

	// 1. A writer appears while the snapshot is being saved.
	snap := filepath.Join(c.Dir, "snapshot-1.db")
	other := "/registry/leases/kube-system/kube-scheduler"
	saving := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(window)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(snap + ".part"); err == nil {
				c.PutRaw(other, []byte("x"))
				saving <- true
				return
			}
			time.Sleep(time.Millisecond)
		}
		saving <- false
	}()
	before := dump(t, c)
	_, err := Run(ctx, c.Env(cfg), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: window, Snapshot: snap, Journal: filepath.Join(c.Dir, "journal-1"), QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if !<-saving {
		t.Fatal("the snapshot was never seen being saved during the window")
	}
	var pe *guard.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), other+" written") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("err = %v, want the window's refusal naming %s", err, other)
	}
	sameExcept(t, c, before, other)
	for _, f := range []string{snap, snap + ".part", filepath.Join(c.Dir, "journal-1")} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s left behind by a refused run", f)
		}
	}
	if _, err := c.Cli.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}

	// 2. No writer: the first write comes after the window's end.
	snap = filepath.Join(c.Dir, "snapshot-2.db")
	from := c.Revision()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	firstWrite := make(chan time.Time, 1)
	var firstRev int64
	var snapshotSeen time.Time
	go func() {
		for !func() bool { _, err := os.Stat(snap); return err == nil }() && wctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		snapshotSeen = time.Now()
	}()
	go func() {
		for resp := range c.Cli.Watch(wctx, "/registry/secrets/", clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
			if len(resp.Events) > 0 {
				firstRev = resp.Events[0].Kv.ModRevision
				firstWrite <- time.Now()
				return
			}
		}
	}()
	start := time.Now()
	sum, err := Run(ctx, c.Env(cfg), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: window, Snapshot: snap, Journal: filepath.Join(c.Dir, "journal-2"), QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	if err != nil || sum.Summary.Rewritten != 300 {
		t.Fatalf("run: %v, %+v", err, sum.Summary)
	}
	first := <-firstWrite
	if first.Sub(start) < window {
		t.Errorf("first write %s after the start, before the %s window ended", first.Sub(start), window)
	}
	var winFrom, winTo int64
	for _, l := range sum.Preflight {
		if i := strings.Index(l, "(etcd revisions "); i >= 0 {
			fmt.Sscanf(l[i:], "(etcd revisions %d to %d)", &winFrom, &winTo)
		}
	}
	if winTo == 0 || firstRev <= winTo {
		t.Errorf("first write at revision %d, the window watched up to %d (preflight %q)", firstRev, winTo, sum.Preflight)
	}
	if snapshotSeen.IsZero() || !snapshotSeen.Before(first) {
		t.Errorf("snapshot saved at %v, first write at %v", snapshotSeen, first)
	}
	if d := snapshotSeen.Sub(start); d >= window {
		t.Logf("note: the snapshot was saved %s after the start, not within the %s window (a loaded machine)", d, window)
	}

	// 3. The whole keyspace is read and decided while the window runs, not
	// only what the writers' queue holds: with one writer of one put at a
	// time (a queue of two decisions), the last secret is decided before
	// the first write, and nothing of the decisions held is left in the
	// run directory.
	c.SeedMany(300, oldCfg)
	runDir := filepath.Join(c.Dir, "run-3")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writtenAtLast := int64(-1)
	cfg3 := cfg
	cfg3.PageSize = 25
	sum, err = Run(ctx, c.Env(cfg3), Options{Writers: 1, BatchOps: 1,
		PreflightOptions: guard.PreflightOptions{LivenessWindow: window, Snapshot: filepath.Join(runDir, "snapshot.db"), Journal: filepath.Join(runDir, "journal"), QuotaBackendBytes: guard.DefaultQuotaBackendBytes},
		Progress: func(n Counts) {
			if n.Stale == 300 && writtenAtLast < 0 {
				writtenAtLast = n.Rewritten
			}
		}})
	if err != nil || sum.Summary.Rewritten != 300 {
		t.Fatalf("run with one writer: %v, %+v", err, sum.Summary)
	}
	if writtenAtLast != 0 {
		t.Errorf("the last secret was decided after %d writes: the reading waited for the window", writtenAtLast)
	}
	ents, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "journal snapshot.db" {
		t.Errorf("the run directory holds %v, want its journal and snapshot", names)
	}
}
