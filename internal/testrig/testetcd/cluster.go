package testetcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/loopback"
)

// Cluster is a cluster of embedded etcd members of the linked release, each
// on its own loopback ports and data directory, as a control plane's etcd
// of three (or five) members is.
type Cluster struct {
	Members []*Server
	dir     string
}

// StartCluster starts an n-member cluster and waits until every member
// serves (it has elected a leader). Its ports are the kernel's picks, taken
// before etcd binds them: when another test's server took one in between,
// the cluster is started again on new ports (a few times at most).
func StartCluster(n int) (*Cluster, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *Cluster
		c, err = startCluster(n)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return c, err
		}
	}
	return nil, err
}

func startCluster(n int) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "testetcd-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	var peers []string
	for i := 0; i < n; i++ {
		clientPort, err := loopback.FreePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		peerPort, err := loopback.FreePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
		pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
		mdir, err := os.MkdirTemp(dir, "member-")
		if err != nil {
			c.Close()
			return nil, err
		}
		m := &Server{Endpoint: cu.Host, URL: cu.String(), dir: mdir, clientURL: *cu, peerURL: *pu, name: fmt.Sprintf("member-%d", i)}
		peers = append(peers, m.name+"="+pu.String())
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initialCluster = strings.Join(peers, ",")
	}
	// Every member starts before any can be ready: readiness needs a quorum.
	started := make([]chan error, n)
	for i, m := range c.Members {
		started[i] = make(chan error, 1)
		go func() {
			e, err := m.startEmbedded()
			if err == nil {
				err = m.waitReady(e)
			}
			started[i] <- err
		}()
	}
	var errs []error
	for i := range c.Members {
		if err := <-started[i]; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		c.Close()
		return nil, fmt.Errorf("etcd cluster of %d: %w", n, errors.Join(errs...))
	}
	return c, nil
}

// StartClusterT is StartCluster for a test: the cluster stops when it ends.
func StartClusterT(t TB, n int) *Cluster {
	t.Helper()
	c, err := StartCluster(n)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Endpoints are the members' client endpoints (host:port).
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint)
	}
	return eps
}

// Client returns a client of every member, as etcdctl --endpoints with all
// of them is: it fails over when a member goes.
func (c *Cluster) Client() (*clientv3.Client, error) {
	var urls []string
	for _, m := range c.Members {
		urls = append(urls, m.URL)
	}
	return clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// ClientT is Client for a test, closed when it ends.
func (c *Cluster) ClientT(t TB) *clientv3.Client {
	t.Helper()
	cli, err := c.Client()
	if err != nil {
		t.Fatalf("etcd cluster client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader is the index of the member that leads now (-1 when no running
// member knows one).
func (c *Cluster) Leader() int {
	for _, m := range c.Members {
		m.mu.Lock()
		e := m.Etcd
		m.mu.Unlock()
		if e == nil {
			continue
		}
		lead := uint64(e.Server.Leader())
		for j, o := range c.Members {
			o.mu.Lock()
			oe := o.Etcd
			o.mu.Unlock()
			if oe != nil && uint64(oe.Server.MemberID()) == lead {
				return j
			}
		}
	}
	return -1
}

// WaitLeader waits until a running member leads, and returns its index.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		if l := c.Leader(); l >= 0 {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no etcd leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MoveLeader hands the leadership to member to, as `etcdctl move-leader`
// does (asked of the current leader).
func (c *Cluster) MoveLeader(ctx context.Context, to int) error {
	from, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	m := c.Members[from]
	m.mu.Lock()
	e := m.Etcd
	m.mu.Unlock()
	t := c.Members[to]
	t.mu.Lock()
	te := t.Etcd
	t.mu.Unlock()
	if e == nil || te == nil {
		return fmt.Errorf("move leader %s -> %s: a member is stopped", m.name, t.name)
	}
	return e.Server.MoveLeader(ctx, uint64(e.Server.MemberID()), uint64(te.Server.MemberID()))
}

// Close stops every member and removes the data.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Stop()
	}
	os.RemoveAll(c.dir)
}
