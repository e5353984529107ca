package testetcd

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestStartPutGet(t *testing.T) {
	s := StartT(t, Options{})
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "/registry/x", "y"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "/registry/x")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "y" {
		t.Fatalf("got %v", resp.Kvs)
	}
}

// TestVersions: each release of Versions serves, reports its own version
// (the older one is its own binary, not the linked server), and comes back
// with its data after Stop and Restart.
func TestVersions(t *testing.T) {
	Each(t, func(t *testing.T, v string) {
		s := StartT(t, Options{Version: v})
		cli := s.ClientT(t)
		ctx := context.Background()
		if _, err := cli.Put(ctx, "/registry/x", "y"); err != nil {
			t.Fatal(err)
		}
		st, err := cli.Status(ctx, s.URL)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.TrimPrefix(Name(v), "etcd-")
		if st.Version != want || s.Version != want {
			t.Fatalf("server reports version %q (Server.Version %q), want %q", st.Version, s.Version, want)
		}
		if IsLinked(v) != (s.Etcd != nil) {
			t.Fatalf("version %q: embedded %v", v, s.Etcd != nil)
		}
		s.Stop()
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, "/registry/x")
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "y" {
			t.Fatalf("after restart: %v %v", resp, err)
		}
	})
	if got := Name(Linked); got != "etcd-"+LinkedVersion || !strings.HasPrefix(got, "etcd-3.7.") {
		t.Fatalf("Name(Linked) = %q", got)
	}
}

// TestClusterMoveLeaderAndKill: three members elect a leader; leadership
// moves when asked, and the cluster keeps serving writes when the leader
// is killed (two of three are a quorum, electing another).
func TestClusterMoveLeaderAndKill(t *testing.T) {
	c := StartClusterT(t, 3)
	cli := c.ClientT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lead, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := (lead + 1) % 3
	if err := c.MoveLeader(ctx, to); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.WaitLeader(ctx); got != to {
		t.Fatalf("leader %d after moving it from %d to %d", got, lead, to)
	}
	start := time.Now()
	c.Members[to].Kill()
	t.Logf("killed the leader in %s", time.Since(start))
	// Until the others elect a leader, a request may time out: as a client
	// would, try again.
	for i := 0; i < 10; i++ {
		if _, err = cli.Put(ctx, "/registry/after-leader-stopped", "v"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("write after the leader was killed: %v", err)
	}
	if got, err := c.WaitLeader(ctx); err != nil || got == to {
		t.Fatalf("leader %d %v after stopping %d", got, err, to)
	}
	if err := c.Members[to].Restart(); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "/registry/after-leader-stopped")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read: %v %v", resp, err)
	}
}
