package liveness

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// runWatch starts a watch of /registry with a short window and waits for its
// verdict (nothing written): the run may write from then on.
func runWatch(t *testing.T) (*clientv3.Client, *Watch) {
	t.Helper()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	ctx := context.Background()
	for _, k := range []string{"/registry/secrets/a/s1", "/registry/secrets/a/s2", "/registry/configmaps/a/c1"} {
		if _, err := cli.Put(ctx, k, "old"); err != nil {
			t.Fatal(err)
		}
	}
	w, err := Start(ctx, cli, "/registry", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	rep, err := w.Window(ctx)
	if err != nil || rep.Live() {
		t.Fatalf("window: %+v, %v", rep, err)
	}
	return cli, w
}

// write is one request of "the run": announced, sent, its outcome given
// after delay (etcd's event comes before the answer when delay > 0).
func write(t *testing.T, cli *clientv3.Client, w *Watch, delay time.Duration, key, value string) int64 {
	t.Helper()
	tok, err := w.Begin()
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	resp, err := cli.Txn(context.Background()).Then(clientv3.OpPut(key, value)).Commit()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay)
	w.Applied(tok, resp.Header.Revision)
	return resp.Header.Revision
}

// settled fails unless the watch, settled, found nothing but the run's writes.
func settled(t *testing.T, w *Watch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Settle(ctx); err != nil {
		t.Fatalf("settle: %v", err)
	}
}

// TestWatchOwnWrites: the run's writes, their events seen before or after
// their answers, and a write whose request failed in a way that may have
// been applied (its key and value match), stop nothing; etcd deleting a key
// whose lease ran out neither.
func TestWatchOwnWrites(t *testing.T) {
	cli, w := runWatch(t)
	ctx := context.Background()
	write(t, cli, w, 0, "/registry/secrets/a/s1", "new1")
	// The event arrives long before the answer: held, then the run's.
	write(t, cli, w, 300*time.Millisecond, "/registry/secrets/a/s2", "new2")
	// An outcome never known: the same key and value are the run's.
	tok, err := w.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/registry/configmaps/a/c1", "new3"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	w.Unknown(tok, []Possible{{Key: "/registry/configmaps/a/c1", Value: []byte("new3")}})
	// A key etcd deletes when its lease is revoked (as when it runs out).
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	tok, err = w.Begin()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, "/registry/events/a/e1", "ev", clientv3.WithLease(lease.ID))
	if err != nil {
		t.Fatal(err)
	}
	w.Applied(tok, resp.Header.Revision)
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	settled(t, w)
	if err := w.Stopped(); err != nil {
		t.Fatalf("stopped: %v", err)
	}
}

// TestWatchAnotherWriter: a write that is not the run's, made while one of
// the run's requests has no answer yet, is held until that answer and then
// stops the run: Begin refuses, the error names the key, its revision and
// the kube-apiserver whose identity lease was written meanwhile.
func TestWatchAnotherWriter(t *testing.T) {
	cli, w := runWatch(t)
	ctx := context.Background()
	write(t, cli, w, 0, "/registry/secrets/a/s1", "new1")
	tok, err := w.Begin()
	if err != nil {
		t.Fatal(err)
	}
	other, err := cli.Put(ctx, "/registry/ranges/serviceips", "x")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := w.Stopped(); err != nil {
		t.Fatalf("judged before the run's request in flight had its answer: %v", err)
	}
	w.NotApplied(tok)
	select {
	case <-w.Stopping():
	case <-time.After(time.Second):
		t.Fatal("not stopped a second after the answer")
	}
	if _, err := w.Begin(); err == nil {
		t.Fatal("Begin after the stop: no error")
	}
	if _, err := cli.Put(ctx, "/registry/leases/kube-system/apiserver-x1", string(identityLease(t, "apiserver-x1", "cp-1"))); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "/registry/secrets/a/s2"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = w.Settle(sctx)
	var we *WriterError
	if !errors.As(err, &we) {
		t.Fatalf("settle: %v, want a WriterError", err)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{
		"stopped: a writer appeared",
		"/registry/ranges/serviceips written at revision " + strconv.FormatInt(other.Header.Revision, 10),
		"/registry/secrets/a/s2 deleted at revision",
		"cp-1: /registry/leases/kube-system/apiserver-x1 written at revision",
		"journaled",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q", want)
		}
	}
	if strings.Contains(msg, "/registry/secrets/a/s1") {
		t.Errorf("error names the run's own write")
	}
}

// TestWatchJudgedBeforeCompaction: the run's compaction, once the watch has
// judged every revision it removes, leaves the watch whole; a later write of
// another is still seen.
func TestWatchJudgedBeforeCompaction(t *testing.T) {
	cli, w := runWatch(t)
	ctx := context.Background()
	rev := write(t, cli, w, 0, "/registry/secrets/a/s1", "new1")
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := w.WaitJudged(wctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	write(t, cli, w, 0, "/registry/secrets/a/s2", "new2")
	settled(t, w)
	if _, err := cli.Put(ctx, "/registry/secrets/a/s1", "theirs"); err != nil {
		t.Fatal(err)
	}
	if err := w.Settle(wctx); !errors.As(err, new(*WriterError)) {
		t.Fatalf("settle after another's write: %v", err)
	}
}

// TestWatchDoesNotEchoTheRunsWrites: once the window's verdict is in, etcd
// does not send the run's own writes back (its watch is closed while every
// revision is the run's); a write outside the prefix is no writer; a write
// of another while the run writes nothing is seen within 2 s, without a
// request of the run to notice it.
func TestWatchDoesNotEchoTheRunsWrites(t *testing.T) {
	cli, w := runWatch(t)
	ctx := context.Background()
	for i := range 200 {
		write(t, cli, w, 0, "/registry/secrets/a/s"+strconv.Itoa(i%2+1), "v"+strconv.Itoa(i))
	}
	settled(t, w)
	w.mu.Lock()
	sent := w.sent
	w.mu.Unlock()
	if sent > 0 {
		t.Errorf("etcd sent back %d of the run's 200 writes", sent)
	}
	// A revision that is not the run's: looked at, and outside the prefix.
	if _, err := cli.Put(ctx, "/kube-etcd-migrate/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	write(t, cli, w, 0, "/registry/secrets/a/s1", "last")
	settled(t, w)
	put, err := cli.Put(ctx, "/registry/configmaps/a/c1", "theirs")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Stopping():
	case <-time.After(2 * time.Second):
		t.Fatal("another's write not seen within 2 s while the run wrote nothing")
	}
	err = w.Stopped()
	if !strings.Contains(fmt.Sprint(err), "/registry/configmaps/a/c1 written at revision "+strconv.FormatInt(put.Header.Revision, 10)) {
		t.Fatalf("stopped: %v, want the configmap named", err)
	}
}

// identityLease is a kube-apiserver identity lease as it stores it (protobuf).
func identityLease(t *testing.T, name, host string) []byte {
	t.Helper()
	l := &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": host}},
	}
	s := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := protobuf.NewSerializer(s, s).Encode(l, &b); err != nil {
		t.Fatal(err)
	}
	return []byte(b.String())
}
