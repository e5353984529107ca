// Package kinedb serves a k3s or RKE2 datastore kept in SQLite (k3s's
// default: DATA/server/db/state.db) or in PostgreSQL (k3s's
// datastore-endpoint postgres://...) through kine — the library k3s itself
// runs in front of it — inside the tool's process, on a unix socket in a
// private directory, so every stage reaches it with the same etcd client it
// uses for etcd.
//
// A SQLite file is served only while no other process holds it open (a
// running k3s is refused, named by its process), and, for a command that
// only reads, from a consistent copy made with SQLite's own VACUUM INTO:
// kine changes the database it opens (it deletes keys whose TTL has run
// out, checkpoints the write-ahead log, vacuums), which a read-only command
// must not do to the node's datastore. The copy is read with kine's backend
// not started (no TTL expiry holding every leased key in memory, no watch):
// it is read, nothing more.
//
// A PostgreSQL database is served itself, kine's backend not started, so
// that nothing is written but the tool's own writes (servePG); for a
// writing run, under an advisory lock every host sees (PGLockKey) and only
// while no other session is on the database (k3s's servers stopped). A
// MySQL (or MariaDB) database (datastore-endpoint mysql://...) is served
// the same way (serveMySQL), its lock a user lock (GET_LOCK:
// MySQLLockName), its sessions information_schema.PROCESSLIST's.
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

// Config says which database to serve and how: exactly one of Database
// and DSN.
type Config struct {
	// Database is the SQLite file k3s or RKE2 keeps the cluster in.
	Database string
	// DSN is the PostgreSQL or MySQL database k3s or RKE2 keeps the
	// cluster in, as their datastore-endpoint gives it:
	// postgres://USER:PASSWORD@HOST:PORT/DB?PARAMS (or postgresql://), or
	// mysql://USER:PASSWORD@tcp(HOST:PORT)/DB?PARAMS (or unix(SOCKET)).
	// Its password appears in no error nor name.
	DSN string
	// CAFile, CertFile and KeyFile are k3s's datastore-cafile, -certfile and
	// -keyfile for a PostgreSQL DSN, handed to kine as it does (sslrootcert,
	// sslcert, sslkey; sslmode verify-full unless the DSN sets it), and for a
	// MySQL one (kine's TLS config).
	CAFile, CertFile, KeyFile string
	// Dir is a private directory (0700) for the socket and, when ReadOnly,
	// the copy; the caller removes it.
	Dir string
	// ReadOnly, on SQLite, serves a copy of Database made when Serve is
	// called: nothing the tool or kine does reaches the node's file.
	// Otherwise (a writing run) the file itself is served, under an
	// exclusive flock(2) held until Close: a second tool's writing run on it
	// is refused at once. On PostgreSQL the database itself is served
	// either way, nothing written but what is written through kine; a
	// writing run (not ReadOnly) holds its advisory lock and is refused
	// while another session is on the database; on MySQL the same, with a
	// user lock.
	ReadOnly bool
}

// Server is a datastore served through kine until Close.
type Server struct {
	// Endpoint is the etcd client endpoint: unix://DIR/kine.sock.
	Endpoint string
	// Database is the SQLite file served (the node's, or its copy when
	// ReadOnly); "" on PostgreSQL and MySQL.
	Database string
	// Copied, on SQLite when ReadOnly, is how long the copy took (SQLite's
	// VACUUM INTO of the node's file, as a writing run's undo snapshot is
	// taken: kinedb.Copy); 0 otherwise. Private says Database is that
	// copy: this process's own, in Config.Dir, which nothing else reads and
	// which Close's caller removes; writing it changes nothing of the
	// node's datastore.
	Copied  time.Duration
	Private bool

	name   string    // Name's
	what   string    // "SQLite", "PostgreSQL" or "MySQL"
	lock   *os.File  // the node's SQLite file, flock'd, for a writable serve
	db     dbSession // on PostgreSQL or MySQL, a writable serve's lock and look-out
	grpc   *grpc.Server
	cancel context.CancelFunc
	wg     *sync.WaitGroup
	once   sync.Once
}

// Name names the datastore served, for messages (no secret in it): "the
// SQLite datastore /var/lib/rancher/k3s/server/db/state.db" (the node's
// file, also when a copy is served), "the PostgreSQL datastore k3s on
// db.example:5433" (the port when not 5432; a unix socket's directory as
// its host), "the MySQL datastore k3s on db.example" (the port when not
// 3306; a unix socket's path as its host).
func (s *Server) Name() string { return s.name }

// SQLite says whether the datastore served is a SQLite file (else a
// database server's: PostgreSQL or MySQL).
func (s *Server) SQLite() bool { return s.what == "SQLite" }

// Kind is the datastore's database: "SQLite", "PostgreSQL" or "MySQL".
func (s *Server) Kind() string { return s.what }

// NotFoundError: the datastore does not exist — no SQLite file, no
// PostgreSQL or MySQL database or no kine table in it — where kine would
// make a new, empty one.
type NotFoundError struct {
	// Database is the SQLite file ("" on PostgreSQL and MySQL).
	Database string
	// Datastore (Server.Name's) and Problem, on PostgreSQL and MySQL.
	Datastore, Problem string
}

