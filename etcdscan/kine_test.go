package etcdscan

import (
	"context"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
)

// kineKey is the i-th key the kine tests seed: every even one an event
// attached to a lease.
func kineKey(i int) string {
	if i%2 == 0 {
		return fmt.Sprintf("/registry/events/ns/e-%03d", i)
	}
	return fmt.Sprintf("/registry/secrets/ns/s-%03d", i)
}

// seedKine creates n keys through kine as kube-apiserver does (the even
// ones attached to a lease of an hour) and returns the lease and the keys
// as a Scan reads them, in key order.
func seedKine(t *testing.T, c *clientv3.Client, n int) (int64, []KV) {
	t.Helper()
	lease := testkine.Lease(t, c, 3600)
	if lease != 3600 {
		t.Fatalf("kine granted lease %d for a TTL of 3600", lease)
	}
	for i := 0; i < n; i++ {
		var l int64
		if i%2 == 0 {
			l = lease
		}
		testkine.Create(t, c, kineKey(i), fmt.Sprintf("value %d", i), l)
	}
	kvs := append(readAll(t, c, "/registry/events/"), readAll(t, c, "/registry/secrets/")...)
	if len(kvs) != n {
		t.Fatalf("%d keys read back, want %d", len(kvs), n)
	}
	return lease, kvs
}

// TestKineWriter: a Writer with Kine rewrites keys on kine one CAS
// transaction each, in kube-apiserver's shapes: every key written (its new
// mod revision returned, its value the new one), a leased key keeps its
// lease (given as read, or read by the writer when the put has no Read),
// a key changed or deleted since it was read is a Conflict naming it, and
// a delete and creations (with a lease and without) are written.
func TestKineWriter(t *testing.T) {
	ctx := context.Background()
	c := testkine.Start(t)
	const n = 40
	lease, kvs := seedKine(t, c, n)
	byKey := map[string]KV{}
	for _, kv := range kvs {
		byKey[kv.Key] = kv
		if want := map[bool]int64{true: lease, false: 0}[strings.HasPrefix(kv.Key, "/registry/events/")]; kv.Lease != want {
			t.Fatalf("%s read with lease %d, want %d", kv.Key, kv.Lease, want)
		}
	}
	// After the read: someone updates one key and deletes another.
	changed, deleted, removed := kineKey(3), kineKey(6), kineKey(9)
	changedNoRead := kineKey(5) // changed, and put without Read
	testkine.Update(t, c, changed, "newer, written by the apiserver", byKey[changed].ModRevision, 0)
	testkine.Update(t, c, changedNoRead, "newer, written by the apiserver", byKey[changedNoRead].ModRevision, 0)
	testkine.Delete(t, c, deleted, byKey[deleted].ModRevision)
	noRead := kineKey(10) // a leased key put without Read: the writer reads its lease

	var puts []Put
	for _, kv := range kvs {
		p := Put{Key: kv.Key, Value: []byte("migrated " + kv.Key), ModRevision: kv.ModRevision, Read: kv.Meta()}
		switch kv.Key {
		case noRead, changedNoRead:
			p.Read = KVMeta{}
		case removed:
			p = Put{Key: kv.Key, ModRevision: kv.ModRevision, Read: kv.Meta(), Delete: true}
		}
		puts = append(puts, p)
	}
	createdLeased, created := "/registry/events/ns/new-leased", "/registry/secrets/ns/new"
	puts = append(puts,
		Put{Key: createdLeased, Value: []byte("created with a lease"), Lease: lease},
		Put{Key: created, Value: []byte("created")})

	w := &Writer{Client: c, Kine: true}
	res := w.Write(ctx, puts)
	if len(res) != len(puts) {
		t.Fatalf("%d results for %d puts", len(res), len(puts))
	}
	for i, r := range res {
		p := puts[i]
		if r.Key != p.Key {
			t.Fatalf("result %d is for %s, want %s", i, r.Key, p.Key)
		}
		got := testkine.Get(t, c, p.Key)
		switch p.Key {
		case changed, changedNoRead:
			if r.Status != Conflict || r.Err == nil || !strings.Contains(r.Err.Error(), p.Key) || !strings.Contains(r.Err.Error(), "modified") {
				t.Errorf("changed key: %v %v", r.Status, r.Err)
			}
			if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "newer, written by the apiserver" {
				t.Errorf("changed key overwritten: %v", got.Kvs)
			}
			continue
		case deleted:
			if r.Status != Conflict || r.Err == nil || !strings.Contains(r.Err.Error(), deleted) || !strings.Contains(r.Err.Error(), "deleted") {
				t.Errorf("deleted key: %v %v", r.Status, r.Err)
			}
			if len(got.Kvs) != 0 {
				t.Errorf("deleted key is back: %v", got.Kvs)
			}
			continue
		}
		if r.Status != Written || r.Err != nil || r.NewModRevision == 0 {
			t.Errorf("%s: %v %v (mod revision %d), want written", p.Key, r.Status, r.Err, r.NewModRevision)
			continue
		}
		if p.Delete {
			if len(got.Kvs) != 0 {
				t.Errorf("%s: still there after its delete: %v", p.Key, got.Kvs)
			}
			continue
		}
		if len(got.Kvs) != 1 {
			t.Errorf("%s: %d keys read back", p.Key, len(got.Kvs))
			continue
		}
		kv := got.Kvs[0]
		if string(kv.Value) != string(p.Value) || kv.ModRevision != r.NewModRevision {
			t.Errorf("%s: read back %q at mod revision %d, want %q at %d", p.Key, kv.Value, kv.ModRevision, p.Value, r.NewModRevision)
		}
		if want := map[bool]int64{true: lease, false: 0}[strings.HasPrefix(p.Key, "/registry/events/")]; kv.Lease != want {
			t.Errorf("%s: lease %d after the write, want %d", p.Key, kv.Lease, want)
		}
	}
	// changedNoRead's conflict is found reading its lease: nothing sent.
	if st := w.Stats(); st.Txns != 0 || st.Fallbacks != 0 || st.Singles != int64(len(puts)-1) {
		t.Errorf("stats %+v: want every put a transaction of its own", st)
	}

	// A second write at the old mod revisions: every key a Conflict.
	again := w.Write(ctx, puts[:4])
	for _, r := range again {
		if r.Status != Conflict {
			t.Errorf("%s written again at its old mod revision: %v %v", r.Key, r.Status, r.Err)
		}
	}
}

