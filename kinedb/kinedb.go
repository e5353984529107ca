// Package kinedb serves a k3s or RKE2 datastore kept in SQLite (k3s's
// default: DATA/server/db/state.db) through kine — the library k3s itself
// runs in front of it — inside the tool's process, on a unix socket in a
// private directory, so every stage reaches it with the same etcd client it
// uses for etcd. It is served only while no other process holds the
// database open (a running k3s is refused, named by its process), and, for
// a command that only reads, from a consistent copy made with SQLite's own
// VACUUM INTO: kine changes the database it opens (it deletes keys whose
// TTL has run out, checkpoints the write-ahead log, vacuums), which a
// read-only command must not do to the node's datastore.
package kinedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/k3s-io/kine/pkg/drivers"
	"github.com/k3s-io/kine/pkg/drivers/generic"
	"github.com/k3s-io/kine/pkg/drivers/sqlite"
	"github.com/k3s-io/kine/pkg/server"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	_ "modernc.org/sqlite" // database/sql's "sqlite", for the read-only copy
)

// KineVersion is the kine release linked into the tool (the one k3s
// v1.37 runs), named in reports and docs.
const KineVersion = "v0.17.5"

// emulatedEtcdVersion is the etcd version kine reports in Status: kine's
// own default (its kine-server flag --emulated-etcd-version).
const emulatedEtcdVersion = "3.6.11"

// Config says which database to serve and how.
type Config struct {
	// Database is the SQLite file k3s or RKE2 keeps the cluster in.
	Database string
	// Dir is a private directory (0700) for the socket and, when ReadOnly,
	// the copy; the caller removes it.
	Dir string
	// ReadOnly serves a copy of Database made when Serve is called: nothing
	// the tool or kine does reaches the node's file. Otherwise (a writing
	// run) the file itself is served, under an exclusive flock(2) held until
	// Close: a second tool's writing run on it is refused at once.
	ReadOnly bool
}

// Server is a datastore served through kine until Close.
type Server struct {
	// Endpoint is the etcd client endpoint: unix://DIR/kine.sock.
	Endpoint string
	// Database is the file served (the node's, or its copy when ReadOnly).
	Database string

	lock   *os.File // the node's file, flock'd, for a writable serve
	grpc   *grpc.Server
	cancel context.CancelFunc
	wg     *sync.WaitGroup
	once   sync.Once
}

// NotFoundError: the database file does not exist.
type NotFoundError struct{ Database string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("kine datastore %s: no such file", e.Database)
}

// Serve checks that no process holds cfg.Database open, then serves it (or
// its copy) through kine. ctx bounds the start only; Close stops it.
func Serve(ctx context.Context, cfg Config) (*Server, error) {
	if _, err := os.Stat(cfg.Database); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &NotFoundError{Database: cfg.Database}
		}
		return nil, fmt.Errorf("kine datastore %s: %w", cfg.Database, err)
	}
	holders, err := Holders(cfg.Database)
	if err != nil {
		return nil, err
	}
	if len(holders) > 0 {
		return nil, &InUseError{Database: cfg.Database, Holders: holders}
	}
	served := cfg.Database
	var lock *os.File
	if !cfg.ReadOnly {
		if lock, err = lockFile(cfg.Database); err != nil {
			return nil, err
		}
	}
	if cfg.ReadOnly {
		served = filepath.Join(cfg.Dir, "state.db")
		if err := Copy(ctx, cfg.Database, served); err != nil {
			return nil, err
		}
	}
	quietKine()
	bctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	s := &Server{cancel: cancel, wg: wg, lock: lock, Database: served}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	// kine's own defaults (its kine-server flags) but for two: no
	// compaction (CompactInterval 0: kine's compactor is not started; it
	// would delete the history a read at one revision may need) and no
	// VACUUM at startup (a rewrite of the whole file, to no use here).
	_, backend, err := sqlite.New(bctx, wg, &drivers.Config{
		DataSourceName:       served + "?" + sqlite.DefaultParams + "&_kine_disable_startup_vacuum=true",
		ConnectionPoolConfig: generic.ConnectionPoolConfig{MaxIdle: 20, MaxIdleTime: 2 * time.Minute},
		PollInterval:         time.Second,
		CompactTimeout:       5 * time.Second,
		CompactMinRetain:     1000,
		CompactBatchSize:     1000,
		PollBatchSize:        500,
	})
	if err != nil {
		return nil, fmt.Errorf("kine datastore %s: opening it through kine: %w", cfg.Database, err)
	}
	if err := backend.Start(bctx); err != nil {
		return nil, fmt.Errorf("kine datastore %s: starting kine: %w", cfg.Database, err)
	}
	sock := filepath.Join(cfg.Dir, "kine.sock")
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("kine datastore %s: socket: %w", cfg.Database, err)
	}
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(2*1024*1024*1024-1), grpc.MaxSendMsgSize(2*1024*1024*1024-1))
	register(s.grpc, server.New(backend, "unix", 5*time.Second, emulatedEtcdVersion))
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = s.grpc.Serve(l)
	}()
	s.Endpoint = "unix://" + sock
	ok = true
	return s, nil
}

