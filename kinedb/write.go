package kinedb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/k3s-io/kine/pkg/server"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// lockFile takes an exclusive flock(2) on the database file, without
// waiting: SQLite's own locks are fcntl(2) locks, which flock does not
// touch, so k3s is not disturbed; a second writing run of the tool is
// refused.
func lockFile(database string) (*os.File, error) {
	f, err := os.Open(database)
	if err != nil {
		return nil, fmt.Errorf("kine datastore %s: %w", database, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &LockedError{Datastore: "the SQLite datastore " + database, How: "flock"}
		}
		return nil, fmt.Errorf("kine datastore %s: locking it: %w", database, err)
	}
	return f, nil
}

// LockedError: another writing run of the tool serves the datastore.
type LockedError struct {
	// Datastore is Server.Name's.
	Datastore string
	// How is the lock: "flock" (SQLite), "PostgreSQL advisory lock N",
	// "MySQL user lock NAME".
	How string
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("%s is locked by another writing run of kube-etcd-migrate (%s): one writing run at a time", e.Datastore, e.How)
}

// maintenance is kine's maintenance service but for Alarm, which kine does
// not serve: neither a SQLite nor a PostgreSQL nor a MySQL datastore served through
// kine has etcd's alarms (no quota, no corruption alarm: the database's
// own limits are its own), so the list is empty; arming or disarming one
// is refused. what is "SQLite", "PostgreSQL" or "MySQL".
type maintenance struct {
	*server.KVServerBridge
	what string
}

func (m maintenance) Alarm(_ context.Context, r *etcdserverpb.AlarmRequest) (*etcdserverpb.AlarmResponse, error) {
	if r.Action != etcdserverpb.AlarmRequest_GET {
		return nil, fmt.Errorf("a %s datastore served through kine has no alarms to arm or disarm", m.what)
	}
	return &etcdserverpb.AlarmResponse{Header: &etcdserverpb.ResponseHeader{}}, nil
}

// register registers kine's services as its Register does, its
// maintenance service answering Alarm for a datastore of what; but for
// Watch when kine's backend was not started (PostgreSQL, MySQL, a SQLite copy
// read): a watch there is answered Unimplemented.
func register(g *grpc.Server, b *server.KVServerBridge, what string, started bool) {
	etcdserverpb.RegisterLeaseServer(g, b)
	if started {
		etcdserverpb.RegisterWatchServer(g, b)
	}
	etcdserverpb.RegisterKVServer(g, b)
	etcdserverpb.RegisterClusterServer(g, b)
	etcdserverpb.RegisterMaintenanceServer(g, maintenance{b, what})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
}

// Others are who else may write the datastore while it is served for a
// writing run (one that appears is another writer: k3s started): on SQLite
// the processes other than this one holding the served file open
// (Holders); on PostgreSQL and MySQL the sessions on the database but this
// Server's own and the server's background processes (none for a read-only
// serve, which does not look).
func (s *Server) Others() ([]Process, error) {
	if s.SQLite() {
		return Holders(s.Database)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.db != nil {
		return s.db.others(ctx)
	}
	return nil, nil
}
