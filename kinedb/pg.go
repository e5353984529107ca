package kinedb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/k3s-io/kine/pkg/drivers"
	"github.com/k3s-io/kine/pkg/drivers/generic"
	"github.com/k3s-io/kine/pkg/drivers/pgsql"
	"github.com/k3s-io/kine/pkg/server"
	kinetls "github.com/k3s-io/kine/pkg/tls"
)

// PGLockKey is the key of the PostgreSQL advisory lock a writing run holds
// on the datastore's database (pg_try_advisory_lock, at session level, on
// a connection of its own until Close): the bytes of "kubeetcd"
// (0x6b75626565746364), the same in every release, so that two writing runs
// of the tool on one database — from any host — never both write it.
// Advisory locks are the database's: another database of the same server
// is not locked.
const PGLockKey int64 = 0x6b75626565746364

// kineIndexes are the indexes kine's pgsql setup makes (CREATE INDEX IF NOT
// EXISTS) beside its table: when one is missing (a datastore made by an
// older kine), serving it would make the index, a write (and, on a large
// table, a long lock) the tool does not make.
var kineIndexes = []string{
	"kine_name_index", "kine_name_id_index", "kine_id_deleted_index", "kine_prev_revision_index",
	"kine_name_prev_revision_uindex", "kine_list_query_index",
}

// readOnlyLockTimeout bounds how long a read-only serve's sessions wait
// for a lock (PostgreSQL's lock_timeout): kine's setup's, on its table.
const readOnlyLockTimeout = "2s"

// pgTarget is a PostgreSQL datastore: how kine and the tool reach it, its
// name for messages, and the secrets no message may hold.
type pgTarget struct {
	// kineDSN is the DSN as kine's pgsql driver takes it (without its
	// scheme), application_name set to app.
	kineDSN string
	// conn is the tool's own connections' config: kine's, made the same way.
	conn *pgx.ConnConfig
	// app tags every session of this Server (kine's pool, the lock's).
	app string
	// name is Server.Name's.
	name    string
	secrets []string
}

// parsePG reads cfg.DSN (and its TLS files) as k3s hands them to kine.
func parsePG(cfg Config) (*pgTarget, error) {
	scheme, rest, ok := strings.Cut(cfg.DSN, "://")
	if !ok || (scheme != "postgres" && scheme != "postgresql") {
		return nil, errors.New("a PostgreSQL datastore's DSN begins with postgres:// or postgresql://")
	}
	u, err := url.Parse("postgres://" + rest)
	if err != nil {
		// Not even its cause: url.Error holds the URL, and its cause may
		// hold a piece of the password (a "/" in it ends the host early:
		// `invalid port ":PIECE" after host`).
		return nil, errors.New("the PostgreSQL datastore's DSN is not a URL (a password's special characters must be percent-encoded)")
	}
	t := &pgTarget{}
	if pw, ok := u.User.Password(); ok {
		t.addSecret(pw)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errors.New("the PostgreSQL datastore's DSN: its query does not parse")
	}
	for _, pw := range q["password"] {
		t.addSecret(pw)
	}
	t.app = fmt.Sprintf("%s%d-%s", toolApp, os.Getpid(), randomHex(4))
	q.Set("application_name", t.app)
	if cfg.ReadOnly && !q.Has("lock_timeout") {
		// kine's setup (CREATE INDEX IF NOT EXISTS) takes a SHARE lock on
		// its table even when the index exists: it waits for k3s's writes
		// in progress, and k3s's next ones wait behind it. Bounded: a
		// read-only serve beside a running k3s gives up rather than stall it.
		q.Set("lock_timeout", readOnlyLockTimeout)
	}
	u.RawQuery = q.Encode()
	t.kineDSN = strings.TrimPrefix(u.String(), "postgres://")
	tlsInfo := kinetls.Config{CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile}
	if t.conn, err = prepareConfig(t.kineDSN, tlsInfo); err != nil {
		return nil, t.redact(fmt.Errorf("the PostgreSQL datastore's DSN: %w", err))
	}
	t.addSecret(t.conn.Password) // PGPASSWORD's or .pgpass's, when the DSN has none
	host := t.conn.Host
	if t.conn.Port != 5432 {
		host += ":" + strconv.Itoa(int(t.conn.Port))
	}
	t.name = fmt.Sprintf("the PostgreSQL datastore %s on %s", t.conn.Database, host)
	return t, nil
}

