package kinedb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/internal/testrig/testpg"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/kinedb"
)

// databaseServer is a database server whose database kinedb serves a k3s
// or RKE2 datastore from through kine (kine's pgsql and mysql drivers),
// and the test rig's for it. Every test below runs on each of
// databaseServers; what one server's test does that the other's does not
// is in that test's own table.
type databaseServer struct {
	kind string // as kinedb names it: "PostgreSQL" or "MySQL"
	// database, user and superuser are the test server's (testpg,
	// testmysql): kine's database, the role or user k3s connects as (with
	// a password), the server's administrator (without one, on the socket).
	database, user, superuser string

	start    func(testing.TB) string                        // a fresh server: the DSN of database as user, on the socket
	startTLS func(testing.TB, *testpki.CA) (string, string) // start, also on TLS over TCP: that DSN, and the socket's
	initKine func(testing.TB, string)                       // kine's datastore made in a DSN's database, as k3s's first start does
	// serveKine: start and initKine, served writable; the server, a
	// client and the DSN, closed when the test ends.
	serveKine func(testing.TB) (*kinedb.Server, *clientv3.Client, string)
	table     func(testing.TB, string) []string // kine's table row for row, and its next id
	password  func(testing.TB, string) string   // a DSN's password
	// superuserDSN is database db of dsn's server as the superuser;
	// otherDB, as dsn's user.
	superuserDSN func(t testing.TB, dsn, db string) string
	otherDB      func(dsn, db string) string
	open         func(testing.TB, string) *sql.DB // database/sql on a DSN, as k3s's kine opens it; the caller closes it
	// session opens a plain database/sql connection to a DSN's database as
	// k3s's kine does and returns its session's id (PostgreSQL's server
	// pid, MySQL's connection ID) and what closes it.
	session func(testing.TB, string) (int, func())
}

var (
	postgreSQL = databaseServer{
		kind: "PostgreSQL", database: testpg.Database, user: testpg.Role, superuser: testpg.Superuser,
		start: testpg.Start, startTLS: testpg.StartTLS, initKine: testkine.InitPG, serveKine: testkine.ServePG, table: testkine.PGTable,
		password: testpg.Password, superuserDSN: testpg.SuperuserDSN, otherDB: pgOtherDB, open: testpg.Open, session: pgK3sSession,
	}
	mySQL = databaseServer{
		kind: "MySQL", database: testmysql.Database, user: testmysql.User, superuser: testmysql.Superuser,
		start: testmysql.Start, startTLS: testmysql.StartTLS, initKine: testkine.InitMySQL, serveKine: testkine.ServeMySQL, table: testkine.MySQLTable,
		password: testmysql.Password, superuserDSN: testmysql.SuperuserDSN, otherDB: myOtherDB, open: testmysql.Open, session: myK3sSession,
	}
)

// serveDSN serves dsn through kinedb and connects a client; both are
// closed when the test ends (or before, by the caller).
func serveDSN(t *testing.T, dsn string, readOnly bool) (*kinedb.Server, *clientv3.Client) {
	t.Helper()
	s, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir(), ReadOnly: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return s, c
}

func pgOtherDB(dsn, db string) string {
	u, _ := url.Parse(dsn)
	u.Path = "/" + db
	return u.String()
}

func myOtherDB(endpoint, db string) string {
	return strings.Replace(endpoint, "/"+testmysql.Database, "/"+db, 1)
}

// pgK3sSession is PostgreSQL's session: application_name k3s, as k3s's
// kine sets it.
func pgK3sSession(t testing.TB, dsn string) (int, func()) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "k3s")
	u.RawQuery = q.Encode()
	return k3sSession(t, testpg.Open(t, u.String()), "SELECT pg_backend_pid()")
}

func myK3sSession(t testing.TB, endpoint string) (int, func()) {
	t.Helper()
	return k3sSession(t, testmysql.Open(t, endpoint), "SELECT CONNECTION_ID()")
}

// k3sSession holds one connection of db open, its id read with idQuery.
func k3sSession(t testing.TB, db *sql.DB, idQuery string) (int, func()) {
	t.Helper()
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	var id int
	if err := db.QueryRowContext(context.Background(), idQuery).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id, func() { db.Close() }
}

