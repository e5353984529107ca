// Package testkine serves a fresh k3s SQLite datastore through kine
// (kinedb.Serve, writable) for the tests — or a PostgreSQL one, on a real
// server (testpg), or a MySQL one, on a real MariaDB (testmysql) — and seeds it as kube-apiserver writes through kine:
// each key created with the transaction its storage layer sends, an
// event's attached to a lease (on kine, the TTL in seconds).
package testkine

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/k3s-io/kine/pkg/drivers"
	kinemysql "github.com/k3s-io/kine/pkg/drivers/mysql"
	"github.com/k3s-io/kine/pkg/drivers/pgsql"
	"github.com/k3s-io/kine/pkg/server"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/internal/testrig/testpg"
	"kube-etcd-migrate/kinedb"
)

// Start serves an empty SQLite file (kine makes its table in it, as k3s's
// first start does) in a temporary directory and returns a client of it;
// both are closed when the test ends.
func Start(t testing.TB) *clientv3.Client {
	_, cli := Serve(t)
	return cli
}

// Serve is Start, also returning the server (its Database, Others).
func Serve(t testing.TB) (*kinedb.Server, *clientv3.Client) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, cli := open(t, db)
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { cli.Close() }) // before the server's (cleanups run last first)
	return s, cli
}

// Seed serves the SQLite file db (made empty when it does not exist:
// kine makes its table in it, as k3s's first start does), hands a client
// of it to seed, and closes both: the file is then free for a command to
// serve (kinedb locks it while it serves it writable).
func Seed(t testing.TB, db string, seed func(cli *clientv3.Client)) {
	t.Helper()
	if _, err := os.Stat(db); os.IsNotExist(err) {
		if err := os.WriteFile(db, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, cli := open(t, db)
	defer s.Close()
	defer cli.Close()
	if seed != nil {
		seed(cli)
	}
}

// open serves db writable, from a private directory of the test's, and
// connects a client to it.
func open(t testing.TB, db string) (*kinedb.Server, *clientv3.Client) {
	t.Helper()
	priv := filepath.Join(t.TempDir(), "kine")
	if err := os.Mkdir(priv, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := kinedb.Serve(context.Background(), kinedb.Config{Database: db, Dir: priv})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	return s, cli
}

// Lease grants a lease of ttl seconds as kube-apiserver does for an event;
// on kine its ID is the TTL.
func Lease(t testing.TB, cli *clientv3.Client, ttl int64) int64 {
	t.Helper()
	l, err := cli.Grant(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return int64(l.ID)
}

// Create creates key with value (attached to lease unless 0) with
// kube-apiserver's create transaction, and returns its mod revision.
func Create(t testing.TB, cli *clientv3.Client, key, value string, lease int64) int64 {
	t.Helper()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	resp, err := cli.Txn(context.Background()).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, opts...)).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded {
		t.Fatalf("create %s: it exists", key)
	}
	return resp.Header.Revision
}

// Update writes value to key at mod revision rev (keeping lease) with
// kube-apiserver's update transaction, and returns the new mod revision.
func Update(t testing.TB, cli *clientv3.Client, key, value string, rev, lease int64) int64 {
	t.Helper()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	resp, err := cli.Txn(context.Background()).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, value, opts...)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded {
		t.Fatalf("update %s at %d: changed meanwhile", key, rev)
	}
	return resp.Header.Revision
}

// Delete deletes key at mod revision rev with kube-apiserver's delete
// transaction.
func Delete(t testing.TB, cli *clientv3.Client, key string, rev int64) {
	t.Helper()
	resp, err := cli.Txn(context.Background()).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded {
		t.Fatalf("delete %s at %d: changed meanwhile", key, rev)
	}
}

// Get reads key (nil when it is absent).
func Get(t testing.TB, cli *clientv3.Client, key string) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Latest is every key of the kine datastore in the SQLite file db as
// kube-apiserver reads it: its latest row (kine appends one per write),
// unless that row deletes it, as its lease and value.
func Latest(t testing.TB, db string) map[string]string {
	t.Helper()
	rows := map[string]string{}
	query(t, db, `SELECT k.name, k.lease, hex(k.value) FROM kine k JOIN (SELECT name, MAX(id) AS id FROM kine GROUP BY name) m ON k.id = m.id WHERE k.deleted = 0`, func(r *sql.Rows) error {
		var name, value string
		var lease int64
		if err := r.Scan(&name, &lease, &value); err != nil {
			return err
		}
		rows[name] = fmt.Sprintf("lease %d, value %s", lease, value)
		return nil
	})
	return rows
}

// Table is every row of the kine table in the SQLite file db, every
// column, in order: what a command that writes nothing leaves as it was
// (the file's bytes may change: SQLite folds its write-ahead log into it).
func Table(t testing.TB, db string) []string {
	t.Helper()
	var rows []string
	query(t, db, `SELECT id, name, created, deleted, ifnull(create_revision, -1), ifnull(prev_revision, -1), lease, hex(value), hex(old_value) FROM kine ORDER BY id`, func(r *sql.Rows) error {
		var id, created, deleted, crev, prev, lease int64
		var name, value, old string
		if err := r.Scan(&id, &name, &created, &deleted, &crev, &prev, &lease, &value, &old); err != nil {
			return err
		}
		rows = append(rows, fmt.Sprint(id, name, created, deleted, crev, prev, lease, value, old))
		return nil
	})
	if len(rows) == 0 {
		t.Fatalf("%s: no row in kine's table", db)
	}
	return rows
}

// query runs q on the SQLite file db, read-only, each row to row.
func query(t testing.TB, db, q string, row func(*sql.Rows) error) {
	t.Helper()
	// A busy timeout as the tool's own read of the file has (kinedb.Copy):
	// the last connection of a server just closed may still be folding
	// the write-ahead log into the file (SQLITE_BUSY without one).
	d, err := sql.Open("sqlite", "file:"+db+"?mode=ro&_pragma=busy_timeout(30000)")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rs, err := d.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", db, err)
	}
	defer rs.Close()
	for rs.Next() {
		if err := row(rs); err != nil {
			t.Fatalf("%s: %v", db, err)
		}
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("%s: %v", db, err)
	}
}