// prepareConfig is the connection kine's pgsql driver makes of a DSN (the
// DSN without its scheme) and the datastore's TLS files, for the tool's own
// sessions to reach the same database as kine: the database named by the
// path, lower case as kine folds it ("kubernetes" when there is none); each
// TLS file given as the libpq parameter the DSN does not set already
// (sslrootcert, sslcert, sslkey), and then sslmode verify-full unless the
// DSN sets one; the rest as pgx reads it (PGPASSWORD, .pgpass...).
func prepareConfig(dataSourceName string, tlsInfo kinetls.Config) (*pgx.ConnConfig, error) {
	u, err := url.Parse("postgres://" + dataSourceName)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	u.Path = strings.ToLower(u.Path)
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/kubernetes"
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, err
	}
	tlsFiles := false
	for _, f := range []struct{ param, file string }{{"sslrootcert", tlsInfo.CAFile}, {"sslcert", tlsInfo.CertFile}, {"sslkey", tlsInfo.KeyFile}} {
		if f.file != "" && !q.Has(f.param) {
			q.Set(f.param, f.file)
			tlsFiles = true
		}
	}
	if tlsFiles && !q.Has("sslmode") {
		q.Set("sslmode", "verify-full")
	}
	u.RawQuery = q.Encode()
	return pgx.ParseConfig(u.String())
}

func (t *pgTarget) addSecret(s string) {
	if s == "" {
		return
	}
	// As given, and as a URL spells it in each of its parts.
	inUser := strings.TrimPrefix(url.UserPassword("u", s).String(), "u:")
	t.secrets = append(t.secrets, s, url.QueryEscape(s), url.PathEscape(s), inUser)
}

// redact is err with every secret of the DSN replaced, on one line; it
// unwraps to nothing but a context's error (the others may hold the DSN).
func (t *pgTarget) redact(err error) error { return redactSecrets(t.secrets, err) }

// redactSecrets is err with each of secrets replaced, on one line; it
// unwraps to nothing but a context's error (the others may hold the DSN).
func redactSecrets(secrets []string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	msg = strings.ReplaceAll(msg, ":\n\t", ": ")
	msg = strings.ReplaceAll(strings.ReplaceAll(msg, "\n\t", "; "), "\n", "; ")
	r := &redactedError{msg: msg}
	switch {
	case errors.Is(err, context.Canceled):
		r.cause = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		r.cause = context.DeadlineExceeded
	}
	return r
}

type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.cause }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pgSession is the connection of a Server on PostgreSQL that checks the
// database before kine touches it and, for a writing run, holds the
// advisory lock and looks for other sessions (Others) until Close.
type pgSession struct {
	t    *pgTarget
	mu   sync.Mutex // pgx.Conn is not safe for concurrent use
	conn *pgx.Conn
}

// openPG connects to the datastore and checks that it is kine's: the
// database exists and has kine's table and indexes (kine would otherwise
// make them: an empty datastore).
func openPG(ctx context.Context, t *pgTarget) (*pgSession, error) {
	if v := os.Getenv("KINE_SCHEMA_MIGRATION"); v != "" && v != "0" {
		return nil, fmt.Errorf("%s: KINE_SCHEMA_MIGRATION is set (%s) in the environment: kine would alter its table's columns; unset it", t.name, v)
	}
	cfg := t.conn.Copy()
	cfg.RuntimeParams["application_name"] = t.app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "3D000" { // invalid_catalog_name
			return nil, &NotFoundError{Datastore: t.name, Problem: "no such database (kine would make it, and an empty datastore in it)"}
		}
		return nil, t.redact(fmt.Errorf("%s: connecting: %w", t.name, err))
	}
	s := &pgSession{t: t, conn: conn}
	var table bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('kine') IS NOT NULL").Scan(&table); err != nil {
		s.close()
		return nil, t.redact(fmt.Errorf("%s: %w", t.name, err))
	}
	if !table {
		s.close()
		return nil, &NotFoundError{Datastore: t.name, Problem: "no kine table: not a k3s or RKE2 datastore (kine would make an empty one)"}
	}
	var missing []string
	for _, ix := range kineIndexes {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ix).Scan(&ok); err != nil {
			s.close()
			return nil, t.redact(fmt.Errorf("%s: %w", t.name, err))
		}
		if !ok {
			missing = append(missing, ix)
		}
	}
	if len(missing) > 0 {
		s.close()
		return nil, fmt.Errorf("%s: kine's table lacks the index %s, which kine %s would make on it (a datastore of an older kine): start the cluster's k3s or RKE2 once on a release with kine %s or later, then stop it", t.name, strings.Join(missing, ", "), KineVersion, KineVersion)
	}
	return s, nil
}

