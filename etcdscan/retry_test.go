package etcdscan

import (
	"context"
	"testing"
	"time"

	"kube-etcd-migrate/internal/testetcd"
)

// restartAfter stops the member now and starts it again after a pause, as an
// etcd restart or a leader election does to a client.
func restartAfter(t *testing.T, s *testetcd.Server, pause time.Duration) <-chan error {
	t.Helper()
	s.Stop()
	done := make(chan error, 1)
	go func() {
		time.Sleep(pause)
		done <- s.Restart()
	}()
	return done
}

func TestScanSurvivesEtcdRestart(t *testing.T) {
	s, c := startClient(t, testetcd.Options{})
	keys := putKeys(t, c, "/registry/pods/", 40)
	var got []string
	var restarted <-chan error
	stats, err := Scan(context.Background(), c, ScanOptions{Prefixes: []string{"/registry/pods/"}, PageSize: 5, CommandTimeout: 300 * time.Millisecond}, func(page []KV) error {
		for _, kv := range page {
			got = append(got, kv.Key)
		}
		if restarted == nil {
			restarted = restartAfter(t, s, time.Second)
		}
		return nil
	})
	if rerr := <-restarted; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("scan across an etcd restart: %v", err)
	}
	if len(got) != len(keys) || !stats.Consistent {
		t.Fatalf("saw %d of %d keys, stats %+v", len(got), len(keys), stats)
	}
	for i := range keys {
		if got[i] != keys[i] {
			t.Fatalf("key %d: %s, want %s", i, got[i], keys[i])
		}
	}
}

func TestWriterSurvivesEtcdRestart(t *testing.T) {
	s, c := startClient(t, testetcd.Options{})
	putKeys(t, c, "/registry/secrets/", 10)
	var puts []Put
	for _, kv := range readAll(t, c, "/registry/secrets/") {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("new"), ModRevision: kv.ModRevision})
	}
	restarted := restartAfter(t, s, time.Second)
	w := &Writer{Client: c, MaxOps: 4, CommandTimeout: 300 * time.Millisecond}
	res := w.Write(context.Background(), puts)
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if val, modRev, _, _ := getKV(t, c, r.Key); r.Status != Written || val != "new" || modRev != r.NewModRevision {
			t.Errorf("%s: %v %v rev %d; etcd has %q at %d", r.Key, r.Status, r.Err, r.NewModRevision, val, modRev)
		}
	}
	if st := w.Stats(); st.Retries == 0 {
		t.Errorf("stats %+v: the outage should have cost retries", st)
	}
}
