package migrate

import (
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/verify"
)

// TestThreeMemberClusterLeaderChanges: a key rotation on a 3-member etcd
// cluster, the tool connected to all three members as etcdctl would be,
// while the leadership is handed to another member (move-leader) and then
// that leader is killed (a crash of its node: no leadership transfer, the
// others elect a new leader after the election timeout), both while the
// run is writing. Nothing is lost: every key is rewritten exactly once
// (etcd's per-key version), the journal holds an intent and a done record
// for every write, a verify afterwards finds every object current, the
// content is unchanged, and a rollback from the journal gives back every
// byte.
func TestThreeMemberClusterLeaderChanges(t *testing.T) {
	ec := testetcd.StartClusterT(t, 3)
	ctx := context.Background()
	cli, err := etcdscan.Connect(ctx, etcdscan.Config{Endpoints: ec.Endpoints(), DialTimeout: 5 * time.Second, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c := testcluster.NewOn(t, cli)
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)

	// 400 secrets under the old key, 200 plaintext configmaps, 20 events on a
	// lease: all stale for the new configuration.
	const secrets, configmaps, events = 400, 200, 20
	const n = secrets + configmaps + events
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	var ops []clientv3.Op
	flush := func() {
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := 0; i < n; i++ {
		var key string
		var value []byte
		var opts []clientv3.OpOption
		switch {
		case i < secrets:
			ns, name := fmt.Sprintf("ns%d", i%5), fmt.Sprintf("s-%04d", i)
			key = "/registry/secrets/" + ns + "/" + name
			value = c.Encode(key, testcluster.SecretsGR, testcluster.Secret(ns, name, "pw-"+name), "", "", oldCfg)
		case i < secrets+configmaps:
			ns, name := fmt.Sprintf("ns%d", i%5), fmt.Sprintf("cm-%04d", i)
			key = "/registry/configmaps/" + ns + "/" + name
			value = c.Encode(key, testcluster.ConfigMapsGR, testcluster.ConfigMap(ns, name), "", "", "")
		default:
			name := fmt.Sprintf("e-%04d", i)
			key = "/registry/events/ns0/" + name
			value = c.Encode(key, testcluster.EventsGR, testcluster.Event("ns0", name), "", decode.MediaTypeJSON, "")
			opts = append(opts, clientv3.WithLease(lease.ID))
		}
		ops = append(ops, clientv3.OpPut(key, string(value), opts...))
		if len(ops) == 50 {
			flush()
		}
	}
	flush()
	raw := c.Raw()
	if len(raw) != n {
		t.Fatalf("seeded %d keys, want %d", len(raw), n)
	}
	before := snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))

	startLeader, err := ec.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The disruptions come from the run's progress, after a page's batches
	// are queued: the writers go on writing while the leadership moves (a
	// quarter of the keys rewritten) and while the new leader is killed (half).
	type event struct {
		what     string
		revision int64 // etcd's revision once it was over
	}
	var evs []event
	stopped := -1
	journal := filepath.Join(c.Dir, "journal")
	opts := Options{
		PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, Journal: journal, QuotaBackendBytes: guard.DefaultQuotaBackendBytes}, BatchOps: 2, Writers: 2,
		Progress: func(p Counts) {
			switch {
			case len(evs) == 0 && p.Rewritten >= n/4:
				if err := ec.MoveLeader(ctx, (startLeader+1)%3); err != nil {
					t.Errorf("move-leader: %v", err)
				}
				evs = append(evs, event{"move-leader", c.Revision()})
			case len(evs) == 1 && p.Rewritten >= n/2:
				lead, err := ec.WaitLeader(ctx)
				if err != nil {
					t.Errorf("kill-leader: %v", err)
					return
				}
				stopped = lead
				ec.Members[lead].Kill()
				evs = append(evs, event{"kill-leader", c.Revision()})
			}
		},
	}
	sum, err := Run(ctx, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}, PageSize: 20}), opts)
	if err != nil {
		t.Fatalf("migrate across leader changes: %v", err)
	}
	if len(evs) != 2 || stopped < 0 {
		t.Fatalf("the leader changes did not happen: %+v", evs)
	}
	if s := sum.Summary; s.Rewritten != n || s.Failed != 0 || s.Conflicts != 0 || s.Scanned != n {
		t.Fatalf("summary %+v, failures %+v", s, sum.Failures)
	}

	// Every key was written exactly once by the run (etcd counts a key's
	// versions since its creation: 1 when seeded, 2 after one rewrite), the
	// event keys are still on their lease, and writes of the run landed after
	// each disruption was over (the run was mid-way through both).
	resp, err := cli.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	lastWrite := map[string]int64{}
	maxRev := int64(0)
	for _, kv := range resp.Kvs {
		if kv.Version != 2 {
			t.Errorf("%s: written %d times by the run, want once", kv.Key, kv.Version-1)
		}
		lastWrite[string(kv.Key)] = kv.ModRevision
		maxRev = max(maxRev, kv.ModRevision)
		if ev := len(kv.Key) > 16 && string(kv.Key[:16]) == "/registry/events"; ev && kv.Lease != int64(lease.ID) {
			t.Errorf("%s: lease %x, want %x", kv.Key, kv.Lease, lease.ID)
		}
	}
	for _, e := range evs {
		if maxRev <= e.revision {
			t.Errorf("no write after %s (at revision %d, last write at %d): the run was not under way", e.what, e.revision, maxRev)
		}
	}
	if l, err := ec.WaitLeader(ctx); err != nil || l == stopped {
		t.Errorf("leader %d (%v) at the end, stopped %d", l, err, stopped)
	}

	// The journal is complete: an intent and a done record for every key,
	// the done record naming the mod revision the key has now.
	intents, done := map[string]int{}, map[string]int64{}
	err = undo.ReadJournal(journal, func(r undo.JournalRecord) error {
		switch r.Op {
		case "intent":
			intents[r.Key]++
		case "done":
			done[r.Key] = r.NewModRevision
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key, rev := range lastWrite {
		if intents[key] != 1 || done[key] != rev {
			t.Errorf("journal of %s: %d intents, done at %d; etcd has it at %d", key, intents[key], done[key], rev)
		}
	}

	// A verify afterwards (the killed member still down) says current.
	rep, err := verify.Run(ctx, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), verify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ExitCode() != verify.ExitCurrent || rep.Summary.Current != n {
		t.Fatalf("verify after the run: exit %d, %+v", rep.ExitCode(), rep.Summary)
	}
	assertSameObjects(t, before, snapshotObjects(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}})))

	// With the member back, a rollback from the journal restores every byte.
	if err := ec.Members[stopped].Restart(); err != nil {
		t.Fatal(err)
	}
	rb, err := rollback.Rollback(ctx, cli, journal, &etcdscan.Writer{Client: cli})
	if err != nil || rb.Restored != n || rb.Failed != 0 || rb.Skipped != 0 {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	got := c.Raw()
	for k, v := range raw {
		if got[k] != v {
			t.Fatalf("%s: not restored byte for byte", k)
		}
	}
}
