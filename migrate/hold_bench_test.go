package migrate

import (
	"fmt"
	"math/rand"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/reencode"
)

// benchDecisions is a batch of n stale decisions as a key rotation makes
// them: secrets of 2 KB under aescbc key1, to be written under key2.
func benchDecisions(n int) []reencode.Decision {
	rnd := rand.New(rand.NewSource(1))
	value := func(key string) []byte {
		v := make([]byte, 2048)
		rnd.Read(v)
		return append([]byte("k8s:enc:aescbc:v1:"+key+":"), v...)
	}
	ds := make([]reencode.Decision, n)
	for i := range ds {
		form := func(key string) reencode.Form {
			return reencode.Form{Version: "v1", MediaType: "protobuf", Encryption: "aescbc:" + key}
		}
		ds[i] = reencode.Decision{
			Key:      fmt.Sprintf("/registry/secrets/bench-ns-%02d/secret-%06d", i%20, i),
			Resource: schema.GroupResource{Resource: "secrets"}, Status: reencode.Stale,
			Reasons: []reencode.Reason{reencode.ReasonEncryption}, From: form("key1"), To: form("key2"),
			ModRevision: int64(1000 + i), Read: etcdscan.KVMeta{CreateRevision: int64(900 + i), Version: 3},
			OldValue: value("key1"), NewValue: value("key2"),
		}
		ds[i].OldSize = len(ds[i].OldValue)
	}
	return ds
}

// BenchmarkSpool: a batch of 16 decisions kept while the first write
// waits, then drained (64 batches a spool, as a run's window fills it).
func BenchmarkSpool(b *testing.B) {
	ds := benchDecisions(16)
	dir := b.TempDir()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 64 {
		s, err := guard.OpenSpool[reencode.Decision](dir, guard.SpoolMax)
		if err != nil {
			b.Fatal(err)
		}
		for range min(64, b.N-i) {
			if !s.Add(ds, 1) {
				b.Fatal("the spool refused a batch")
			}
		}
		if err := s.Drain(func([]reencode.Decision) error { return nil }); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

// BenchmarkBacklog: a batch of 16 decisions pushed to the backlog and
// popped from it.
func BenchmarkBacklog(b *testing.B) {
	ds := benchDecisions(16)
	q, err := guard.OpenBacklog[reencode.Decision](b.TempDir(), guard.BacklogMax)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if !q.Push(ds) {
			b.Fatal("the backlog refused a batch")
		}
		if _, ok, err := q.Pop(); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkTallyPage: a page of 500 stale decisions tallied and its stale
// ones handed on, as the scan does with each page.
func BenchmarkTallyPage(b *testing.B) {
	page := make([]reencode.Decision, 0, 500)
	for len(page) < 500 {
		page = append(page, benchDecisions(16)...)
	}
	page = page[:500]
	t := newTally(false, func(schema.GroupResource) bool { return false })
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if stale, _ := t.page(page); len(stale) != 500 {
			b.Fatal(len(stale))
		}
	}
}