// InitPG makes kine's datastore in the PostgreSQL database of dsn (one
// testpg.Start returned) as a k3s server's first start does (initKine);
// then it is stopped as k3s stops: once its sessions have ended (their
// server processes exit a moment after kine closes its connections).
func InitPG(t testing.TB, dsn string) {
	t.Helper()
	initKine(t, "PostgreSQL", strings.TrimPrefix(dsn, "postgres://"), pgsql.New)
	super := testpg.SuperuserDSN(t, dsn, "postgres")
	c, err := pgx.Connect(context.Background(), super)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	waitNoSessions(t, "kine's sessions on "+db, func() (n int, err error) {
		err = c.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'", db).Scan(&n)
		return n, err
	})
}

// initKine makes kine's datastore in a database server's database as a
// k3s server's first start does, with kine's driver for it (newDriver,
// given the DSN without its scheme): kine makes its table and indexes,
// its backend started writes the compact_rev_key and the health key; then
// it is stopped. kind names the server in a failure.
func initKine(t testing.TB, kind, dsn string, newDriver func(context.Context, *sync.WaitGroup, *drivers.Config) (bool, server.Backend, error)) {
	t.Helper()
	logrus.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	_, backend, err := newDriver(ctx, wg, &drivers.Config{
		DataSourceName:   dsn,
		PollInterval:     time.Second,
		CompactTimeout:   5 * time.Second,
		CompactMinRetain: 1000,
		CompactBatchSize: 1000,
		PollBatchSize:    500,
	})
	if err != nil {
		cancel()
		t.Fatalf("kine on %s: %v", kind, err)
	}
	err = backend.Start(ctx)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatalf("kine on %s: %v", kind, err)
	}
}

// waitNoSessions waits until count, the sessions on a database, says
// none; what names them in a failure.
func waitNoSessions(t testing.TB, what string, count func() (int, error)) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err := count()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s have not ended: %d", what, n)
		}
	}
}

