package kinedb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

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
			return nil, &LockedError{Database: database}
		}
		return nil, fmt.Errorf("kine datastore %s: locking it: %w", database, err)
	}
	return f, nil
}

// LockedError: another writing run of the tool serves the database.
type LockedError struct{ Database string }

func (e *LockedError) Error() string {
	return fmt.Sprintf("kine datastore %s is locked by another writing run of kube-etcd-migrate (flock): one writing run at a time", e.Database)
}

// maintenance is kine's maintenance service but for Alarm, which kine does
// not serve: a SQLite database has no alarms (no quota, no corruption
// alarm), so the list is empty; arming or disarming one is refused.
type maintenance struct{ *server.KVServerBridge }

func (m maintenance) Alarm(_ context.Context, r *etcdserverpb.AlarmRequest) (*etcdserverpb.AlarmResponse, error) {
	if r.Action != etcdserverpb.AlarmRequest_GET {
		return nil, errors.New("a SQLite datastore served through kine has no alarms to arm or disarm")
	}
	return &etcdserverpb.AlarmResponse{Header: &etcdserverpb.ResponseHeader{}}, nil
}

// register registers kine's services as its Register does, its
// maintenance service answering Alarm.
func register(g *grpc.Server, b *server.KVServerBridge) {
	etcdserverpb.RegisterLeaseServer(g, b)
	etcdserverpb.RegisterWatchServer(g, b)
	etcdserverpb.RegisterKVServer(g, b)
	etcdserverpb.RegisterClusterServer(g, b)
	etcdserverpb.RegisterMaintenanceServer(g, maintenance{b})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
}

// Others are the processes other than this one holding the served
// database open (Holders): while it is served for a writing run, one that
// appears is another writer (k3s started).
func (s *Server) Others() ([]Process, error) { return Holders(s.Database) }
