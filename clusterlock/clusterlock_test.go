package clusterlock

import (
	"context"
	"errors"
	"kube-etcd-migrate/undo"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

func client(t *testing.T, url string, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Username: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestOneHolderNamedAndFreedByItsLease: two clients (two nodes) against one
// etcd: the second is refused while the first holds the lock, the refusal
// naming the holder's run, host, PID and state directory; once the first
// finishes, the second takes it, and both runs are in the cluster's list
// with their ends. A holder that stops keeping its lease alive (its process
// killed) frees the lock when the lease expires.
func TestOneHolderNamedAndFreedByItsLease(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	ctx := context.Background()
	a, b := client(t, srv.URL, "", ""), client(t, srv.URL, "", "")
	runA := Run{Header: undo.Header{ID: "0001-migrate", Command: "migrate", Host: "cp-1", PID: 101, Start: time.Now().UTC()}, StateDir: "/var/lib/kube-etcd-migrate"}
	runB := Run{Header: undo.Header{ID: "0001-migrate", Command: "migrate", Host: "cp-2", PID: 202, Start: time.Now().UTC()}, StateDir: "/var/lib/kube-etcd-migrate"}

	if h, err := Holder(ctx, b); err != nil || h != nil {
		t.Fatalf("holder of a free lock: %v %v", h, err)
	}
	la, err := Acquire(ctx, a, runA, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Holder(ctx, b)
	if err != nil || h == nil || h.Holder.Host != "cp-1" || h.Holder.PID != 101 {
		t.Fatalf("holder: %+v %v", h, err)
	}
	_, err = Acquire(ctx, b, runB, 10*time.Second)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second acquire: %v, want a HeldError", err)
	}
	for _, want := range []string{"run 0001-migrate", "pid 101 on cp-1", "state directory /var/lib/kube-etcd-migrate", "its lease frees the lock within"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	// TryLock writes and removes its key: only outside the prefix.
	wr, err := b.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || wr.Count != 0 {
		t.Fatalf("keys under /registry/: %v %v", wr, err)
	}
	if err := la.Finish(ctx, 0, 42); err != nil {
		t.Fatal(err)
	}
	lb, err := Acquire(ctx, b, runB, 10*time.Second)
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	runs, holder, err := List(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Host != "cp-1" || !runs[0].Finished() || runs[0].KeysWritten != 42 || runs[1].Host != "cp-2" || runs[1].Finished() {
		t.Fatalf("the cluster's runs: %+v", runs)
	}
	if holder == nil || holder.Holder.Host != "cp-2" {
		t.Fatalf("the holder listed: %+v", holder)
	}
	if got := Elsewhere(runs, "cp-2", "/var/lib/kube-etcd-migrate"); len(got) != 1 || got[0].Host != "cp-1" {
		t.Fatalf("where the earlier runs' undo is: %+v", got)
	}

	// cp-2's process dies: its lease is no longer kept alive.
	lb.session.Orphan()
	lb.session = nil
	runC := runA
	runC.ID, runC.PID = "0002-migrate", 303
	if _, err := Acquire(ctx, a, runC, 2*time.Second); !errors.As(err, &held) {
		t.Fatalf("while the dead holder's lease lives: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		lc, err := Acquire(ctx, a, runC, 2*time.Second)
		if err == nil {
			if err := lc.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.As(err, &held) || time.Now().After(deadline) {
			t.Fatalf("the dead holder's lease did not free the lock: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAuthRefusesTheKeys: with etcd's auth on and a user that may write under
// /registry/ only (as kube-apiserver's may), the lock is a NotPermittedError
// (the run goes on with the host's lock, said so), reading it too.
func TestAuthRefusesTheKeys(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	ctx := context.Background()
	root := client(t, srv.URL, "", "")
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "apiserver"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "apiserver", "/registry/", clientv3.GetPrefixRangeEnd("/registry/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "apiserver", "apiserverpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "apiserver", "apiserver"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	cli := client(t, srv.URL, "apiserver", "apiserverpw")
	if _, err := cli.Put(ctx, "/registry/x", "y"); err != nil {
		t.Fatalf("the user cannot write under /registry/: %v", err)
	}
	var np *NotPermittedError
	if _, err := Holder(ctx, cli); !errors.As(err, &np) {
		t.Fatalf("holder: %v, want a NotPermittedError", err)
	}
	_, err := Acquire(ctx, cli, Run{Header: undo.Header{ID: "0001-migrate", Host: "cp-1"}}, 5*time.Second)
	if !errors.As(err, &np) {
		t.Fatalf("acquire: %v, want a NotPermittedError", err)
	}
	t.Log(err)
}

func TestCovers(t *testing.T) {
	for prefix, want := range map[string]bool{"/registry": false, "/registry/": false, "/": true, "": true, "/kube-etcd-migrate": true, "/kube": false} {
		if got := Covers(prefix); got != want {
			t.Errorf("Covers(%q) = %v, want %v", prefix, got, want)
		}
	}
}