// Close stops kine and waits for its goroutines, the one that closes the
// database among them.
func (s *Server) Close() error {
	s.once.Do(func() {
		if s.grpc != nil {
			t := time.AfterFunc(2*time.Second, s.grpc.Stop)
			s.grpc.GracefulStop()
			t.Stop()
		}
		s.cancel()
		s.wg.Wait()
		if s.lock != nil {
			s.lock.Close() // its flock with it
		}
	})
	return nil
}

var quiet sync.Once

// quietKine keeps kine's logging (logrus, its info lines on every start)
// out of the tool's output; its errors reach the tool as the requests'.
func quietKine() {
	quiet.Do(func() {
		logrus.SetOutput(io.Discard)
		logrus.SetLevel(logrus.ErrorLevel)
	})
}

// Copy writes a consistent copy of the SQLite database src to dst (which
// must not exist) with SQLite's VACUUM INTO, reading src without writing
// it; a database without kine's table is refused (another program's
// database would be served as an empty datastore).
func Copy(ctx context.Context, src, dst string) error {
	db, err := sql.Open("sqlite", "file:"+src+"?mode=ro&_pragma=busy_timeout(30000)")
	if err != nil {
		return fmt.Errorf("kine datastore %s: %w", src, err)
	}
	defer db.Close()
	var tables int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'kine'").Scan(&tables); err != nil {
		return fmt.Errorf("kine datastore %s: %w", src, err)
	}
	if tables == 0 {
		return fmt.Errorf("kine datastore %s: a SQLite database without kine's table: not a k3s or RKE2 datastore", src)
	}
	// The copy holds the cluster's values (its Secrets): made empty, only
	// its owner's, before SQLite fills it (VACUUM INTO takes an empty file).
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("kine datastore %s: copying it: %w", src, err)
	}
	f.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		os.Remove(dst)
		return fmt.Errorf("kine datastore %s: copying it to %s: %w", src, dst, err)
	}
	return nil
}

// sqliteHeader begins every SQLite database file (sqlite.org/fileformat.html).
const sqliteHeader = "SQLite format 3\x00"

// IsSQLite says whether the file at path is a SQLite database (its
// header); false for "", a file that cannot be read (its reader says why)
// and one shorter than the header.
func IsSQLite(path string) bool {
	if path == "" {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(sqliteHeader))
	if _, err := io.ReadFull(f, b); err != nil {
		return false
	}
	return string(b) == sqliteHeader
}

// InUseError: a process holds the database open (k3s or RKE2 running).
type InUseError struct {
	Database string
	Holders  []Process
}

func (e *InUseError) Error() string {
	var who []string
	for _, p := range e.Holders {
		who = append(who, p.String())
	}
	return fmt.Sprintf("kine datastore %s is open in %s: stop it first (the tool serves the datastore itself, and two kines on one SQLite file would each write without the other's knowledge)",
		e.Database, strings.Join(who, ", "))
}
