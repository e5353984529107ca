package undo

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"kube-etcd-migrate/etcdscan"
)

// benchBatch is a batch of n rewrites as a key rotation journals them:
// secrets of 2 KB stored with aescbc under key1, rewritten under key2.
func benchBatch(n int) ([]etcdscan.Put, [][]byte, []etcdscan.PutResult) {
	rnd := rand.New(rand.NewSource(1))
	value := func(key string) []byte {
		v := make([]byte, 2048)
		rnd.Read(v)
		return append([]byte("k8s:enc:aescbc:v1:"+key+":"), v...)
	}
	puts, old, res := make([]etcdscan.Put, n), make([][]byte, n), make([]etcdscan.PutResult, n)
	for i := range puts {
		key := fmt.Sprintf("/registry/secrets/bench-ns-%02d/secret-%06d", i%20, i)
		puts[i] = etcdscan.Put{Key: key, Value: value("key2"), ModRevision: int64(1000 + i)}
		old[i] = value("key1")
		res[i] = etcdscan.PutResult{Key: key, Status: etcdscan.Written, NewModRevision: int64(100000 + i)}
	}
	return puts, old, res
}

// BenchmarkJournalBatch: the journal's own CPU for one batch of 16 rewrites
// (its intents, then its done records), its fsyncs left out (the same
// number before and after any change to the encoding).
func BenchmarkJournalBatch(b *testing.B) {
	syncFile = func(*os.File) error { return nil }
	defer func() { syncFile = (*os.File).Sync }()
	j, err := OpenJournal(filepath.Join(b.TempDir(), "journal"))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	if err := j.Begin(1, "/registry"); err != nil {
		b.Fatal(err)
	}
	puts, old, res := benchBatch(16)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := j.Intents(puts, old); err != nil {
			b.Fatal(err)
		}
		if err := j.Done(res); err != nil {
			b.Fatal(err)
		}
	}
}
