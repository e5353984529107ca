package rollback

import (
	"context"
	"fmt"
	"kube-etcd-migrate/undo"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestConcurrentRollbackKeepsEachKeysOrder: a rollback decides and writes
// its batches concurrently, and a key written twice (a rerun appended to
// the same journal) is still undone newest write first: every key ends
// byte for byte as it was before the first write, none skipped, and the
// rollback's own journal records each restore.
func TestConcurrentRollbackKeepsEachKeysOrder(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	const n, twice = 600, 150 // every fourth key twice
	key := func(i int) string { return fmt.Sprintf("/registry/secrets/ns/s-%04d", i) }
	val := func(gen, i int) []byte { return []byte(fmt.Sprintf("value %d of %d", gen, i)) }
	for i := 0; i < n; i++ {
		if _, err := cli.Put(ctx, key(i), string(val(0, i))); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "journal")
	j, err := undo.OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(1, "/registry"); err != nil {
		t.Fatal(err)
	}
	w := &etcdscan.Writer{Client: cli}
	rewrite := func(gen, i int) {
		resp, err := cli.Get(ctx, key(i))
		if err != nil {
			t.Fatal(err)
		}
		kv := resp.Kvs[0]
		p := etcdscan.Put{Key: key(i), Value: val(gen, i), ModRevision: kv.ModRevision}
		if err := j.Intents([]etcdscan.Put{p}, [][]byte{kv.Value}); err != nil {
			t.Fatal(err)
		}
		if err := j.Done(w.Write(ctx, []etcdscan.Put{p})); err != nil {
			t.Fatal(err)
		}
	}
	// Each key written twice is written again right after its first
	// write: read backwards, its two records meet in one batch or in two
	// sent one after the other.
	for i := 0; i < n; i++ {
		rewrite(1, i)
		if i%4 == 0 {
			rewrite(2, i)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	own, err := undo.OpenJournal(filepath.Join(dir, "rollback-journal"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := RollbackJournals(ctx, cli, &etcdscan.Writer{Client: cli}, []string{path}, RollbackOptions{BatchOps: 4, Writers: 8, Journal: own})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if res.Restored != n+twice || res.Skipped != 0 || res.Failed != 0 || res.Unchanged != 0 {
		t.Fatalf("rollback: %+v, want %d restored and nothing else", res, n+twice)
	}
	got, err := cli.Get(ctx, "/registry/secrets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != n {
		t.Fatalf("%d keys after the rollback, want %d", len(got.Kvs), n)
	}
	for i, kv := range got.Kvs {
		if string(kv.Value) != string(val(0, i)) {
			t.Errorf("%s: %q after the rollback, want %q", kv.Key, kv.Value, val(0, i))
		}
	}
	var intents, done int
	if err := undo.ReadJournal(filepath.Join(dir, "rollback-journal"), func(r undo.JournalRecord) error {
		switch r.Op {
		case "intent":
			intents++
		case "done":
			done++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if intents != n+twice || done != n+twice {
		t.Errorf("the rollback's own journal: %d intents, %d done, want %d each", intents, done, n+twice)
	}
}