// TestServerWrite: a PostgreSQL or MySQL datastore (MySQL on a real
// MariaDB) served writable takes kube-apiserver's create, update and
// delete transactions and a leased key, and reads them back; kine's TTL
// expiry is not running (an expired leased key stays: the tool deletes
// nothing it did not mean to); Watch and Compact are refused cleanly
// (kine's backend is not started), Alarm lists none and refuses to arm
// one, Status answers; the server's own sessions are not Others.
func TestServerWrite(t *testing.T) {
	for _, tc := range []struct {
		db databaseServer
		// What MySQL's test checks besides: Kind; that Name ends with the
		// socket's name; the table's latest row of a key written.
		checkKind  bool
		nameSuffix string
		latest     func(testing.TB, string) map[string]string
	}{
		{db: postgreSQL},
		{db: mySQL, checkKind: true, nameSuffix: "/mysqld.sock", latest: testkine.MySQLLatest},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			kind := tc.db.kind
			s, c, dsn := tc.db.serveKine(t)
			ctx := context.Background()
			if s.SQLite() || s.Database != "" || (tc.checkKind && s.Kind() != kind) {
				t.Fatalf("SQLite() %v, Database %q, Kind %q on %s", s.SQLite(), s.Database, s.Kind(), kind)
			}
			if want := "the " + kind + " datastore " + tc.db.database + " on /"; !strings.HasPrefix(s.Name(), want) || (tc.nameSuffix != "" && !strings.HasSuffix(s.Name(), tc.nameSuffix)) {
				t.Errorf("Name %q, want it to begin %q (and end %q)", s.Name(), want, tc.nameSuffix)
			}
			lease := testkine.Lease(t, c, 1)
			ev := testkine.Create(t, c, "/registry/events/default/e", "event", lease)
			rev := testkine.Create(t, c, "/registry/secrets/default/a", "one", 0)
			rev = testkine.Update(t, c, "/registry/secrets/default/a", "two", rev, 0)
			b := testkine.Create(t, c, "/registry/secrets/default/b", "bee", 0)
			testkine.Delete(t, c, "/registry/secrets/default/b", b)
			// A create of an existing key fails as on etcd.
			resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/registry/secrets/default/a"), "=", 0)).
				Then(clientv3.OpPut("/registry/secrets/default/a", "again")).Commit()
			if err != nil || resp.Succeeded {
				t.Fatalf("create of an existing key: %v, succeeded %v", err, resp != nil && resp.Succeeded)
			}
			got := testkine.Get(t, c, "/registry/secrets/default/a")
			if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "two" || got.Kvs[0].ModRevision != rev {
				t.Fatalf("read back: %v", got.Kvs)
			}
			if got := testkine.Get(t, c, "/registry/secrets/default/b"); len(got.Kvs) != 0 {
				t.Fatalf("deleted key read back: %v", got.Kvs)
			}
			list, err := c.Get(ctx, "/registry/secrets/", clientv3.WithPrefix())
			if err != nil || len(list.Kvs) != 1 {
				t.Fatalf("list: %v, %v", list, err)
			}
			time.Sleep(2500 * time.Millisecond) // the event's lease (1 s) runs out
			if got := testkine.Get(t, c, "/registry/events/default/e"); len(got.Kvs) != 1 || got.Kvs[0].ModRevision != ev || got.Kvs[0].Lease != lease {
				t.Fatalf("the expired event: %v; want it kept (kine's TTL expiry not running)", got.Kvs)
			}

			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			wc := c.Watch(wctx, "/registry/", clientv3.WithPrefix())
			select {
			case wr, ok := <-wc:
				if !ok || wr.Err() == nil {
					t.Fatalf("watch: open %v, %+v; want it refused with an error", ok, wr)
				}
				t.Logf("watch: open %v, canceled %v, %q, %v", ok, wr.Canceled, wr.CancelReason, wr.Err())
			case <-wctx.Done():
				t.Fatal("watch: no answer")
			}
			if _, err := c.Compact(ctx, rev); err == nil {
				t.Error("compact: served")
			}
			if _, err := c.Status(ctx, s.Endpoint); err != nil {
				t.Errorf("status: %v", err)
			}
			alarms, err := c.AlarmList(ctx)
			if err != nil || len(alarms.Alarms) != 0 {
				t.Errorf("alarms: %v, %v", alarms, err)
			}
			if _, err := c.Maintenance.AlarmDisarm(ctx, &clientv3.AlarmMember{Alarm: etcdserverpb.AlarmType_NOSPACE}); err == nil || !strings.Contains(err.Error(), kind) {
				t.Errorf("disarming an alarm: %v, want a refusal naming %s", err, kind)
			}
			if ps, err := s.Others(); err != nil || len(ps) != 0 {
				t.Errorf("Others of a serve alone: %v, %v", ps, err)
			}
			// Still served after all that: nothing panicked.
			testkine.Get(t, c, "/registry/secrets/default/a")
			rows := tc.db.table(t, dsn)
			if n := len(rows); n < 6 {
				t.Errorf("kine's table: %d rows, want the writes' among them", n)
			}
			if tc.latest != nil {
				if got := tc.latest(t, dsn); got["/registry/secrets/default/a"] != "lease 0, value 74776F" {
					t.Errorf("the table's latest row of a: %q", got["/registry/secrets/default/a"])
				}
			}
		})
	}
}