// lock takes the advisory lock, without waiting.
func (s *pgSession) lock(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var got bool
	if err := s.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", PGLockKey).Scan(&got); err != nil {
		return s.t.redact(fmt.Errorf("%s: taking the advisory lock: %w", s.t.name, err))
	}
	if !got {
		return &LockedError{Datastore: s.t.name, How: fmt.Sprintf("PostgreSQL advisory lock %d", PGLockKey)}
	}
	return nil
}

// others are the sessions on the database but the Server's own (its
// application_name) and the server's background processes: k3s's, an
// administrator's psql, another tool's.
func (s *pgSession) others(ctx context.Context) ([]Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil, fmt.Errorf("%s: closed", s.t.name)
	}
	// A role that may not see another role's sessions in full sees their
	// pid and user, and nulls: such a session is counted, not ours.
	rows, err := s.conn.Query(ctx, `
		SELECT pid, coalesce(usename, ''), coalesce(application_name, ''), coalesce(host(client_addr), ''), coalesce(client_port, 0)
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND coalesce(backend_type, 'client backend') = 'client backend'
		  AND coalesce(application_name, '') <> $1
		ORDER BY pid`, s.t.app)
	if err != nil {
		return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
	}
	var out []Process
	for rows.Next() {
		var p Process
		var port int32
		if err := rows.Scan(&p.PID, &p.User, &p.Application, &p.Client, &port); err != nil {
			rows.Close()
			return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
		}
		if p.Client != "" && port > 0 {
			p.Client += ":" + strconv.Itoa(int(port))
		}
		p.Session = true
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
	}
	return out, nil
}

// toolApp begins the application_name of every session of a Server.
const toolApp = "kube-etcd-migrate-"

// alone refuses (InUseError) while another session is on the database. The
// sessions of another Server of the tool (its application_name) are looked
// at again for up to two seconds before they are: a run that has just
// closed its own leaves them for a moment, until their server processes
// have exited.
func (s *pgSession) alone(ctx context.Context) error {
	return waitAlone(ctx, s.t.name, s.others, func(p Process) bool { return strings.HasPrefix(p.Application, toolApp) })
}

// waitAlone is a database server session's alone: nil once others finds
// no session but the caller's, an InUseError naming the datastore (name)
// when one is another client's, or the tool's own (tool) still there after
// two seconds.
func waitAlone(ctx context.Context, name string, others func(context.Context) ([]Process, error), tool func(Process) bool) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		ps, err := others(ctx)
		if err != nil || len(ps) == 0 {
			return err
		}
		ours := true
		for _, p := range ps {
			ours = ours && tool(p)
		}
		if !ours || time.Now().After(deadline) {
			return &InUseError{Datastore: name, Holders: ps}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// close ends the session, its advisory lock with it (released first, so
// that it is free when close returns: the session's server process may
// take a moment to exit).
func (s *pgSession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = s.conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
		_ = s.conn.Close(ctx)
		s.conn = nil
	}
}

