package kinedb

import (
	"context"
	"crypto/sha256"
	cryptotls "crypto/tls"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	kinemysql "github.com/k3s-io/kine/pkg/drivers/mysql"
	kinetls "github.com/k3s-io/kine/pkg/tls"
)

// MySQLLockPrefix begins the name of the MySQL user lock a writing run
// holds on the datastore's database (GET_LOCK, on a connection of its own
// until Close): MySQLLockName. User locks are the server's, not a
// database's: the name holds the database's, so that another database of
// the same server is not locked.
const MySQLLockPrefix = "kube-etcd-migrate.lock:"

// MySQLLockName is the name of the user lock a writing run of the tool
// holds on the MySQL (or MariaDB) database db: MySQLLockPrefix and db, or
// its SHA-256 (40 hex digits) when that would be longer than the 64
// characters MySQL takes.
func MySQLLockName(db string) string {
	if n := MySQLLockPrefix + db; len(n) <= 64 {
		return n
	}
	sum := sha256.Sum256([]byte(db))
	return MySQLLockPrefix + hex.EncodeToString(sum[:])[:40]
}

// The sessions of the tool on a MySQL datastore are known by user locks
// of their own, which each takes as it connects (a DSN parameter of
// go-sql-driver's: SET @kube_etcd_migrate = GET_LOCK(...)): mySessionTag
// and its connection ID, every session of every run of the tool; its
// Server's application tag (toolApp, the process's pid, random) and its
// connection ID, the Server's own. MySQL's processlist has no
// application_name, and these locks are what another session can see of
// one (IS_USED_LOCK).
const (
	mySessionTag   = "kube-etcd-migrate.session:"
	myTagParameter = "@kube_etcd_migrate"
)

// myTarget is a MySQL datastore: how kine and the tool reach it, its name
// for messages, and the secrets no message may hold.
type myTarget struct {
	// kineDSN is the DSN as kine's mysql driver takes it (without its
	// scheme), every session tagged (myTagParameter).
	kineDSN string
	// conn is the tool's own sessions' config: kine's, made the same way.
	conn *mysql.Config
	// app tags every session of this Server.
	app string
	// name is Server.Name's.
	name    string
	secrets []string
}

// parseMySQL reads cfg.DSN (and its TLS files) as k3s hands them to kine:
// mysql://USER:PASSWORD@tcp(HOST:PORT)/DATABASE?PARAMS, or unix(SOCKET)
// for tcp(...); the database is "kubernetes" when there is none.
func parseMySQL(cfg Config) (*myTarget, error) {
	scheme, rest, ok := strings.Cut(cfg.DSN, "://")
	if !ok || scheme != "mysql" {
		return nil, errors.New("a MySQL datastore's DSN begins with mysql://")
	}
	t := &myTarget{}
	// The password as go-sql-driver reads it: between the first ':' and
	// the last '@' before the last '/', a secret even when the DSN does not
	// parse.
	if slash := strings.LastIndex(rest, "/"); slash >= 0 {
		if at := strings.LastIndex(rest[:slash], "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				t.addSecret(pw)
			}
		}
	}
	c, err := mysql.ParseDSN(rest)
	if err != nil {
		return nil, t.redact(fmt.Errorf("the MySQL datastore's DSN does not parse (kine's form: mysql://USER:PASSWORD@tcp(HOST:PORT)/DATABASE): %w", err))
	}
	t.addSecret(c.Passwd)
	if c.DBName == "" {
		c.DBName = "kubernetes" // kine's
	}
	t.app = fmt.Sprintf("%s%d-%s", toolApp, os.Getpid(), randomHex(4))
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params[myTagParameter] = fmt.Sprintf("GET_LOCK(CONCAT('%s', CONNECTION_ID()), 0) + GET_LOCK(CONCAT('%s:', CONNECTION_ID()), 0)", mySessionTag, t.app)
	t.kineDSN = c.FormatDSN()
	tlsInfo := kinetls.Config{CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile}
	tlsConfig, err := tlsInfo.ClientConfig()
	if err != nil {
		return nil, t.redact(fmt.Errorf("the MySQL datastore's TLS files: %w", err))
	}
	host := c.Addr
	if c.Net == "tcp" {
		host = strings.TrimSuffix(host, ":3306")
	}
	t.name = fmt.Sprintf("the MySQL datastore %s on %s", c.DBName, host)
	own := c.Clone()
	if tlsConfig != nil {
		// As kine's: its TLS files, TLS 1.1 at least, under a name of
		// this Server's (kine registers its own, "kine").
		tlsConfig.MinVersion = cryptotls.VersionTLS11
		if err := mysql.RegisterTLSConfig(t.app, tlsConfig); err != nil {
			return nil, fmt.Errorf("%s: its TLS files: %w", t.name, err)
		}
		own.TLSConfig = t.app
	}
	t.conn = own
	return t, nil
}

func (t *myTarget) addSecret(s string) {
	if s != "" {
		t.secrets = append(t.secrets, s)
	}
}

// redact is err with every secret of the DSN replaced, on one line; it
// unwraps to nothing but a context's error.
func (t *myTarget) redact(err error) error {
	return redactSecrets(t.secrets, err)
}