// TestServerReadOnly: a read-only serve of a PostgreSQL or MySQL
// datastore, read through, and written through too, leaves kine's table
// and its next id (PostgreSQL's id sequence, MySQL's AUTO_INCREMENT) as
// they were, row for row — it is served while a k3s session is on the
// database — and an expired leased key is not deleted. With k3s in the
// middle of a write, kine's setup on PostgreSQL, which locks its table,
// gives up after a moment instead of holding k3s's next writes behind it;
// kine's start on MySQL takes no lock on its table, so a read-only serve
// neither waits for it nor holds k3s's next writes behind it.
func TestServerReadOnly(t *testing.T) {
	for _, tc := range []struct {
		db databaseServer
		// lockTimeout: a read-only serve beside k3s's write in progress
		// gives up on the lock of kine's table (PostgreSQL's lock_timeout)
		// rather than being served.
		lockTimeout bool
	}{
		{db: postgreSQL, lockTimeout: true},
		{db: mySQL},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			dsn := tc.db.start(t)
			tc.db.initKine(t, dsn)
			{
				s, c := serveDSN(t, dsn, false)
				testkine.Create(t, c, "/registry/events/default/e", "event", testkine.Lease(t, c, 1))
				rev := testkine.Create(t, c, "/registry/secrets/default/a", "one", 0)
				testkine.Update(t, c, "/registry/secrets/default/a", "two", rev, 0)
				c.Close()
				s.Close()
			}
			time.Sleep(1500 * time.Millisecond) // the event's lease runs out
			before := tc.db.table(t, dsn)
			tc.db.session(t, dsn) // k3s running: a reader does not mind
			s, c := serveDSN(t, dsn, true)
			ctx := context.Background()
			if got := testkine.Get(t, c, "/registry/secrets/default/a"); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "two" {
				t.Fatalf("read: %v", got.Kvs)
			}
			if got := testkine.Get(t, c, "/registry/events/default/e"); len(got.Kvs) != 1 {
				t.Fatalf("the expired event: %v", got.Kvs)
			}
			if _, err := c.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Status(ctx, s.Endpoint); err != nil {
				t.Fatal(err)
			}
			if ps, err := s.Others(); err != nil || len(ps) != 0 {
				t.Errorf("Others of a read-only serve: %v, %v; want none (it does not look)", ps, err)
			}
			time.Sleep(time.Second)
			c.Close()
			s.Close()
			if after := tc.db.table(t, dsn); !slices.Equal(before, after) {
				t.Fatalf("a read-only serve changed kine's table:\nbefore %q\nafter  %q", before, after)
			}

			// k3s in the middle of a write.
			k3s := tc.db.open(t, dsn)
			defer k3s.Close()
			tx, err := k3s.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO kine(name, created, deleted, create_revision, prev_revision, lease, value, old_value) VALUES ('/registry/x', 1, 0, 0, 0, 0, '', '')"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if tc.lockTimeout {
				_, err = kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), ReadOnly: true})
				if err == nil || !strings.Contains(err.Error(), "lock timeout") || time.Since(start) > 10*time.Second {
					t.Fatalf("a read-only serve beside a write in progress: %v after %v; want it to give up on the lock", err, time.Since(start))
				}
				t.Log(err)
				return
			}
			s, c = serveDSN(t, dsn, true)
			if got := testkine.Get(t, c, "/registry/secrets/default/a"); len(got.Kvs) != 1 || time.Since(start) > 10*time.Second {
				t.Fatalf("a read-only serve beside a write in progress: %v after %v", got.Kvs, time.Since(start))
			}
			c.Close()
			s.Close()
		})
	}
}