func (e *NotFoundError) Error() string {
	if e.Datastore != "" {
		return fmt.Sprintf("%s: %s", e.Datastore, e.Problem)
	}
	return fmt.Sprintf("kine datastore %s: no such file", e.Database)
}

// Serve serves cfg's datastore through kine: a SQLite file once it has
// checked that no process holds it open (the file, or its copy when
// ReadOnly), a PostgreSQL database (servePG) or a MySQL one (serveMySQL)
// once it has checked that it is kine's. ctx bounds the start only; Close
// stops it.
func Serve(ctx context.Context, cfg Config) (*Server, error) {
	switch {
	case cfg.Database != "" && cfg.DSN != "":
		return nil, errors.New("kine datastore: both a SQLite file and a database server's DSN given: one datastore at a time")
	case strings.HasPrefix(cfg.DSN, "mysql://"):
		return serveMySQL(ctx, cfg)
	case cfg.DSN != "":
		return servePG(ctx, cfg)
	case cfg.Database == "":
		return nil, errors.New("kine datastore: neither a SQLite file nor a PostgreSQL or MySQL DSN given")
	case cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "":
		return nil, fmt.Errorf("kine datastore %s: TLS files are for a PostgreSQL or MySQL datastore, not a SQLite file", cfg.Database)
	}
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
		return nil, &InUseError{Database: cfg.Database, Datastore: "the SQLite datastore " + cfg.Database, Holders: holders}
	}
	served := cfg.Database
	var copied time.Duration
	var lock *os.File
	if !cfg.ReadOnly {
		if lock, err = lockFile(cfg.Database); err != nil {
			return nil, err
		}
	}
	if cfg.ReadOnly {
		served = filepath.Join(cfg.Dir, "state.db")
		start := time.Now()
		if err := Copy(ctx, cfg.Database, served); err != nil {
			return nil, err
		}
		copied = time.Since(start)
	}
	quietKine()
	bctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	s := &Server{cancel: cancel, wg: wg, lock: lock, Database: served, Copied: copied, Private: cfg.ReadOnly, name: "the SQLite datastore " + cfg.Database, what: "SQLite"}
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
	// A copy, read: kine's backend is not started, as on PostgreSQL
	// (servePG): its TTL expiry would hold every leased key in this
	// process (tens of MB at 400,000 objects) to delete, in a copy no one
	// keeps, what k3s deletes itself at its start; nothing of a command
	// that reads watches or compacts kine.
	if cfg.ReadOnly {
		if err := s.listen(ctx, cfg.Dir, unstarted{backend}, false); err != nil {
			return nil, err
		}
		ok = true
		return s, nil
	}
	if err := backend.Start(bctx); err != nil {
		return nil, fmt.Errorf("kine datastore %s: starting kine: %w", cfg.Database, err)
	}
	if err := s.listen(ctx, cfg.Dir, backend, true); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// listen serves kine's etcd API for backend on DIR/kine.sock (Endpoint),
// its Watch service only when the backend was started (a watch needs it).
func (s *Server) listen(ctx context.Context, dir string, backend server.Backend, started bool) error {
	sock := filepath.Join(dir, "kine.sock")
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("%s: kine's socket: %w", s.name, err)
	}
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(2*1024*1024*1024-1), grpc.MaxSendMsgSize(2*1024*1024*1024-1))
	register(s.grpc, server.New(backend, "unix", 5*time.Second, emulatedEtcdVersion), s.what, started)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.grpc.Serve(l)
	}()
	s.Endpoint = "unix://" + sock
	return nil
}

// Close stops kine and waits for its goroutines, the one that closes the
// database among them; then it releases the lock (the flock, or the
// PostgreSQL session holding the advisory lock, the MySQL one holding the
// user lock).
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
		if s.db != nil {
			s.db.close() // its lock with it (PostgreSQL's advisory lock, MySQL's user lock)
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
		quietMySQL()
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

// namedHolders is how many of an InUseError's holders its message names
// (a running k3s server's kine keeps a pool of sessions on the database:
// the rest are counted).
const namedHolders = 5

// InUseError: another process holds the SQLite file open, or another
// session is on the PostgreSQL or MySQL database (k3s or RKE2 running).
type InUseError struct {
	// Database is the SQLite file ("" on PostgreSQL and MySQL).
	Database string
	// Datastore is Server.Name's.
	Datastore string
	// Holders are the processes holding the file, or the sessions.
	Holders []Process
}

func (e *InUseError) Error() string {
	var who []string
	for i, p := range e.Holders {
		if i == namedHolders && len(e.Holders) > namedHolders+1 {
			who = append(who, fmt.Sprintf("and %d more", len(e.Holders)-i))
			break
		}
		who = append(who, p.String())
	}
	if e.Database == "" {
		return fmt.Sprintf("%s has other sessions: %s: stop every k3s or RKE2 server of the cluster first, and any other client of the database (the tool writes the datastore itself through kine, and another client's writes would go on without its knowledge)",
			e.Datastore, strings.Join(who, ", "))
	}
	return fmt.Sprintf("kine datastore %s is open in %s: stop it first (the tool serves the datastore itself, and two kines on one SQLite file would each write without the other's knowledge)",
		e.Database, strings.Join(who, ", "))
}