// mySession is the connection of a Server on MySQL that checks the
// database before kine touches it and, for a writing run, holds the user
// lock and looks for other sessions (Others) until Close.
type mySession struct {
	t    *myTarget
	mu   sync.Mutex
	db   *sql.DB
	conn *sql.Conn
}

// openMySQL connects to the datastore and checks that it is kine's: the
// database exists and has kine's table (kine would otherwise make them: an
// empty datastore).
func openMySQL(ctx context.Context, t *myTarget) (*mySession, error) {
	if v := os.Getenv("KINE_SCHEMA_MIGRATION"); v != "" && v != "0" {
		return nil, fmt.Errorf("%s: KINE_SCHEMA_MIGRATION is set (%s) in the environment: kine would alter its table's columns; unset it", t.name, v)
	}
	connector, err := mysql.NewConnector(t.conn)
	if err != nil {
		return nil, t.redact(fmt.Errorf("%s: %w", t.name, err))
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err == nil {
		err = conn.PingContext(ctx)
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1049 { // ER_BAD_DB_ERROR
			return nil, &NotFoundError{Datastore: t.name, Problem: "no such database (kine would make it, and an empty datastore in it)"}
		}
		return nil, t.redact(fmt.Errorf("%s: connecting: %w", t.name, err))
	}
	s := &mySession{t: t, db: db, conn: conn}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name = 'kine'").Scan(&n); err != nil {
		s.close()
		return nil, t.redact(fmt.Errorf("%s: %w", t.name, err))
	}
	if n == 0 {
		s.close()
		return nil, &NotFoundError{Datastore: t.name, Problem: "no kine table: not a k3s or RKE2 datastore (kine would make an empty one)"}
	}
	return s, nil
}

// lock takes the user lock, without waiting.
func (s *mySession) lock(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := MySQLLockName(s.t.conn.DBName)
	var got sql.NullInt64
	if err := s.conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
		return s.t.redact(fmt.Errorf("%s: taking the lock %s: %w", s.t.name, name, err))
	}
	if !got.Valid || got.Int64 != 1 {
		return &LockedError{Datastore: s.t.name, How: fmt.Sprintf("MySQL user lock %s", name)}
	}
	return nil
}

// others are the sessions on the database but the Server's own (its user
// lock) and the server's background threads: k3s's, an administrator's
// mysql client, another tool's. Without the PROCESS privilege MySQL shows
// the tool's account ('USER'@'HOST') its own sessions only.
func (s *mySession) others(ctx context.Context) ([]Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil, fmt.Errorf("%s: closed", s.t.name)
	}
	rows, err := s.conn.QueryContext(ctx, `
		SELECT ID, coalesce(USER, ''), coalesce(HOST, ''), IS_USED_LOCK(CONCAT(?, ID)) IS NOT NULL
		FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND coalesce(COMMAND, '') <> 'Daemon'
		  AND IS_USED_LOCK(CONCAT(?, ID)) IS NULL
		ORDER BY ID`, mySessionTag, s.t.app+":")
	if err != nil {
		return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
	}
	defer rows.Close()
	var out []Process
	for rows.Next() {
		var p Process
		var host string
		var tool bool
		if err := rows.Scan(&p.PID, &p.User, &host, &tool); err != nil {
			return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
		}
		if host != "" && host != "localhost" {
			p.Client = host // ADDRESS:PORT over TCP
		}
		if tool {
			p.Application = "kube-etcd-migrate"
		}
		p.Session = true
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, s.t.redact(fmt.Errorf("%s: listing its sessions: %w", s.t.name, err))
	}
	return out, nil
}

// alone refuses (InUseError) while another session is on the database. The
// sessions of another Server of the tool (its session lock) are looked at
// again for up to two seconds before they are: a run that has just closed
// its own leaves them for a moment.
func (s *mySession) alone(ctx context.Context) error {
	return waitAlone(ctx, s.t.name, s.others, func(p Process) bool { return p.Application == "kube-etcd-migrate" })
}

// close ends the session, its user locks with it (released first).
func (s *mySession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = s.conn.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
		_ = s.conn.Close()
		_ = s.db.Close()
		s.conn = nil
	}
}

// serveMySQL serves a MySQL (or MariaDB) datastore: its database itself,
// read-only or not, as servePG serves PostgreSQL's. kine's mysql driver is
// opened (its setup makes the database and the table only when they are
// missing, which openMySQL refused; on kine's table it only reads
// information_schema) but its backend is not started (servePG says why).
func serveMySQL(ctx context.Context, cfg Config) (*Server, error) {
	t, err := parseMySQL(cfg)
	if err != nil {
		return nil, err
	}
	quietKine() // go-sql-driver's log too, before the first connection
	sess, err := openMySQL(ctx, t)
	if err != nil {
		return nil, err
	}
	return serveServer(ctx, cfg, t.name, "MySQL", sess, kinemysql.New, t.kineDSN, t.redact)
}

// quietMySQL keeps go-sql-driver's own log (a dropped connection's line)
// out of the tool's output: its errors reach the tool as the requests'.
func quietMySQL() {
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}