// TestServerNotKine: a missing database and a database without kine's
// table are refused, read-only or not, and nothing is made in them; on
// PostgreSQL one whose table lacks an index of kine's is refused too; nor
// is anything served with KINE_SCHEMA_MIGRATION set (kine would alter its
// table's columns).
func TestServerNotKine(t *testing.T) {
	for _, tc := range []struct {
		db databaseServer
		// setup makes the database "empty" on dsn's server, which the
		// user may use, and the databases of withoutIndex and kineDB.
		setup func(t *testing.T, dsn string)
		// withoutIndex: databases whose kine table lacks the index named,
		// refused naming it.
		withoutIndex map[string]string
		// kineDB: a database with kine's table, served with
		// KINE_SCHEMA_MIGRATION set.
		kineDB string
		// notMade fails the test where the refused serves made anything
		// on dsn's server: the missing database, or in the others.
		notMade func(t *testing.T, dsn string)
	}{
		{
			db: postgreSQL,
			setup: func(t *testing.T, dsn string) {
				super := testpg.SuperuserDSN(t, dsn, "postgres")
				testpg.Exec(t, super, "CREATE DATABASE empty OWNER "+testpg.Role)
				testpg.Exec(t, super, "CREATE DATABASE old OWNER "+testpg.Role)
				testkine.InitPG(t, pgOtherDB(dsn, "old"))
				testpg.Exec(t, pgOtherDB(dsn, "old"), "DROP INDEX kine_list_query_index")
			},
			withoutIndex: map[string]string{"old": "kine_list_query_index"},
			kineDB:       "old",
			notMade: func(t *testing.T, dsn string) {
				ctx := context.Background()
				c, err := pgx.Connect(ctx, testpg.SuperuserDSN(t, dsn, "postgres"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close(ctx)
				var n int
				if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = 'nosuch'").Scan(&n); err != nil || n != 0 {
					t.Errorf("the missing database: %d, %v; want it not made", n, err)
				}
				for db, rel := range map[string]string{"empty": "kine", "old": "kine_list_query_index"} {
					c, err := pgx.Connect(ctx, pgOtherDB(dsn, db))
					if err != nil {
						t.Fatal(err)
					}
					var made bool
					if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", rel).Scan(&made); err != nil || made {
						t.Errorf("%s in %s: made %v, %v", rel, db, made, err)
					}
					c.Close(ctx)
				}
			},
		},
		{
			db: mySQL,
			setup: func(t *testing.T, ep string) {
				testkine.InitMySQL(t, ep)
				testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "CREATE DATABASE empty", "GRANT ALL ON *.* TO '"+testmysql.User+"'@'localhost'")
			},
			kineDB: testmysql.Database,
			notMade: func(t *testing.T, ep string) {
				db := testmysql.Open(t, testmysql.SuperuserDSN(t, ep, ""))
				defer db.Close()
				var n int
				if err := db.QueryRow("SELECT count(*) FROM information_schema.SCHEMATA WHERE schema_name = 'nosuch'").Scan(&n); err != nil || n != 0 {
					t.Errorf("the missing database: %d, %v; want it not made", n, err)
				}
				if err := db.QueryRow("SELECT count(*) FROM information_schema.TABLES WHERE table_schema = 'empty'").Scan(&n); err != nil || n != 0 {
					t.Errorf("tables made in the empty database: %d, %v", n, err)
				}
			},
		},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			dsn := tc.db.start(t)
			ctx := context.Background()
			tc.setup(t, dsn)
			pw := tc.db.password(t, dsn)
			for _, ro := range []bool{true, false} {
				for _, db := range []string{"nosuch", "empty"} {
					_, err := kinedb.Serve(ctx, kinedb.Config{DSN: tc.db.otherDB(dsn, db), Dir: t.TempDir(), ReadOnly: ro})
					var nf *kinedb.NotFoundError
					if !errors.As(err, &nf) || !strings.Contains(err.Error(), db) || strings.Contains(err.Error(), pw) {
						t.Errorf("database %s (read-only %v): %v; want a NotFoundError naming it, without the password", db, ro, err)
					}
					t.Log(err)
				}
				for db, index := range tc.withoutIndex {
					_, err := kinedb.Serve(ctx, kinedb.Config{DSN: tc.db.otherDB(dsn, db), Dir: t.TempDir(), ReadOnly: ro})
					if err == nil || !strings.Contains(err.Error(), index) {
						t.Errorf("a table without one of kine's indexes (read-only %v): %v", ro, err)
					}
				}
			}
			t.Setenv("KINE_SCHEMA_MIGRATION", "2")
			if _, err := kinedb.Serve(ctx, kinedb.Config{DSN: tc.db.otherDB(dsn, tc.kineDB), Dir: t.TempDir(), ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "KINE_SCHEMA_MIGRATION") {
				t.Errorf("KINE_SCHEMA_MIGRATION set: %v", err)
			}
			tc.notMade(t, dsn)
		})
	}
}

