package migrate

import (
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/rollback"
)

// The crash test re-executes this test binary as the migrating process; these
// variables tell the child what to do.
const (
	childEndpoint = "KEM_CHILD_ENDPOINT"
	childConfig   = "KEM_CHILD_ENCRYPTION_CONFIG"
	childJournal  = "KEM_CHILD_JOURNAL"
)

func TestMain(m *testing.M) {
	if ep := os.Getenv(childEndpoint); ep != "" {
		os.Exit(childMigrate(ep))
	}
	os.Exit(m.Run())
}

// childMigrate is the process the crash test kills: an ordinary migrate run with
// one-key transactions, so that it is mid-way when the SIGKILL arrives.
func childMigrate(endpoint string) int {
	ctx := context.Background()
	cli, err := etcdscan.Connect(ctx, etcdscan.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, CommandTimeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err := pipeline.Setup(ctx, cli, pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: os.Getenv(childConfig)}, PageSize: 50})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, err = Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, Journal: os.Getenv(childJournal), QuotaBackendBytes: guard.DefaultQuotaBackendBytes}, BatchOps: 1, Writers: 1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// snapshotObjects decodes every object under /registry with env.
func snapshotObjects(t *testing.T, env *pipeline.Env) map[string]runtime.Object {
	t.Helper()
	out := map[string]runtime.Object{}
	_, err := env.Run(context.Background(), 0, pipeline.DecodeOnly, func(page []reencode.Decision) error {
		for _, d := range page {
			if d.Status != reencode.Readable {
				return fmt.Errorf("%s: %s %v", d.Key, d.Status, d.Err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := env.Client.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		obj, err := env.Decoder.Decode(context.Background(), etcdscan.KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision})
		if err != nil {
			t.Fatal(err)
		}
		out[string(kv.Key)] = obj.Internal
	}
	return out
}

// TestKilledMidRunThenResumed: a migrate process killed with SIGKILL in the middle
// of its writes loses and alters nothing, and running again finishes the job. Every
// object's decoded content is compared before and after.
func TestKilledMidRunThenResumed(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 600
	c.SeedMany(n, oldCfg)
	before := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))
	if len(before) != 2*n {
		t.Fatalf("seeded %d objects, want %d", len(before), 2*n)
	}
	raw := c.Raw()
	startRev := c.Revision()

	journal := filepath.Join(c.Dir, "journal")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEndpoint+"="+c.Srv.Endpoint, childConfig+"="+newCfg, childJournal+"="+journal)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it has rewritten some keys, well before it could finish.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writes := 0
	for resp := range c.Cli.Watch(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(startRev+1)) {
		writes += len(resp.Events)
		if writes >= 150 {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("child was not killed mid-run (it finished first: %v, %s); lower its speed or raise n", err, stderr.String())
	}
	cancel()

	// Nothing lost or altered by the kill: every object decodes to the same content.
	mid := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))
	assertSameObjects(t, before, mid)

	// Running again resumes: what the killed run wrote is current and skipped.
	journal2 := filepath.Join(c.Dir, "journal2")
	sum := run(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{PreflightOptions: guard.PreflightOptions{Journal: journal2}})
	if sum.Summary.Failed != 0 || sum.Summary.Current < 1 || sum.Summary.Rewritten+sum.Summary.Current != 2*n {
		t.Fatalf("resume: %+v", sum.Summary)
	}
	after := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))
	assertSameObjects(t, before, after)
	final := run(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{DryRun: true})
	if final.Summary.Stale != 0 || final.Summary.Current != 2*n {
		t.Fatalf("after resume: %+v", final.Summary)
	}

	// Rolling back both runs, latest first, gives back the bytes stored before the
	// first one, key for key (the killed run's journal may end in a torn record).
	for _, j := range []string{journal2, journal} {
		rb, err := rollback.Rollback(context.Background(), c.Cli, j, &etcdscan.Writer{Client: c.Cli})
		if err != nil {
			t.Fatalf("rollback %s: %v", filepath.Base(j), err)
		}
		if rb.Restored == 0 || rb.Skipped != 0 || rb.Failed != 0 {
			t.Fatalf("rollback %s: %+v", filepath.Base(j), rb)
		}
	}
	got := c.Raw()
	if len(got) != len(raw) {
		t.Fatalf("%d keys after rollback, want %d", len(got), len(raw))
	}
	for k, v := range raw {
		if got[k] != v {
			t.Fatalf("%s: not restored byte for byte", k)
		}
	}
}

func assertSameObjects(t *testing.T, want, got map[string]runtime.Object) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d objects, want %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Fatalf("%s: lost", k)
		}
		if !equality.Semantic.DeepEqual(w, g) {
			t.Fatalf("%s: decoded content changed", k)
		}
	}
}

// TestCompactionMidRun: etcd compacts past the pinned revision during the scan; the
// run continues from the last key at a newer revision, says the snapshot was not
// consistent, and still migrates every object exactly once.
func TestCompactionMidRun(t *testing.T) { testetcd.Each(t, testCompactionMidRun) }

func testCompactionMidRun(t *testing.T, version string) {
	c := testcluster.New(t, testetcd.Options{Version: version})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 300
	c.SeedMany(n, oldCfg)
	// After the point where the test compacts (the 100th key of 2n+1000):
	// what etcd 3.7's stream cannot have read ahead of the run by then.
	ballast := c.Ballast("zz-ballast", 1000)
	before := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))

	compacted := false
	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}, PageSize: 25})
	pf := guard.PreflightOptions{LivenessWindow: testWindow, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}
	watch, err := guard.StartWatch(context.Background(), c.Cli, env.Resolver.Prefix(), pf)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	// During the scan (which goes on while the liveness window runs, the
	// whole keyspace decided before the first write): a write outside the
	// prefix moves etcd's revision past the scan's, and a compaction by
	// someone else there is no writer; the run's watch of etcd outlives it.
	// It compacts what the watch has seen (a compaction past a watch that
	// lags behind stops the run: what it did not see cannot be known).
	opts := Options{PreflightOptions: pf, Watch: watch, Progress: func(n Counts) {
		if !compacted && n.Scanned >= 100 {
			compacted = true
			c.PutRaw("/other/compaction-mark", []byte("x"))
			rev := c.Revision()
			if err := watch.Settle(context.Background()); err != nil {
				t.Errorf("the run's watch: %v", err)
			}
			if _, err := c.Cli.Compact(context.Background(), rev); err != nil {
				t.Errorf("compact: %v", err)
			}
		}
	}}
	sum, err := Run(context.Background(), env, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !compacted {
		t.Fatal("the run never reported progress; compaction not exercised")
	}
	if sum.Consistent || len(sum.Restarts) == 0 {
		t.Fatalf("compaction not reported: consistent=%v restarts=%v", sum.Consistent, sum.Restarts)
	}
	if sum.Summary.Failed != 0 || sum.Summary.Scanned != int64(2*n+len(ballast)) {
		t.Fatalf("summary %+v", sum.Summary)
	}
	after := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))
	assertSameObjects(t, before, after)
	final := run(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{DryRun: true})
	if final.Summary.Stale != 0 {
		t.Fatalf("stale after the run: %+v", final.Summary)
	}
}
