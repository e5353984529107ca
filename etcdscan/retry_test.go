package etcdscan

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"kube-etcd-migrate/internal/testrig/testetcd"
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

func TestScanSurvivesEtcdRestart(t *testing.T) { testetcd.Each(t, testScanSurvivesEtcdRestart) }

func testScanSurvivesEtcdRestart(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	keys := putLarge(t, c, "/registry/pods/", 80)
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

func TestWriterSurvivesEtcdRestart(t *testing.T) { testetcd.Each(t, testWriterSurvivesEtcdRestart) }

func testWriterSurvivesEtcdRestart(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
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

// TestWithRetry: transient errors are retried (and make the outcome ambiguous),
// others are returned at once, the last error when the retries run out, and the
// context's error when it ends during the wait.
func TestWithRetry(t *testing.T) {
	ctx := context.Background()
	calls := 0
	amb, err := withRetry(ctx, time.Second, 3, func(context.Context) error {
		if calls++; calls < 3 {
			return rpctypes.ErrLeaderChanged
		}
		return nil
	})
	if err != nil || !amb || calls != 3 {
		t.Errorf("two leader changes then success: ambiguous %v, err %v, %d calls", amb, err, calls)
	}

	// During a leader transfer etcd passes raft's "proposal dropped" on as an
	// unknown gRPC error, and "raft: stopped" from a member going down:
	// retried too.
	for _, raftErr := range []error{raft.ErrProposalDropped, raft.ErrStopped} {
		calls = 0
		amb, err = withRetry(ctx, time.Second, 3, func(context.Context) error {
			if calls++; calls < 2 {
				return status.Error(codes.Unknown, raftErr.Error())
			}
			return nil
		})
		if err != nil || !amb || calls != 2 {
			t.Errorf("%v then success: ambiguous %v, err %v, %d calls", raftErr, amb, err, calls)
		}
	}

	calls = 0
	amb, err = withRetry(ctx, time.Second, 3, func(context.Context) error { calls++; return rpctypes.ErrPermissionDenied })
	if !errors.Is(err, rpctypes.ErrPermissionDenied) || amb || calls != 1 {
		t.Errorf("permission denied: ambiguous %v, err %v, %d calls", amb, err, calls)
	}

	calls = 0
	amb, err = withRetry(ctx, time.Second, 2, func(context.Context) error { calls++; return rpctypes.ErrNoLeader })
	if !errors.Is(err, rpctypes.ErrNoLeader) || !amb || calls != 3 {
		t.Errorf("no leader throughout, 2 retries: ambiguous %v, err %v, %d calls", amb, err, calls)
	}

	// A per-attempt timeout is transient; the caller's deadline is not.
	calls = 0
	cctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	defer cancel()
	_, err = withRetry(cctx, 20*time.Millisecond, DefaultRetries, func(c context.Context) error {
		calls++
		<-c.Done()
		return c.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || calls < 2 || calls > 4 {
		t.Errorf("caller's deadline: err %v after %d calls", err, calls)
	}
}

// TestWriterStopsWhenEtcdStaysDown: etcd stopped for good under a write.
// Once its retries are spent the writer stops (a FatalError of cause
// CauseUnavailable, whose message names etcd's endpoint): the batch and every
// later put fail at once, none waits out the retries again. A scan of it
// fails the same way, naming the endpoint.
func TestWriterStopsWhenEtcdStaysDown(t *testing.T) {
	s, c := startClient(t, testetcd.Options{})
	putKeys(t, c, "/registry/secrets/", 8)
	var puts []Put
	for _, kv := range readAll(t, c, "/registry/secrets/") {
		puts = append(puts, Put{Key: kv.Key, Value: []byte("new"), ModRevision: kv.ModRevision})
	}
	s.Stop()
	w := &Writer{Client: c, MaxOps: 4, Retries: 2, CommandTimeout: 200 * time.Millisecond}
	res := w.Write(context.Background(), puts)
	fe := w.Stopped()
	if fe == nil || fe.Cause != CauseUnavailable {
		t.Fatalf("writer stopped with %v, want cause %s", fe, CauseUnavailable)
	}
	var ue *UnavailableError
	if !errors.As(fe, &ue) || ue.Attempts != 3 || !strings.Contains(fe.Error(), s.Endpoint+" did not answer (3 attempts, each given 200ms)") {
		t.Errorf("stop error %q (%+v)", fe, ue)
	}
	for _, r := range res {
		if r.Status != Failed || AsFatal(r.Err) == nil {
			t.Errorf("%s: %v %v, want failed with the stop", r.Key, r.Status, r.Err)
		}
	}
	if w.Stats().Txns != 0 {
		t.Errorf("stats %+v", w.Stats())
	}
	_, err := Scan(context.Background(), c, ScanOptions{Prefixes: []string{"/registry/secrets/"}, Retries: 1, CommandTimeout: 200 * time.Millisecond}, func([]KV) error { return nil })
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), s.Endpoint) {
		t.Errorf("scan of a stopped etcd: %v", err)
	}
}
