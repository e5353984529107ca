package testkine

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k3s-io/kine/pkg/drivers"
	"github.com/k3s-io/kine/pkg/drivers/generic"
	kinemysql "github.com/k3s-io/kine/pkg/drivers/mysql"
	"github.com/k3s-io/kine/pkg/drivers/pgsql"
	"github.com/k3s-io/kine/pkg/server"
	"google.golang.org/grpc"
)

// K3s is a PostgreSQL or MySQL datastore served as a k3s server serves it: kine's
// driver and its etcd server started whole (its watch, its TTL expiry, its
// health key), on a unix socket, until Stop.
type K3s struct {
	// Endpoint is the etcd endpoint a kube-apiserver is given.
	Endpoint string
	grpc     *grpc.Server
	cancel   context.CancelFunc
	wg       *sync.WaitGroup
	once     sync.Once
}

// ServeK3s serves the PostgreSQL datastore dsn (postgres://..., as k3s's
// datastore-endpoint), or the MySQL one (mysql://...), as kine's
// endpoint.Listen does for k3s, with kine's
// own defaults (its kine-server flags: 20 idle connections kept 2 minutes,
// a poll every second, no compaction); stopped when the test ends if not
// before.
func ServeK3s(t testing.TB, dsn string) *K3s {
	t.Helper()
	dir, err := os.MkdirTemp("", "k3s-kine-") // short: a socket's path is limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	k := &K3s{cancel: cancel, wg: wg}
	scheme, rest, _ := strings.Cut(dsn, "://") // kine's drivers take the DSN after the scheme
	driver, what := pgsql.New, "PostgreSQL"
	if scheme == "mysql" {
		driver, what = kinemysql.New, "MySQL"
	}
	_, backend, err := driver(ctx, wg, &drivers.Config{
		DataSourceName:       rest,
		ConnectionPoolConfig: generic.ConnectionPoolConfig{MaxIdle: 20, MaxIdleTime: 2 * time.Minute},
		PollInterval:         time.Second,
		CompactTimeout:       5 * time.Second,
		CompactMinRetain:     1000,
		CompactBatchSize:     1000,
		PollBatchSize:        500,
	})
	if err == nil {
		err = backend.Start(ctx)
	}
	if err != nil {
		cancel()
		wg.Wait()
		t.Fatalf("kine on %s, as k3s runs it: %v", what, err)
	}
	sock := filepath.Join(dir, "kine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		cancel()
		wg.Wait()
		t.Fatal(err)
	}
	k.grpc = grpc.NewServer()
	server.New(backend, "unix", 5*time.Second, "3.6.11").Register(k.grpc)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = k.grpc.Serve(l)
	}()
	k.Endpoint = "unix://" + sock
	t.Cleanup(k.Stop)
	return k
}

// Stop stops kine and waits until its connections to the database are
// closed, as when k3s exits.
func (k *K3s) Stop() {
	k.once.Do(func() {
		t := time.AfterFunc(2*time.Second, k.grpc.Stop)
		k.grpc.GracefulStop()
		t.Stop()
		k.cancel()
		k.wg.Wait()
	})
}
