package etcdscan

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// readAll returns the KVs under prefix, as a Scan would.
func readAll(t *testing.T, c *clientv3.Client, prefix string) []KV {
	t.Helper()
	var out []KV
	if _, err := Scan(context.Background(), c, ScanOptions{Prefixes: []string{prefix}}, func(page []KV) error {
		out = append(out, page...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func getKV(t *testing.T, c *clientv3.Client, key string) (value string, modRev, lease int64, exists bool) {
	t.Helper()
	resp, err := c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, 0, false
	}
	kv := resp.Kvs[0]
	return string(kv.Value), kv.ModRevision, kv.Lease, true
}

func TestWriterCASConflictsPerKey(t *testing.T) { testetcd.Each(t, testWriterCASConflictsPerKey) }

func testWriterCASConflictsPerKey(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	putKeys(t, c, "/registry/secrets/", 6)
	kvs := readAll(t, c, "/registry/secrets/")

	// After the read: someone updates key 2 and deletes key 4.
	if _, err := c.Put(ctx, kvs[2].Key, "newer, written by the apiserver"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, kvs[4].Key); err != nil {
		t.Fatal(err)
	}

	var puts []Put
	for _, kv := range kvs {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("migrated " + kv.Key), ModRevision: kv.ModRevision})
	}
	w := &Writer{Client: c}
	res := w.Write(ctx, puts)
	if len(res) != len(puts) {
		t.Fatalf("%d results for %d puts", len(res), len(puts))
	}
	for i, r := range res {
		if r.Key != puts[i].Key {
			t.Fatalf("result %d is for %s, want %s", i, r.Key, puts[i].Key)
		}
		val, modRev, _, exists := getKV(t, c, r.Key)
		switch i {
		case 2:
			if r.Status != Conflict || r.Err == nil || val != "newer, written by the apiserver" {
				t.Errorf("changed key: %v %v, value now %q", r.Status, r.Err, val)
			}
		case 4:
			if r.Status != Conflict || r.Err == nil || exists {
				t.Errorf("deleted key: %v %v, exists=%v", r.Status, r.Err, exists)
			}
		default:
			if r.Status != Written || r.Err != nil || val != string(puts[i].Value) || r.NewModRevision != modRev || modRev <= puts[i].ModRevision {
				t.Errorf("%s: %v %v rev %d, etcd has %q at mod revision %d", r.Key, r.Status, r.Err, r.NewModRevision, val, modRev)
			}
		}
	}
	if st := w.Stats(); st.Fallbacks != 1 || st.Singles != int64(len(puts)) {
		t.Errorf("stats %+v: want one failed transaction then %d single-key CAS", st, len(puts))
	}
	if Conflict.String() != "conflict" || Written.String() != "written" || Failed.String() != "failed" {
		t.Error("PutStatus.String")
	}

	// A batch without conflict is one transaction; all keys share its revision.
	kvs = readAll(t, c, "/registry/secrets/")
	puts = puts[:0]
	for _, kv := range kvs {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("again"), ModRevision: kv.ModRevision})
	}
	w2 := &Writer{Client: c}
	res = w2.Write(ctx, puts)
	for _, r := range res {
		if r.Status != Written || r.NewModRevision != res[0].NewModRevision {
			t.Errorf("%s: %v rev %d", r.Key, r.Status, r.NewModRevision)
		}
	}
	if st := w2.Stats(); st.Txns != 1 || st.Singles != 0 {
		t.Errorf("stats %+v: want one transaction", st)
	}
}

func TestWriterKeepsLease(t *testing.T) { testetcd.Each(t, testWriterKeepsLease) }

func testWriterKeepsLease(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	lease, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/events/default/e%d", i), "old", clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "/registry/events/default/no-lease", "old"); err != nil {
		t.Fatal(err)
	}
	var puts []Put
	for _, kv := range readAll(t, c, "/registry/events/") {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("new"), ModRevision: kv.ModRevision})
	}
	for _, r := range (&Writer{Client: c}).Write(ctx, puts) {
		if r.Status != Written {
			t.Fatalf("%s: %v %v", r.Key, r.Status, r.Err)
		}
	}
	for i := 0; i < 3; i++ {
		key := fmt.Sprintf("/registry/events/default/e%d", i)
		val, _, l, _ := getKV(t, c, key)
		if val != "new" || l != int64(lease.ID) {
			t.Errorf("%s: value %q lease %x, want lease %x", key, val, l, lease.ID)
		}
	}
	if _, _, l, _ := getKV(t, c, "/registry/events/default/no-lease"); l != 0 {
		t.Errorf("key without lease got lease %x", l)
	}
	ttl, err := c.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL <= 0 || ttl.TTL > 3600 || len(ttl.Keys) != 3 {
		t.Fatalf("lease after write: TTL %d, %d keys attached", ttl.TTL, len(ttl.Keys))
	}
	// The lease still governs the keys: when it goes, they go.
	if _, err := c.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, _, exists := getKV(t, c, "/registry/events/default/e0"); exists {
		t.Fatal("key outlived its lease after the write")
	}
}

// TestWriterDeletesAndCreates: a Delete removes a key only if it still has
// the mod revision read (in a batch and alone); a creation (mod revision 0)
// only if the key is absent, attached to the lease given.
func TestWriterDeletesAndCreates(t *testing.T) { testetcd.Each(t, testWriterDeletesAndCreates) }