// TestKineWriterNeedsKineMode: the etcd writer's transactions on kine. A
// batch of keys in one transaction is refused (nothing written); a single
// key's update with IgnoreLease passes kine's update shape and detaches
// the key from its lease, which is what Kine prevents.
func TestKineWriterNeedsKineMode(t *testing.T) {
	ctx := context.Background()
	c := testkine.Start(t)
	lease, kvs := seedKine(t, c, 4)
	var puts []Put
	for _, kv := range kvs {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("migrated"), ModRevision: kv.ModRevision, Read: kv.Meta()})
	}
	w := &Writer{Client: c}
	for _, r := range w.Write(ctx, puts) {
		if r.Status != Failed || r.Err == nil || !strings.Contains(r.Err.Error(), "unsupported") {
			t.Errorf("%s: %v %v; want refused as unsupported", r.Key, r.Status, r.Err)
		}
	}
	for _, kv := range kvs {
		if got := testkine.Get(t, c, kv.Key); string(got.Kvs[0].Value) == "migrated" {
			t.Errorf("%s written by a refused transaction", kv.Key)
		}
	}
	leased := kvs[0] // an event
	if leased.Lease != lease {
		t.Fatalf("%s: lease %d, want %d", leased.Key, leased.Lease, lease)
	}
	r := w.Write(ctx, puts[:1])[0]
	got := testkine.Get(t, c, leased.Key).Kvs[0]
	if r.Status != Written || got.Lease != 0 {
		t.Fatalf("one key without Kine: %v %v, lease %d after; want written and the lease lost (kine takes the put's lease, none)", r.Status, r.Err, got.Lease)
	}
}