// ServePG starts a PostgreSQL server (testpg.Start), makes kine's
// datastore in it (InitPG) and serves it writable (kinedb.Serve): the
// server, a client of it and the database's DSN (with its role's
// password), closed when the test ends.
func ServePG(t testing.TB) (*kinedb.Server, *clientv3.Client, string) {
	t.Helper()
	dsn := testpg.Start(t)
	InitPG(t, dsn)
	s, cli := serveServer(t, dsn)
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { cli.Close() }) // before the server's
	return s, cli, dsn
}

// serveServer serves the kine datastore of a database server's dsn
// writable (kinedb.Serve) and connects a client to it; the caller closes
// both, the client first.
func serveServer(t testing.TB, dsn string) (*kinedb.Server, *clientv3.Client) {
	t.Helper()
	s, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	return s, cli
}

// seedServer serves the kine datastore of a database server's dsn and
// hands seed a client of it, then stops serving.
func seedServer(t testing.TB, dsn string, seed func(cli *clientv3.Client)) {
	t.Helper()
	s, cli := serveServer(t, dsn)
	defer s.Close()
	defer cli.Close()
	if seed != nil {
		seed(cli)
	}
}

// PGTable is every row of the kine table in the PostgreSQL database of
// dsn, every column, in order (SELECT * ORDER BY id), and the last value of
// its id sequence (a failed insert takes one too): what a serve that
// writes nothing leaves as it was.
func PGTable(t testing.TB, dsn string) []string {
	t.Helper()
	var out []string
	pgQuery(t, dsn, "SELECT * FROM kine ORDER BY id", func(r pgx.Rows) error {
		vals, err := r.Values()
		out = append(out, fmt.Sprintf("%q", vals))
		return err
	})
	if len(out) == 0 {
		t.Fatal("no row in kine's table")
	}
	pgQuery(t, dsn, "SELECT last_value, is_called FROM kine_id_seq", func(r pgx.Rows) error {
		var seq int64
		var called bool
		err := r.Scan(&seq, &called)
		out = append(out, fmt.Sprintf("kine_id_seq %d %v", seq, called))
		return err
	})
	return out
}

// PGLatest is Latest for the kine datastore in the PostgreSQL database of
// dsn: every key as kube-apiserver reads it, its latest row unless that row
// deletes it, as its lease and value.
func PGLatest(t testing.TB, dsn string) map[string]string {
	t.Helper()
	out := map[string]string{}
	pgQuery(t, dsn, "SELECT name, lease, value FROM (SELECT DISTINCT ON (name) name, deleted, lease, value FROM kine ORDER BY name, id DESC) AS latest WHERE deleted = 0", func(r pgx.Rows) error {
		var name string
		var lease int64
		var value []byte
		err := r.Scan(&name, &lease, &value)
		out[name] = fmt.Sprintf("lease %d, value %X", lease, value)
		return err
	})
	return out
}

// pgQuery runs q on the PostgreSQL database of dsn, each row to row.
func pgQuery(t testing.TB, dsn, q string, row func(pgx.Rows) error) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// SeedPG makes kine's datastore in the PostgreSQL database of dsn (InitPG),
// serves it writable, hands a client of it to seed, and closes both: the
// database is then free for a command to serve.
func SeedPG(t testing.TB, dsn string, seed func(cli *clientv3.Client)) {
	t.Helper()
	InitPG(t, dsn)
	seedServer(t, dsn, seed)
}

// InitMySQL makes kine's datastore in the MySQL database of endpoint (one
// testmysql.Start returned) as a k3s server's first start does (initKine);
// then it is stopped, once its sessions have ended.
func InitMySQL(t testing.TB, endpoint string) {
	t.Helper()
	initKine(t, "MySQL", strings.TrimPrefix(endpoint, "mysql://"), kinemysql.New)
	WaitMySQLSessions(t, endpoint)
}