func testWriterDeletesAndCreates(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	putKeys(t, c, "/registry/secrets/", 4)
	kvs := readAll(t, c, "/registry/secrets/")
	if _, err := c.Put(ctx, kvs[1].Key, "rewritten since read"); err != nil {
		t.Fatal(err)
	}
	var dels []Put
	for _, kv := range kvs {
		dels = append(dels, Put{Key: kv.Key, ModRevision: kv.ModRevision, Delete: true})
	}
	w := &Writer{Client: c}
	res := w.Write(ctx, dels)
	for i, r := range res {
		_, _, _, exists := getKV(t, c, r.Key)
		switch {
		case i == 1 && (r.Status != Conflict || !exists || !strings.Contains(r.Err.Error(), "delete "+r.Key)):
			t.Errorf("changed key: %v %v, exists %v", r.Status, r.Err, exists)
		case i != 1 && (r.Status != Written || exists || r.NewModRevision <= kvs[i].ModRevision):
			t.Errorf("%s: %v %v rev %d, exists %v", r.Key, r.Status, r.Err, r.NewModRevision, exists)
		}
	}

	lease, err := c.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	creates := []Put{
		{Key: kvs[0].Key, Value: []byte("back"), Lease: int64(lease.ID)},
		{Key: kvs[1].Key, Value: []byte("back")}, // still there: not created
		{Key: kvs[2].Key, Value: []byte("back")},
	}
	res = w.Write(ctx, creates)
	for i, want := range []struct {
		status PutStatus
		value  string
		lease  int64
	}{{Written, "back", int64(lease.ID)}, {Conflict, "rewritten since read", 0}, {Written, "back", 0}} {
		val, _, l, _ := getKV(t, c, creates[i].Key)
		if res[i].Status != want.status || val != want.value || l != want.lease {
			t.Errorf("create %s: %v %v, value %q lease %x; want %v %q lease %x", creates[i].Key, res[i].Status, res[i].Err, val, l, want.status, want.value, want.lease)
		}
	}
}

func TestWriterBatchesByBytes(t *testing.T) { testetcd.Each(t, testWriterBatchesByBytes) }

func testWriterBatchesByBytes(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version, MaxRequestBytes: 64 << 10})
	ctx := context.Background()
	for i := 0; i < 30; i++ {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/configmaps/ns/cm%02d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "/registry/configmaps/ns/zbig", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/registry/configmaps/ns/ztoobig", "x"); err != nil {
		t.Fatal(err)
	}
	value := func(key string) []byte {
		n := 10 << 10
		switch {
		case strings.HasSuffix(key, "zbig"):
			n = 50 << 10
		case strings.HasSuffix(key, "ztoobig"):
			n = 100 << 10 // above the server's 64 KiB limit
		}
		return bytes.Repeat([]byte(key[len(key)-1:]), n)
	}
	write := func(w *Writer) []PutResult {
		var puts []Put
		for _, kv := range readAll(t, c, "/registry/configmaps/") {
			puts = append(puts, Put{Key: kv.Key, Value: value(kv.Key), ModRevision: kv.ModRevision})
		}
		return w.Write(ctx, puts)
	}
	check := func(res []PutResult) {
		t.Helper()
		for _, r := range res {
			if strings.HasSuffix(r.Key, "ztoobig") {
				if r.Status != Failed || r.Err == nil || !strings.Contains(r.Err.Error(), "--max-request-bytes") {
					t.Errorf("%s: %v %v, want Failed naming --max-request-bytes", r.Key, r.Status, r.Err)
				}
				continue
			}
			val, _, _, _ := getKV(t, c, r.Key)
			if r.Status != Written || val != string(value(r.Key)) {
				t.Errorf("%s: %v %v (%d bytes stored)", r.Key, r.Status, r.Err, len(val))
			}
		}
	}

	// MaxBytes below the server limit: batches are cut before etcd sees them.
	w := &Writer{Client: c, MaxBytes: 60 << 10}
	check(write(w))
	if st := w.Stats(); st.Splits != 0 || st.Txns < 6 {
		// 30 x 10 KiB in 60 KiB batches; the 50 and 100 KiB puts go alone.
		t.Errorf("stats %+v: want >= 6 transactions and no split", st)
	}

	// MaxBytes above the server limit: etcd refuses, the batches are split.
	w = &Writer{Client: c, MaxBytes: 1 << 20}
	check(write(w))
	if st := w.Stats(); st.Splits == 0 {
		t.Errorf("stats %+v: want splits", st)
	}
}

func TestWriterSplitsOnTooManyOps(t *testing.T) { testetcd.Each(t, testWriterSplitsOnTooManyOps) }

func testWriterSplitsOnTooManyOps(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version, MaxTxnOps: 4})
	putKeys(t, c, "/registry/leases/", 20)
	var puts []Put
	for _, kv := range readAll(t, c, "/registry/leases/") {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("new"), ModRevision: kv.ModRevision})
	}
	w := &Writer{Client: c, MaxOps: 16}
	for _, r := range w.Write(context.Background(), puts) {
		if val, _, _, _ := getKV(t, c, r.Key); r.Status != Written || val != "new" {
			t.Errorf("%s: %v %v, value %q", r.Key, r.Status, r.Err, val)
		}
	}
	if st := w.Stats(); st.Splits == 0 {
		t.Errorf("stats %+v: a 16-op transaction on a --max-txn-ops=4 server must be split", st)
	}
}
