package plan

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/reencode"
)

// TestSampleWrites: the write sample writes each key it kept once, through
// kine on SQLite as migrate writes it (a compare-and-swap at the mod
// revision read, its lease kept, a value of the rewrite's size), in timed
// rounds of migrate's batches; a key changed since it was read stops the
// sample, its error naming the copy and the datastore.
func TestSampleWrites(t *testing.T) {
	ctx := context.Background()
	srv, cli := testkine.Serve(t)
	s := newSampler(4)
	s.chunkN, s.batchOps = writeChunks, 16
	var page []reencode.Decision
	var want int64
	for i := range 40 {
		key := fmt.Sprintf("/registry/secrets/default/s-%02d", i)
		lease := int64(0)
		if i%2 == 0 {
			lease = 3600
		}
		rev := testkine.Create(t, cli, key, "old", lease)
		page = append(page, reencode.Decision{Key: key, Status: reencode.Stale, ModRevision: rev, Read: etcdscan.KVMeta{CreateRevision: rev, Version: 1, Lease: lease}, NewValue: make([]byte, 100+i)})
		want += guard.PutCostSize(len(key), 100+i)
	}
	s.page(page)
	cp := &SQLiteCopy{Copy: srv.Database, Datastore: "the SQLite datastore /node/state.db"}
	ws := s.sampleWrites(ctx, cli, cp, 16)
	if ws.Error != "" || ws.Writes != 40 || ws.Batches != 3 || ws.Writers != 16 || len(ws.Rounds) != 3 || ws.Bytes != want || ws.Seconds <= 0 {
		t.Fatalf("write sample %+v; want 40 writes (%d bytes) in 3 batches, 3 rounds", ws, want)
	}
	for i, d := range page {
		kv := testkine.Get(t, cli, d.Key).Kvs
		if len(kv) != 1 || !bytes.Equal(kv[0].Value, make([]byte, 100+i)) || kv[0].Lease != d.Read.Lease || kv[0].ModRevision <= d.ModRevision {
			t.Errorf("%s after the sample: %+v; want %d zeros written, lease %d kept", d.Key, kv, 100+i, d.Read.Lease)
		}
	}

	// Large values: the batches beyond the bound on the values written
	// are left out (the one that crosses it kept).
	big := newSampler(4)
	big.chunkN, big.batchOps = writeChunks, 4
	var large []reencode.Decision
	const mib15 = 3 << 19 // 1.5 MiB, about the most a request carries
	for i := range 28 {
		key := fmt.Sprintf("/registry/configmaps/default/big-%02d", i)
		rev := testkine.Create(t, cli, key, "old", 0)
		large = append(large, reencode.Decision{Key: key, Status: reencode.Stale, ModRevision: rev, Read: etcdscan.KVMeta{CreateRevision: rev, Version: 1}, NewValue: make([]byte, mib15)})
	}
	big.page(large)
	// 7 batches of 6 MiB: the sixth crosses 32 MiB.
	if ws := big.sampleWrites(ctx, cli, cp, 16); ws.Error != "" || ws.Writes != 24 || ws.Batches != 6 {
		t.Errorf("a sample of %d batches of 4 values of 1.5 MiB: %d writes in %d batches (%s); want the 6 batches up to the first past %d bytes", len(big.chunks), ws.Writes, ws.Batches, ws.Error, writeSampleBytes)
	}

	// Written again at the revisions read: each one changed since.
	s2 := newSampler(4)
	s2.chunkN, s2.batchOps = writeChunks, 16
	s2.page(page[:3])
	ws = s2.sampleWrites(ctx, cli, cp, 16)
	if ws.Writes != 0 || !strings.Contains(ws.Error, "writing plan's copy "+srv.Database+" of the SQLite datastore /node/state.db: conflict") {
		t.Errorf("a sample of keys changed since: %+v; want it stopped, naming the copy and the datastore", ws)
	}
}