// TestServerLocked: a second writable serve of a PostgreSQL or MySQL
// datastore is refused with a LockedError while the first holds its lock
// (PostgreSQL's advisory lock, MySQL's user lock; a read-only serve is
// not), and served once the first is closed. On MySQL the lock is the
// database's: another database of the same server is not locked.
func TestServerLocked(t *testing.T) {
	for _, tc := range []struct {
		db databaseServer
		// lock: the lock the refusal names too ("": none checked).
		lock string
		// ownLock checks, while the first serve holds its lock on dsn's
		// database, that the lock is that database's alone (nil: not
		// checked).
		ownLock func(t *testing.T, dsn string)
	}{
		{db: postgreSQL},
		{db: mySQL, lock: kinedb.MySQLLockName(testmysql.Database), ownLock: func(t *testing.T, ep string) {
			// Another database of the server: its own lock.
			testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "CREATE DATABASE other", "GRANT ALL ON other.* TO '"+testmysql.User+"'@'localhost'")
			other := myOtherDB(ep, "other")
			testkine.InitMySQL(t, other)
			o, _ := serveDSN(t, other, false)
			o.Close()
			// A database's name of 64 characters: its lock's name still a
			// MySQL lock's.
			if n := kinedb.MySQLLockName(strings.Repeat("d", 64)); len(n) > 64 || !strings.HasPrefix(n, kinedb.MySQLLockPrefix) {
				t.Errorf("the lock of a database of 64 characters: %q", n)
			}
		}},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			first, _, dsn := tc.db.serveKine(t)
			_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
			var le *kinedb.LockedError
			if !errors.As(err, &le) || !strings.Contains(err.Error(), first.Name()) || !strings.Contains(err.Error(), "locked by another writing run of kube-etcd-migrate") ||
				(tc.lock != "" && !strings.Contains(err.Error(), tc.lock)) || strings.Contains(err.Error(), tc.db.password(t, dsn)) {
				t.Fatalf("a second writable serve: %v; want a LockedError naming the datastore (and the lock %q)", err, tc.lock)
			}
			t.Log(err)
			ro, _ := serveDSN(t, dsn, true)
			ro.Close()
			if tc.ownLock != nil {
				tc.ownLock(t, dsn)
			}
			first.Close()
			second, c := serveDSN(t, dsn, false)
			testkine.Create(t, c, "/registry/secrets/default/after", "x", 0)
			second.Close()
		})
	}
}

