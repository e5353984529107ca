// Package testpg runs a real PostgreSQL server for a test — Debian's
// postgresql package, its binaries under /usr/lib/postgresql/VERSION/bin,
// the highest version installed — as k3s and RKE2 use one for their
// datastore (datastore-endpoint: postgres://...): a fresh cluster made with
// initdb in a private temporary directory, its server listening only on a
// unix socket in that directory (no TCP port, so tests in parallel never
// collide), run as an unprivileged user (the postgres user when the test
// runs as root: initdb and postgres refuse root), tuned for speed over
// durability (fsync off), and stopped when the test ends. Start makes a
// database and a role with a password that owns it, and returns a DSN of
// them that kine's pgsql driver takes. StartTLS also listens on a loopback
// TCP port with TLS only, for the tests of a datastore's TLS files.
// Without PostgreSQL installed the test fails, saying what to install: it
// is not skipped.
package testpg

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx", as k3s's kine opens it

	"kube-etcd-migrate/internal/testrig/dbproc"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// Database and Role are what Start makes: the database k3s would keep
// the cluster in, and the role (with a password) that owns it.
const (
	Database = "kine"
	Role     = "k3s"
)

// Superuser is the cluster's superuser, which connects without a password
// (trust) over the socket; every other role gives its password.
const Superuser = "postgres"

// Password is the password of dsn, a datastore-endpoint Start or StartTLS
// returned.
func Password(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("not a PostgreSQL URL: %v", err)
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		t.Fatal("the PostgreSQL URL has no password")
	}
	return pw
}

// Open opens the database of dsn with database/sql ("pgx", as k3s's kine
// does); the caller closes it.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// Start starts a PostgreSQL server for the test and returns a DSN of
// Database as Role, with Role's password:
// postgres://k3s:PASSWORD@/kine?host=SOCKETDIR&sslmode=disable.
func Start(t testing.TB) string {
	t.Helper()
	s := start(t, nil)
	return s.DSN(Role, s.password, Database)
}

// StartTLS is Start, the server also listening on a free port of
// 127.0.0.1 where it takes only TLS connections, its certificate issued by
// ca (for 127.0.0.1), and only from a client presenting a certificate of
// ca's for the role (common name Role) besides the role's password. It
// returns the DSN of Database as Role on that port, without TLS
// parameters (postgres://k3s:PASSWORD@127.0.0.1:PORT/kine), and the one
// Start returns, on the socket.
func StartTLS(t testing.TB, ca *testpki.CA) (tlsDSN, socketDSN string) {
	t.Helper()
	s := start(t, ca)
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s", url.UserPassword(Role, s.password), s.port, Database), s.DSN(Role, s.password, Database)
}

// SuperuserDSN is a DSN of database db on the server of dsn (one Start
// returned), as the superuser: for a test to make or drop databases, or to
// look at the server as its administrator.
func SuperuserDSN(t testing.TB, dsn, db string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(Superuser)
	u.Path = "/" + db
	return u.String()
}

// Exec runs sql on dsn's database as dsn's user.
func Exec(t testing.TB, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to PostgreSQL: %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// server is one running PostgreSQL server.
type server struct {
	sockDir  string
	password string
	port     int // StartTLS's
}

// DSN is a DSN of db as role (with password when not "") on the socket.
func (s *server) DSN(role, password, db string) string {
	q := url.Values{"host": {s.sockDir}, "sslmode": {"disable"}}
	if s.port != 0 { // the socket's name holds the port
		q.Set("port", strconv.Itoa(s.port))
	}
	u := url.URL{Scheme: "postgres", Path: "/" + db, RawQuery: q.Encode()}
	if password != "" {
		u.User = url.UserPassword(role, password)
	} else {
		u.User = url.User(role)
	}
	return u.String()
}

// Bin is the directory of the highest PostgreSQL version installed from
// Debian's packages; the test fails when there is none.
func Bin(t testing.TB) string {
	t.Helper()
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	type v struct {
		dir string
		n   []int
	}
	var vs []v
	for _, f := range found {
		dir := filepath.Dir(f)
		var n []int
		for _, p := range strings.Split(filepath.Base(filepath.Dir(dir)), ".") {
			i, err := strconv.Atoi(p)
			if err != nil {
				n = nil
				break
			}
			n = append(n, i)
		}
		if n == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
			continue
		}
		vs = append(vs, v{dir, n})
	}
	if len(vs) == 0 {
		t.Fatal("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres with its initdb): install Debian's postgresql package (apt-get install postgresql); the tests of a PostgreSQL datastore run a real server")
	}
	sort.Slice(vs, func(i, j int) bool {
		a, b := vs[i].n, vs[j].n
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] > b[k]
			}
		}
		return len(a) > len(b)
	})
	return vs[0].dir
}

func start(t testing.TB, ca *testpki.CA) *server {
	t.Helper()
	bin := Bin(t)
	// initdb and postgres refuse root.
	cred := dbproc.RunAs(t, "postgres", "PostgreSQL", "postgresql")
	dir := dbproc.Dir(t, "testpg-", cred, "sock")
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	password := "pw-" + dbproc.Random(t)
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", Superuser,
		"-E", "UTF8", "--locale=C", "--no-sync", "--auth-local=trust", "--auth-host=reject")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// The superuser without a password, every other role with its own
	// (scram-sha-256, PostgreSQL's default), over the socket only.
	hba := "local all " + Superuser + " trust\nlocal all all scram-sha-256\n"
	if ca != nil {
		hba += "hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
	}
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	dbproc.Chown(t, cred, filepath.Join(data, "pg_hba.conf"))
	listen := []string{"-c", "listen_addresses="}
	port := 0
	if ca != nil {
		cert, key, caFile := dbproc.TLSFiles(t, ca, dir, cred)
		port = dbproc.FreePort(t)
		listen = []string{"-c", "listen_addresses=127.0.0.1", "-c", "port=" + strconv.Itoa(port),
			"-c", "ssl=on", "-c", "ssl_cert_file=" + cert, "-c", "ssl_key_file=" + key, "-c", "ssl_ca_file=" + caFile}
	}
	var log bytes.Buffer
	args := append([]string{"-D", data}, listen...)
	pg := exec.Command(filepath.Join(bin, "postgres"), append(args,
		"-c", "unix_socket_directories="+sock,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=16MB",
		"-c", "max_connections=50",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
	)...)
	pg.Dir = dir
	pg.Stdout, pg.Stderr = &log, &log
	// Fast shutdown (SIGINT): the sessions are ended, the server exits.
	exited := dbproc.Start(t, pg, cred, syscall.SIGINT, "postgres")
	s := &server{sockDir: sock, password: password, port: port}
	super := s.DSN(Superuser, "", "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var conn *pgx.Conn
	dbproc.WaitReady(t, ctx, pg, exited, "postgres", log.String, func() (err error) {
		conn, err = pgx.Connect(ctx, super)
		return err
	})
	defer conn.Close(ctx)
	for _, q := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", Role, password),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", Database, Role),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", strings.ReplaceAll(q, password, "xxxxx"), err)
		}
	}
	return s
}