// WaitMySQLSessions waits until no session is on the MySQL database of
// endpoint (as the server's superuser sees them): a client just closed
// leaves its session for a moment.
func WaitMySQLSessions(t testing.TB, endpoint string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(strings.TrimPrefix(endpoint, "mysql://"))
	if err != nil {
		t.Fatal(err)
	}
	db := testmysql.Open(t, testmysql.SuperuserDSN(t, endpoint, ""))
	defer db.Close()
	waitNoSessions(t, "the sessions on "+cfg.DBName, func() (n int, err error) {
		err = db.QueryRow("SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = ?", cfg.DBName).Scan(&n)
		return n, err
	})
}

// ServeMySQL starts a MariaDB server (testmysql.Start), makes kine's
// datastore in it (InitMySQL) and serves it writable (kinedb.Serve): the
// server, a client of it and the database's endpoint (with its user's
// password), closed when the test ends.
func ServeMySQL(t testing.TB) (*kinedb.Server, *clientv3.Client, string) {
	t.Helper()
	ep := testmysql.Start(t)
	InitMySQL(t, ep)
	s, cli := serveServer(t, ep)
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { cli.Close() }) // before the server's
	return s, cli, ep
}

// MySQLTable is every row of the kine table in the MySQL database of
// endpoint, every column, in order (SELECT * ORDER BY id), and the table's
// next AUTO_INCREMENT id (a failed insert takes one too): what a serve
// that writes nothing leaves as it was.
func MySQLTable(t testing.TB, endpoint string) []string {
	t.Helper()
	var out []string
	myQuery(t, endpoint, "SELECT id, name, created, deleted, create_revision, prev_revision, lease, hex(value), hex(old_value) FROM kine ORDER BY id", func(r *sql.Rows) error {
		var id, created, deleted, crev, prev, lease sql.NullInt64
		var name, value, old sql.NullString
		err := r.Scan(&id, &name, &created, &deleted, &crev, &prev, &lease, &value, &old)
		out = append(out, fmt.Sprint(id, name, created, deleted, crev, prev, lease, value, old))
		return err
	})
	if len(out) == 0 {
		t.Fatal("no row in kine's table")
	}
	// Read where InnoDB keeps it (information_schema.TABLES caches it).
	myQuery(t, endpoint, "SHOW CREATE TABLE kine", func(r *sql.Rows) error {
		var name, create string
		err := r.Scan(&name, &create)
		for _, f := range strings.Fields(create) {
			if strings.HasPrefix(f, "AUTO_INCREMENT=") {
				out = append(out, "kine "+f)
			}
		}
		return err
	})
	return out
}

// MySQLLatest is Latest for the kine datastore in the MySQL database of
// endpoint: every key as kube-apiserver reads it, its latest row unless
// that row deletes it, as its lease and value.
func MySQLLatest(t testing.TB, endpoint string) map[string]string {
	t.Helper()
	out := map[string]string{}
	myQuery(t, endpoint, "SELECT k.name, k.lease, hex(k.value) FROM kine k JOIN (SELECT name, MAX(id) AS id FROM kine GROUP BY name) m ON k.id = m.id WHERE k.deleted = 0", func(r *sql.Rows) error {
		var name, value string
		var lease int64
		err := r.Scan(&name, &lease, &value)
		out[name] = fmt.Sprintf("lease %d, value %s", lease, value)
		return err
	})
	return out
}

// myQuery runs q on the MySQL database of endpoint, each row to row.
func myQuery(t testing.TB, endpoint, q string, row func(*sql.Rows) error) {
	t.Helper()
	db := testmysql.Open(t, endpoint)
	defer db.Close()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// SeedMySQL makes kine's datastore in the MySQL database of endpoint
// (InitMySQL), serves it writable, hands a client of it to seed, and closes
// both: the database is then free for a command to serve, once the
// served sessions have ended.
func SeedMySQL(t testing.TB, endpoint string, seed func(cli *clientv3.Client)) {
	t.Helper()
	InitMySQL(t, endpoint)
	seedServer(t, endpoint, seed)
	WaitMySQLSessions(t, endpoint)
}