// TestServerInUse: a writable serve is refused while another session is on
// the database (k3s running), naming it; once served, Others sees a
// session opened afterwards (k3s started), not the server's own — nor, on
// MySQL, kine's pool, however many sessions it opens — and another role's
// or user's (an administrator's), which the tool's may not see in full:
// on MySQL with the PROCESS privilege (without it MySQL shows a user its
// own sessions only).
func TestServerInUse(t *testing.T) {
	for _, tc := range []struct {
		db databaseServer
		// grant: what the server's user is granted first (nil: nothing).
		grant func(t *testing.T, dsn string)
		// holder: how the refusal names the other session (%d its id).
		holder string
		// application: Others' Application of a session as k3s's kine
		// opens it.
		application string
		// pool: how many writes at once go through kine's pool before
		// Others is asked.
		pool int
	}{
		{db: postgreSQL, holder: `session %d of user "k3s" (application "k3s")`, application: "k3s", pool: 1},
		{db: mySQL, grant: func(t *testing.T, ep string) {
			testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "GRANT PROCESS ON *.* TO '"+testmysql.User+"'@'localhost'")
		}, holder: `session %d of user "k3s"`, pool: 8},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			dsn := tc.db.start(t)
			tc.db.initKine(t, dsn)
			if tc.grant != nil {
				tc.grant(t, dsn)
			}
			id, closeSession := tc.db.session(t, dsn)
			_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
			var iu *kinedb.InUseError
			if !errors.As(err, &iu) || len(iu.Holders) != 1 || iu.Holders[0].PID != id {
				t.Fatalf("served beside another session (%d): %v", id, err)
			}
			want := fmt.Sprintf(tc.holder, id)
			if msg := err.Error(); !strings.Contains(msg, want) || !strings.Contains(msg, "stop every k3s or RKE2 server") || strings.Contains(msg, tc.db.password(t, dsn)) {
				t.Fatalf("in use: %q; want it to name %s and the remedy", msg, want)
			}
			t.Log(err)
			closeSession()
			var s *kinedb.Server
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				s, err = kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
				if err == nil {
					break
				}
				if !errors.As(err, &iu) || time.Now().After(deadline) {
					t.Fatal(err) // the closed session ends in a moment
				}
			}
			defer s.Close()
			c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// kine's pool in use.
			done := make(chan struct{})
			for i := range tc.pool {
				go func() {
					defer func() { done <- struct{}{} }()
					testkine.Create(t, c, fmt.Sprintf("/registry/secrets/default/p%d", i), "x", 0)
				}()
			}
			for range tc.pool {
				<-done
			}
			if ps, err := s.Others(); err != nil || len(ps) != 0 {
				t.Fatalf("Others, alone: %v, %v", ps, err)
			}
			id, _ = tc.db.session(t, dsn)
			ps, err := s.Others()
			if err != nil || len(ps) != 1 || ps[0].PID != id || ps[0].Application != tc.application || ps[0].User != tc.db.user {
				t.Fatalf("Others with a new session (%d): %v, %v", id, ps, err)
			}
			super, _ := tc.db.session(t, tc.db.superuserDSN(t, dsn, tc.db.database))
			ps, err = s.Others()
			if err != nil || len(ps) != 2 || ps[1].PID != super || ps[1].User != tc.db.superuser {
				t.Fatalf("Others with the superuser's session (%d) too: %v, %v", super, ps, err)
			}
			t.Log(ps)
		})
	}
}

