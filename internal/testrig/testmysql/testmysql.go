// Package testmysql runs a real MySQL-compatible server for a test —
// Debian's mariadb-server package (/usr/sbin/mariadbd, set up with
// mariadb-install-db) — as k3s and RKE2 use one for their datastore
// (datastore-endpoint: mysql://...): a fresh data directory in a private
// temporary directory, the server listening only on a unix socket in that
// directory (--skip-networking: no TCP port, so tests in parallel never
// collide), run as the mysql user when the test runs as root, tuned for
// speed over durability, and stopped when the test ends. Start makes a
// database and a user with a password that may use it, and returns the
// datastore-endpoint of them that kine's mysql driver takes. StartTLS also
// listens on a loopback TCP port with TLS only, for the tests of a
// datastore's TLS files. Without
// MariaDB installed the test fails, saying what to install: it is not
// skipped.
package testmysql

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"kube-etcd-migrate/internal/testrig/dbproc"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// Database and User are what Start makes: the database k3s would keep the
// cluster in, and the user (with a password) that may use it.
const (
	Database = "kine"
	User     = "k3s"
)

// Superuser is the server's root, which connects without a password over
// the socket; User gives its password.
const Superuser = "root"

// Server and InstallDB are the binaries of Debian's mariadb-server.
const (
	Server    = "/usr/sbin/mariadbd"
	InstallDB = "/usr/bin/mariadb-install-db"
)

// Start starts a MariaDB server for the test and returns the
// datastore-endpoint of Database as User, with User's password:
// mysql://k3s:PASSWORD@unix(DIR/sock/mysqld.sock)/kine.
func Start(t testing.TB) string {
	t.Helper()
	s := start(t, nil)
	return "mysql://" + s.DSN(User, s.password, Database)
}

// StartTLS is Start, the server also listening on a free port of
// 127.0.0.1 (the kernel's pick a moment before) where it takes only TLS
// connections (require_secure_transport), its certificate issued by ca
// (for 127.0.0.1), and only from a client presenting a certificate of
// ca's (REQUIRE X509) besides User's password. It returns the endpoint of
// Database as User on that port, without TLS parameters
// (mysql://k3s:PASSWORD@tcp(127.0.0.1:PORT)/kine), and the one Start
// returns, on the socket.
func StartTLS(t testing.TB, ca *testpki.CA) (tlsEndpoint, socketEndpoint string) {
	t.Helper()
	s := start(t, ca)
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = User, s.password, "tcp", fmt.Sprintf("127.0.0.1:%d", s.port), Database
	return "mysql://" + cfg.FormatDSN(), "mysql://" + s.DSN(User, s.password, Database)
}

// SuperuserDSN is a go-sql-driver DSN (without a scheme) of database db
// on the server of endpoint (one Start returned), as the superuser: for a
// test to make or drop databases, or to look at the server as its
// administrator.
func SuperuserDSN(t testing.TB, endpoint, db string) string {
	t.Helper()
	cfg := parse(t, endpoint)
	cfg.User, cfg.Passwd, cfg.DBName = Superuser, "", db
	return cfg.FormatDSN()
}

// Password is endpoint's password.
func Password(t testing.TB, endpoint string) string {
	t.Helper()
	return parse(t, endpoint).Passwd
}

func parse(t testing.TB, endpoint string) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(strings.TrimPrefix(endpoint, "mysql://"))
	if err != nil {
		t.Fatalf("not a MySQL DSN: %v", err)
	}
	return cfg
}

// Exec runs each statement on dsn (an endpoint Start returned, or a DSN
// SuperuserDSN did) as its user, on one session.
func Exec(t testing.TB, dsn string, stmts ...string) {
	t.Helper()
	db := Open(t, dsn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("connecting to MariaDB: %v", err)
	}
	defer c.Close()
	for _, q := range stmts {
		if _, err := c.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// Open opens dsn (an endpoint, or a DSN without scheme) with database/sql;
// the caller closes it.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	cfg := parse(t, dsn)
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sql.OpenDB(conn)
}

// server is one running MariaDB server.
type server struct {
	sock     string
	password string
	port     int // StartTLS's
}

// DSN is a go-sql-driver DSN of db as user (with password when not "") on
// the socket.
func (s *server) DSN(user, password, db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, password, "unix", s.sock, db
	return cfg.FormatDSN()
}

// Check fails the test when MariaDB's server is not installed.
func Check(t testing.TB) {
	t.Helper()
	for _, f := range []string{Server, InstallDB} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("MariaDB is not installed (no %s): install Debian's mariadb-server package (apt-get install mariadb-server); the tests of a MySQL datastore run a real server", f)
		}
	}
}

func start(t testing.TB, ca *testpki.CA) *server {
	t.Helper()
	Check(t)
	// mariadbd refuses root but for --user.
	cred := dbproc.RunAs(t, "mysql", "mariadbd", "mariadb-server")
	dir := dbproc.Dir(t, "testmysql-", cred, "data", "sock")
	data, sockDir := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	password := "pw-" + dbproc.Random(t)
	install := exec.Command(InstallDB, "--no-defaults", "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve")
	install.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	sock := filepath.Join(sockDir, "mysqld.sock")
	listen := []string{"--skip-networking"}
	port := 0
	if ca != nil {
		cert, key, caFile := dbproc.TLSFiles(t, ca, dir, cred)
		port = dbproc.FreePort(t)
		listen = []string{"--bind-address=127.0.0.1", "--port=" + strconv.Itoa(port),
			"--ssl-ca=" + caFile, "--ssl-cert=" + cert, "--ssl-key=" + key, "--require-secure-transport=ON"}
	}
	var log bytes.Buffer
	args := append([]string{"--no-defaults",
		"--datadir=" + data,
		"--socket=" + sock,
		"--pid-file=" + filepath.Join(dir, "mysqld.pid")}, listen...)
	srv := exec.Command(Server, append(args,
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=16M",
		"--innodb-log-file-size=16M",
		"--innodb-flush-log-at-trx-commit=0",
		"--innodb-doublewrite=0",
		"--skip-log-bin",
		"--max-connections=100",
		"--log-error="+filepath.Join(dir, "error.log"),
	)...)
	srv.Dir = dir
	srv.Stdout, srv.Stderr = &log, &log
	// SIGTERM: a normal shutdown, the sessions ended.
	exited := dbproc.Start(t, srv, cred, syscall.SIGTERM, "mariadbd")
	errLog := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		return log.String() + string(b)
	}
	s := &server{sock: sock, password: password, port: port}
	super, err := mysql.ParseDSN(s.DSN(Superuser, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mysql.NewConnector(super)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dbproc.WaitReady(t, ctx, srv, exited, "mariadbd", errLog, func() error { return db.PingContext(ctx) })
	stmts := []string{
		fmt.Sprintf("CREATE USER '%s'@'localhost' IDENTIFIED BY '%s'", User, password),
		fmt.Sprintf("CREATE DATABASE %s", Database),
		fmt.Sprintf("GRANT ALL ON %s.* TO '%s'@'localhost'", Database, User),
	}
	if ca != nil {
		stmts = append(stmts,
			fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s' REQUIRE X509", User, password),
			fmt.Sprintf("GRANT ALL ON %s.* TO '%s'@'127.0.0.1'", Database, User))
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", strings.ReplaceAll(q, password, "xxxxx"), err)
		}
	}
	return s
}