// servePG serves a PostgreSQL datastore: its database itself, read-only or
// not. kine's pgsql driver is opened (its setup only CREATEs its table and
// indexes IF NOT EXISTS: on a datastore checked by openPG, nothing, but for
// a moment's SHARE lock on kine's table: readOnlyLockTimeout) but its
// backend is not started: Start would write (the health key, the
// compact_rev_key when missing) and run kine's TTL expiry (which deletes
// expired leased keys, as k3s does), none of them the tool's writes. Without
// Start kine reads (Range), writes (kube-apiserver's create, update and
// delete transactions) and grants leases (kine's lease ID is its TTL; no
// database involved) all with the request's context; its Watch and Compact
// use the context Start sets, which is nil (a panic), so they are refused
// instead: the Watch service is not registered (a client's watch ends with
// Unimplemented), and unstarted refuses both. Nothing of the tool watches
// or compacts kine. The current revision kine keeps in memory then moves
// with the tool's own writes only (no poll loop): the revisions of reads
// come from each query, so this matters only on a read-only serve while
// k3s writes, to the header of a failed write's answer.
func servePG(ctx context.Context, cfg Config) (*Server, error) {
	t, err := parsePG(cfg)
	if err != nil {
		return nil, err
	}
	sess, err := openPG(ctx, t)
	if err != nil {
		return nil, err
	}
	return serveServer(ctx, cfg, t.name, "PostgreSQL", sess, pgsql.New, t.kineDSN, t.redact)
}

// dbSession is the tool's own session on a database server's datastore
// (pgSession, mySession), opened once the database is found to be kine's:
// for a writing serve it takes the server's lock, looks for other
// sessions (alone once, others during the run), and holds the lock until
// close.
type dbSession interface {
	lock(context.Context) error
	alone(context.Context) error
	others(context.Context) ([]Process, error)
	close()
}

// kineDriver is a kine SQL driver's New (pgsql.New, mysql.New).
type kineDriver func(context.Context, *sync.WaitGroup, *drivers.Config) (bool, server.Backend, error)

// serveServer serves the datastore of a database server (servePG,
// serveMySQL) through kine's driver on kineDSN, its backend not started;
// what names the server ("PostgreSQL", "MySQL"), sess is the tool's own
// session on it: closed for a read-only serve, else locked, checked alone
// and kept until Close. Every error passes through redact (the DSN's
// secrets).
func serveServer(ctx context.Context, cfg Config, name, what string, sess dbSession, driver kineDriver, kineDSN string, redact func(error) error) (*Server, error) {
	s := &Server{name: name, what: what}
	bctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.wg = cancel, &sync.WaitGroup{}
	ok := false
	defer func() {
		if !ok {
			s.Close()
			sess.close()
		}
	}()
	if cfg.ReadOnly {
		sess.close() // nothing to hold: the database is read where it is
	} else {
		if err := sess.lock(ctx); err != nil {
			return nil, err
		}
		if err := sess.alone(ctx); err != nil {
			return nil, err
		}
		s.db = sess
	}
	quietKine()
	// A Serve cancelled while kine opens its pool (kine retries a failed
	// ping for minutes) stops it.
	stop := context.AfterFunc(ctx, cancel)
	_, backend, err := driver(bctx, s.wg, &drivers.Config{
		DataSourceName:       kineDSN,
		BackendTLSConfig:     kinetls.Config{CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile},
		ConnectionPoolConfig: generic.ConnectionPoolConfig{MaxIdle: 20, MaxIdleTime: 2 * time.Minute},
		PollInterval:         time.Second,
		CompactTimeout:       5 * time.Second,
		CompactMinRetain:     1000,
		CompactBatchSize:     1000,
		PollBatchSize:        500,
	})
	stop()
	if err != nil {
		return nil, redact(fmt.Errorf("%s: opening it through kine: %w", name, err))
	}
	if err := s.listen(ctx, cfg.Dir, unstarted{backend}, false); err != nil {
		return nil, redact(err)
	}
	ok = true
	return s, nil
}

// errNotStarted is the answer to what kine serves only once its backend is
// started, which it is not on PostgreSQL (servePG) nor for a SQLite copy
// read (Serve).
var errNotStarted = errors.New("not served by kube-etcd-migrate here (kine's backend is not started: it would write, or keep in memory what nothing reads)")

// unstarted is kine's backend not started: Watch and Compact, which need
// it started, are refused (Watch is not even reached: its service is not
// registered).
type unstarted struct{ server.Backend }

func (unstarted) Watch(ctx context.Context, _ int64) server.WatchResult {
	events := make(chan server.EventBatch)
	close(events)
	errc := make(chan error, 1)
	errc <- fmt.Errorf("watch: %w", errNotStarted)
	return server.WatchResult{Eventc: events, Errorc: errc}
}

func (unstarted) Compact(context.Context, int64) (int64, error) {
	return 0, fmt.Errorf("compact: %w", errNotStarted)
}