// TestServerSecrets: the DSN's password appears in no name nor error: the
// server's Name, a connection refused (wrong password), a server that is
// not there, both datastores given, a DSN that is not a URL or does not
// parse, and each server's own.
func TestServerSecrets(t *testing.T) {
	const wrongPW = "Wr0ng:p@ss/w%rd"
	for _, tc := range []struct {
		db databaseServer
		// cases are the refused configurations on dsn's server, its
		// password pw; secrets, what no error may hold besides pw,
		// "Wr0ng" and "p@ss".
		cases   func(t *testing.T, dsn, pw string) map[string]kinedb.Config
		secrets []string
	}{
		{
			db: postgreSQL,
			cases: func(t *testing.T, dsn, pw string) map[string]kinedb.Config {
				u, _ := url.Parse(dsn)
				wrong := *u
				wrong.User = url.UserPassword(testpg.Role, wrongPW)
				gone := *u
				q := gone.Query()
				q.Set("host", t.TempDir())
				gone.RawQuery = q.Encode()
				return map[string]kinedb.Config{
					"wrong password": {DSN: wrong.String()},
					"no server":      {DSN: gone.String()},
					"both":           {DSN: dsn, Database: "/var/lib/rancher/k3s/server/db/state.db"},
					"not a URL":      {DSN: "postgres://k3s:" + pw + "%zz@/kine"},
					"password param": {DSN: "postgresql://k3s@/kine?host=" + url.QueryEscape(t.TempDir()) + "&password=" + pw},
					"other scheme":   {DSN: "mysql://k3s:" + pw + "@tcp(db)/kine"},
					"slash in it":    {DSN: "postgres://k3s:" + pw + "/x@db/kine"},
				}
			},
			secrets: []string{url.QueryEscape(wrongPW)},
		},
		{
			db: mySQL,
			cases: func(t *testing.T, ep, pw string) map[string]kinedb.Config {
				return map[string]kinedb.Config{
					"wrong password":  {DSN: strings.Replace(ep, pw, wrongPW, 1)},
					"no server":       {DSN: "mysql://k3s:" + pw + "@unix(" + t.TempDir() + "/mysqld.sock)/kine"},
					"no tcp server":   {DSN: "mysql://k3s:" + pw + "@tcp(127.0.0.1:1)/kine"},
					"both":            {DSN: ep, Database: "/var/lib/rancher/k3s/server/db/state.db"},
					"does not parse":  {DSN: "mysql://k3s:" + pw + "@tcp(db/kine"},
					"bad parameter":   {DSN: "mysql://k3s:" + pw + "@tcp(db)/kine?parseTime=" + pw},
					"slash in it":     {DSN: "mysql://k3s:" + pw + "/x@tcp(db/kine"},
					"other scheme":    {DSN: "mysqlx://k3s:" + pw + "@tcp(db)/kine"},
					"no such user db": {DSN: myOtherDB(ep, "secretdb")},
				}
			},
		},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			dsn := tc.db.start(t)
			tc.db.initKine(t, dsn)
			pw := tc.db.password(t, dsn)
			ctx := context.Background()
			s, _ := serveDSN(t, dsn, true)
			if strings.Contains(s.Name(), pw) {
				t.Fatalf("Name %q holds the password", s.Name())
			}
			s.Close()
			for name, cfg := range tc.cases(t, dsn, pw) {
				cfg.Dir = t.TempDir()
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := kinedb.Serve(ctx, cfg)
				cancel()
				if err == nil {
					t.Errorf("%s: served", name)
					continue
				}
				t.Logf("%s: %v", name, err)
				for _, secret := range append([]string{pw, "Wr0ng", "p@ss"}, tc.secrets...) {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("%s: the error holds a password: %v", name, err)
					}
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("%s: not one line: %q", name, err)
				}
			}
		})
	}
}

