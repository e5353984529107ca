package rollback

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/undo"
)

// TestRollbackOnKine: a rewrite on kine (every key rewritten, some twice,
// two removed as quarantine removes them, one of them an event with a
// lease) is journaled and rolled back on kine (a dry run first, which
// writes nothing): every key is back byte for
// byte with its lease (kine's: the TTL, 3600), the removed ones created
// again with theirs, none skipped or failed. The rollback's own journal,
// undone in turn, gives the rewrite's state again (the keys created again
// removed).
func TestRollbackOnKine(t *testing.T) {
	ctx := context.Background()
	cli := testkine.Start(t)
	lease := testkine.Lease(t, cli, 3600)
	const n = 30
	key := func(i int) string {
		if i%2 == 0 {
			return fmt.Sprintf("/registry/events/ns/e-%03d", i)
		}
		return fmt.Sprintf("/registry/secrets/ns/s-%03d", i)
	}
	leaseOf := func(i int) int64 {
		if i%2 == 0 {
			return lease
		}
		return 0
	}
	// protobuf-like bytes: a NUL, the k8s magic, bytes above 0x7f
	val := func(gen, i int) []byte { return []byte(fmt.Sprintf("k8s\x00\n\xff\xfe value %d of %d", gen, i)) }
	for i := 0; i < n; i++ {
		testkine.Create(t, cli, key(i), string(val(0, i)), leaseOf(i))
	}
	removed := map[int]bool{4: true, 7: true}

	dir := t.TempDir()
	path := filepath.Join(dir, "journal")
	j, err := undo.OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(1, "/registry"); err != nil {
		t.Fatal(err)
	}
	w := &etcdscan.Writer{Client: cli, Kine: true}
	read := func(i int) etcdscan.KV {
		resp := testkine.Get(t, cli, key(i))
		if len(resp.Kvs) != 1 {
			t.Fatalf("%s: %d keys", key(i), len(resp.Kvs))
		}
		kv := resp.Kvs[0]
		return etcdscan.KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
	}
	rewrite := func(gen, i int) {
		kv := read(i)
		p := etcdscan.Put{Key: kv.Key, Value: val(gen, i), ModRevision: kv.ModRevision, Read: kv.Meta()}
		if err := j.Intents([]etcdscan.Put{p}, [][]byte{kv.Value}); err != nil {
			t.Fatal(err)
		}
		res := w.Write(ctx, []etcdscan.Put{p})
		if res[0].Status != etcdscan.Written {
			t.Fatalf("rewrite %s: %v %v", kv.Key, res[0].Status, res[0].Err)
		}
		if err := j.Done(res); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(i int) {
		kv := read(i)
		if err := j.DeleteIntents([]undo.DeleteIntent{{Key: kv.Key, Value: kv.Value, ModRevision: kv.ModRevision,
			CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease, Reason: "test"}}); err != nil {
			t.Fatal(err)
		}
		res := w.Write(ctx, []etcdscan.Put{{Key: kv.Key, ModRevision: kv.ModRevision, Read: kv.Meta(), Delete: true}})
		if res[0].Status != etcdscan.Written {
			t.Fatalf("remove %s: %v %v", kv.Key, res[0].Status, res[0].Err)
		}
		if err := j.Deleted(res); err != nil {
			t.Fatal(err)
		}
	}
	twice := 0
	for i := 0; i < n; i++ {
		rewrite(1, i)
		if i%3 == 0 {
			rewrite(2, i)
			twice++
		}
		if removed[i] {
			remove(i)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// The rewrite's state, for the rollback of the rollback.
	rewritten := map[int][]byte{}
	for i := 0; i < n; i++ {
		if !removed[i] {
			kv := read(i)
			rewritten[i] = kv.Value
			if kv.Lease != leaseOf(i) {
				t.Fatalf("%s: lease %d after the rewrite, want %d", key(i), kv.Lease, leaseOf(i))
			}
		}
	}

	// A dry run decides the same and writes nothing.
	dry, err := RollbackJournals(ctx, cli, &etcdscan.Writer{Client: cli, Kine: true}, []string{path}, RollbackOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := n + twice + len(removed); dry.Restored != want || dry.Skipped != 0 || dry.Failed != 0 || dry.Unchanged != 0 {
		t.Fatalf("dry run: %+v, want %d restored and nothing else", dry, want)
	}
	for i := 0; i < n; i++ {
		if removed[i] {
			if resp := testkine.Get(t, cli, key(i)); len(resp.Kvs) != 0 {
				t.Fatalf("%s: created again by a dry run", key(i))
			}
		} else if kv := read(i); string(kv.Value) != string(rewritten[i]) {
			t.Fatalf("%s: changed by a dry run", key(i))
		}
	}

	ownPath := filepath.Join(dir, "rollback-journal")
	own, err := undo.OpenJournal(ownPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Begin(1, "/registry"); err != nil {
		t.Fatal(err)
	}
	res, err := RollbackJournals(ctx, cli, &etcdscan.Writer{Client: cli, Kine: true}, []string{path}, RollbackOptions{BatchOps: 4, Writers: 4, Journal: own})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if want := n + twice + len(removed); res.Restored != want || res.Skipped != 0 || res.Failed != 0 || res.Unchanged != 0 || len(res.Notes) != 0 {
		t.Fatalf("rollback: %+v, want %d restored and nothing else", res, want)
	}
	for i := 0; i < n; i++ {
		kv := read(i)
		if string(kv.Value) != string(val(0, i)) || kv.Lease != leaseOf(i) {
			t.Errorf("%s: %q with lease %d after the rollback, want %q with lease %d", kv.Key, kv.Value, kv.Lease, val(0, i), leaseOf(i))
		}
	}

	// The rollback undone: the rewrite's values, the removed keys gone.
	res, err = RollbackJournals(ctx, cli, &etcdscan.Writer{Client: cli, Kine: true}, []string{ownPath}, RollbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := n + twice + len(removed); res.Restored != want || res.Skipped != 0 || res.Failed != 0 {
		t.Fatalf("rollback of the rollback: %+v, want %d restored", res, want)
	}
	for i := 0; i < n; i++ {
		if removed[i] {
			if resp := testkine.Get(t, cli, key(i)); len(resp.Kvs) != 0 {
				t.Errorf("%s: there after the rollback of its re-creation", key(i))
			}
			continue
		}
		kv := read(i)
		if string(kv.Value) != string(rewritten[i]) || kv.Lease != leaseOf(i) {
			t.Errorf("%s: %q with lease %d after the rollback of the rollback, want %q with lease %d", kv.Key, kv.Value, kv.Lease, rewritten[i], leaseOf(i))
		}
	}
}