// TestServerTLS: a datastore reached over TCP with TLS only, the server
// checking a client certificate (MariaDB's require_secure_transport and
// REQUIRE X509), is served with the TLS files as k3s's datastore-cafile,
// -certfile and -keyfile give them (kine's connections and the tool's own:
// PostgreSQL's verify-full), and refused without them; another session's
// client address is named.
func TestServerTLS(t *testing.T) {
	for _, tc := range []struct {
		db     databaseServer
		caName string
		// grant: what the server's user is granted first, on the server of
		// the socket's DSN local (nil: nothing).
		grant func(t *testing.T, local string)
		// name: whether Name is as it should be for the TLS DSN dsn.
		name func(name, dsn string) bool
		// socketSession checks, s served, that the server saw the tool's
		// sessions over TLS and that Others names a session on the socket
		// without a client address (local the socket's DSN).
		socketSession func(t *testing.T, s *kinedb.Server, local string)
		// tlsSession is a DSN of dsn's database over TLS with the CA's
		// file, cert and key, for a session as k3s's kine opens one.
		tlsSession func(t *testing.T, dsn, caFile, cert, key string) string
	}{
		{
			db: postgreSQL, caName: "pg-ca",
			name: func(name, dsn string) bool {
				u, _ := url.Parse(dsn)
				return name == "the PostgreSQL datastore kine on "+u.Host
			},
			socketSession: func(t *testing.T, s *kinedb.Server, local string) {
				// The server saw kine's connections over TLS.
				var ssl bool
				db := testpg.Open(t, testpg.SuperuserDSN(t, local, testpg.Database))
				t.Cleanup(func() { db.Close() })
				if err := db.QueryRow("SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE 'kube-etcd-migrate-%'").Scan(&ssl); err != nil || !ssl {
					t.Errorf("the tool's sessions over TLS: %v, %v", ssl, err)
				}
				ps, err := s.Others()
				if err != nil || len(ps) != 1 || ps[0].User != testpg.Superuser || ps[0].Client != "" {
					t.Fatalf("Others (the superuser's socket session): %v, %v", ps, err)
				}
			},
			tlsSession: func(t *testing.T, dsn, caFile, cert, key string) string {
				return fmt.Sprintf("%s?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s", dsn, caFile, cert, key)
			},
		},
		{
			db: mySQL, caName: "mysql-ca",
			// The account of the TCP sessions ('k3s'@'127.0.0.1') is not
			// the socket's ('k3s'@'localhost'): without PROCESS it would
			// see none of the socket's sessions.
			grant: func(t *testing.T, local string) {
				testmysql.Exec(t, testmysql.SuperuserDSN(t, local, ""), "GRANT PROCESS ON *.* TO '"+testmysql.User+"'@'127.0.0.1'")
			},
			name: func(name, _ string) bool { return strings.HasPrefix(name, "the MySQL datastore kine on 127.0.0.1:") },
			socketSession: func(t *testing.T, s *kinedb.Server, local string) {
				// The server saw every session of the tool over TLS: it
				// takes no other on TCP; and the tool's are over TCP, not
				// the socket.
				db := testmysql.Open(t, testmysql.SuperuserDSN(t, local, ""))
				t.Cleanup(func() { db.Close() })
				var tcp int
				if err := db.QueryRow("SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND HOST LIKE '127.0.0.1:%'", testmysql.Database).Scan(&tcp); err != nil || tcp < 2 {
					t.Errorf("the tool's sessions over TCP: %d, %v; want kine's and the lock's", tcp, err)
				}
				if ps, err := s.Others(); err != nil || len(ps) != 0 {
					t.Fatalf("Others, alone: %v, %v", ps, err)
				}
				id, _ := myK3sSession(t, local)
				ps, err := s.Others()
				if err != nil || len(ps) != 1 || ps[0].PID != id || ps[0].Client != "" {
					t.Fatalf("Others with a socket session (id %d): %v, %v", id, ps, err)
				}
			},
			tlsSession: func(t *testing.T, ep, caFile, cert, key string) string {
				tlsCfg, err := (kinetls.Config{CAFile: caFile, CertFile: cert, KeyFile: key}).ClientConfig()
				if err != nil {
					t.Fatal(err)
				}
				if err := mysql.RegisterTLSConfig("testmysqltls", tlsCfg); err != nil {
					t.Fatal(err)
				}
				return ep + "?tls=testmysqltls"
			},
		},
	} {
		t.Run(tc.db.kind, func(t *testing.T) {
			dir := t.TempDir()
			ca := testpki.NewCA(t, dir, tc.caName)
			dsn, local := tc.db.startTLS(t, ca)
			tc.db.initKine(t, local)
			cert, key := ca.Issue(t, dir, tc.db.user, false)
			ctx := context.Background()
			if tc.grant != nil {
				tc.grant(t, local)
			}
			_, err := kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), ReadOnly: true})
			if err == nil || strings.Contains(err.Error(), tc.db.password(t, dsn)) {
				t.Fatalf("served without TLS files, or the error holds the password: %v", err)
			}
			t.Log(err)
			s, err := kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), CAFile: ca.File, CertFile: cert, KeyFile: key})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if !tc.name(s.Name(), dsn) {
				t.Errorf("Name %q", s.Name())
			}
			c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rev := testkine.Create(t, c, "/registry/secrets/default/a", "one", 0)
			if got := testkine.Get(t, c, "/registry/secrets/default/a"); len(got.Kvs) != 1 || got.Kvs[0].ModRevision != rev {
				t.Fatalf("read back over TLS: %v", got.Kvs)
			}
			tc.socketSession(t, s, local)
			id, _ := tc.db.session(t, tc.tlsSession(t, dsn, ca.File, cert, key))
			ps, err := s.Others()
			if err != nil || len(ps) != 2 || ps[1].PID != id || !strings.HasPrefix(ps[1].Client, "127.0.0.1:") {
				t.Fatalf("Others with a TCP session (%d): %v, %v", id, ps, err)
			}
			t.Log(ps)
		})
	}
}
