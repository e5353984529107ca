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

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx", as k3s's kine opens it
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testpg"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/kinedb"
)

// pgServe serves dsn through kinedb and connects a client; both are
// closed when the test ends (or before, by the caller).
func pgServe(t *testing.T, dsn string, readOnly bool) (*kinedb.Server, *clientv3.Client) {
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

// session opens a plain database/sql connection to dsn's database as k3s's
// kine does (application_name k3s) and returns its server pid and what
// closes it.
func session(t *testing.T, dsn string) (int, func()) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "k3s")
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	var pid int
	if err := db.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid, func() { db.Close() }
}

func password(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		t.Fatalf("testpg's DSN has no password")
	}
	return pw
}

// TestPGWrite: a PostgreSQL datastore served writable takes kube-apiserver's
// create, update and delete transactions and a leased key, and reads them
// back; kine's TTL expiry is not running (an expired leased key stays: the
// tool deletes nothing it did not mean to); Watch and Compact are refused
// cleanly (kine's backend is not started), Alarm lists none and refuses to
// arm one, Status answers; the server's own sessions are not Others.
func TestPGWrite(t *testing.T) {
	s, c, dsn := testkine.ServePG(t)
	ctx := context.Background()
	if s.SQLite() || s.Database != "" {
		t.Fatalf("SQLite() %v, Database %q on PostgreSQL", s.SQLite(), s.Database)
	}
	if want := "the PostgreSQL datastore " + testpg.Database + " on /"; !strings.HasPrefix(s.Name(), want) {
		t.Errorf("Name %q, want it to begin %q", s.Name(), want)
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
	if _, err := c.Maintenance.AlarmDisarm(ctx, &clientv3.AlarmMember{Alarm: etcdserverpb.AlarmType_NOSPACE}); err == nil || !strings.Contains(err.Error(), "PostgreSQL") {
		t.Errorf("disarming an alarm: %v, want a refusal naming PostgreSQL", err)
	}
	if ps, err := s.Others(); err != nil || len(ps) != 0 {
		t.Errorf("Others of a serve alone: %v, %v", ps, err)
	}
	// Still served after all that: nothing panicked.
	testkine.Get(t, c, "/registry/secrets/default/a")
	rows := testkine.PGTable(t, dsn)
	if n := len(rows); n < 6 {
		t.Errorf("kine's table: %d rows, want the writes' among them", n)
	}
}

// TestPGReadOnly: a read-only serve of a PostgreSQL datastore, read
// through, and written through too, leaves kine's table and its id
// sequence as they were, row for row — it is served while a k3s session is
// on the database — and an expired leased key is not deleted.
func TestPGReadOnly(t *testing.T) {
	dsn := testpg.Start(t)
	testkine.InitPG(t, dsn)
	{
		s, c := pgServe(t, dsn, false)
		testkine.Create(t, c, "/registry/events/default/e", "event", testkine.Lease(t, c, 1))
		rev := testkine.Create(t, c, "/registry/secrets/default/a", "one", 0)
		testkine.Update(t, c, "/registry/secrets/default/a", "two", rev, 0)
		c.Close()
		s.Close()
	}
	time.Sleep(1500 * time.Millisecond) // the event's lease runs out
	before := testkine.PGTable(t, dsn)
	session(t, dsn) // k3s running: a reader does not mind
	s, c := pgServe(t, dsn, true)
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
	if after := testkine.PGTable(t, dsn); !slices.Equal(before, after) {
		t.Fatalf("a read-only serve changed kine's table:\nbefore %q\nafter  %q", before, after)
	}

	// k3s in the middle of a long write: kine's setup, which locks its
	// table, gives up after a moment instead of holding k3s's next writes
	// behind it.
	k3s, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer k3s.Close(ctx)
	tx, err := k3s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO kine(name, created, deleted, create_revision, prev_revision, lease, value, old_value) VALUES ('/registry/x', 1, 0, 0, 0, 0, '', '')"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), ReadOnly: true})
	if err == nil || !strings.Contains(err.Error(), "lock timeout") || time.Since(start) > 10*time.Second {
		t.Fatalf("a read-only serve beside a write in progress: %v after %v; want it to give up on the lock", err, time.Since(start))
	}
	t.Log(err)
}

// TestPGNotKine: a missing database, a database without kine's table and
// one whose table lacks an index of kine's are refused, read-only or not,
// and nothing is made in them.
func TestPGNotKine(t *testing.T) {
	dsn := testpg.Start(t)
	ctx := context.Background()
	super := testpg.SuperuserDSN(t, dsn, "postgres")
	other := func(db string) string {
		u, _ := url.Parse(dsn)
		u.Path = "/" + db
		return u.String()
	}
	testpg.Exec(t, super, "CREATE DATABASE empty OWNER "+testpg.Role)
	testpg.Exec(t, super, "CREATE DATABASE old OWNER "+testpg.Role)
	testkine.InitPG(t, other("old"))
	testpg.Exec(t, other("old"), "DROP INDEX kine_list_query_index")
	pw := password(t, dsn)
	for _, ro := range []bool{true, false} {
		for _, db := range []string{"nosuch", "empty"} {
			_, err := kinedb.Serve(ctx, kinedb.Config{DSN: other(db), Dir: t.TempDir(), ReadOnly: ro})
			var nf *kinedb.NotFoundError
			if !errors.As(err, &nf) || !strings.Contains(err.Error(), db) || strings.Contains(err.Error(), pw) {
				t.Errorf("database %s (read-only %v): %v; want a NotFoundError naming it, without the password", db, ro, err)
			}
		}
		_, err := kinedb.Serve(ctx, kinedb.Config{DSN: other("old"), Dir: t.TempDir(), ReadOnly: ro})
		if err == nil || !strings.Contains(err.Error(), "kine_list_query_index") {
			t.Errorf("a table without one of kine's indexes (read-only %v): %v", ro, err)
		}
	}
	// kine would alter its table's columns.
	t.Setenv("KINE_SCHEMA_MIGRATION", "2")
	if _, err := kinedb.Serve(ctx, kinedb.Config{DSN: other("old"), Dir: t.TempDir(), ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "KINE_SCHEMA_MIGRATION") {
		t.Errorf("KINE_SCHEMA_MIGRATION set: %v", err)
	}
	c, err := pgx.Connect(ctx, super)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = 'nosuch'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the missing database: %d, %v; want it not made", n, err)
	}
	for db, rel := range map[string]string{"empty": "kine", "old": "kine_list_query_index"} {
		c, err := pgx.Connect(ctx, other(db))
		if err != nil {
			t.Fatal(err)
		}
		var made bool
		if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", rel).Scan(&made); err != nil || made {
			t.Errorf("%s in %s: made %v, %v", rel, db, made, err)
		}
		c.Close(ctx)
	}
}

// TestPGLocked: a second writable serve of a PostgreSQL datastore is
// refused with a LockedError while the first holds its advisory lock (a
// read-only one is not), and served once the first is closed.
func TestPGLocked(t *testing.T) {
	first, _, dsn := testkine.ServePG(t)
	_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
	var le *kinedb.LockedError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), first.Name()) || !strings.Contains(err.Error(), "locked by another writing run of kube-etcd-migrate") || strings.Contains(err.Error(), password(t, dsn)) {
		t.Fatalf("a second writable serve: %v; want a LockedError naming the datastore", err)
	}
	t.Log(err)
	ro, _ := pgServe(t, dsn, true)
	ro.Close()
	first.Close()
	second, c := pgServe(t, dsn, false)
	testkine.Create(t, c, "/registry/secrets/default/after", "x", 0)
	second.Close()
}

// TestPGInUse: a writable serve is refused while another session is on the
// database (k3s running), naming it; once served, Others sees a session
// opened afterwards (k3s started), not the server's own.
func TestPGInUse(t *testing.T) {
	dsn := testpg.Start(t)
	testkine.InitPG(t, dsn)
	pid, closeSession := session(t, dsn)
	_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
	var iu *kinedb.InUseError
	if !errors.As(err, &iu) || len(iu.Holders) != 1 || iu.Holders[0].PID != pid {
		t.Fatalf("served beside another session (pid %d): %v", pid, err)
	}
	want := fmt.Sprintf(`session %d of user "k3s" (application "k3s")`, pid)
	if msg := err.Error(); !strings.Contains(msg, want) || !strings.Contains(msg, "stop every k3s or RKE2 server") || strings.Contains(msg, password(t, dsn)) {
		t.Fatalf("in use: %q; want it to name %s and the remedy", msg, want)
	}
	t.Log(err)
	closeSession()
	var s *kinedb.Server
	var c *clientv3.Client
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, err = kinedb.Serve(context.Background(), kinedb.Config{DSN: dsn, Dir: t.TempDir()})
		if err == nil {
			break
		}
		if !errors.As(err, &iu) || time.Now().After(deadline) {
			t.Fatal(err) // the closed session's process exits in a moment
		}
	}
	defer s.Close()
	c, err = clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testkine.Create(t, c, "/registry/secrets/default/a", "one", 0) // kine's pool in use
	if ps, err := s.Others(); err != nil || len(ps) != 0 {
		t.Fatalf("Others, alone: %v, %v", ps, err)
	}
	pid, _ = session(t, dsn)
	ps, err := s.Others()
	if err != nil || len(ps) != 1 || ps[0].PID != pid || ps[0].Application != "k3s" || ps[0].User != testpg.Role {
		t.Fatalf("Others with a new session (pid %d): %v, %v", pid, ps, err)
	}
	// Another role's session (an administrator's), which the tool's role
	// may not see in full, is seen too.
	super, _ := session(t, testpg.SuperuserDSN(t, dsn, testpg.Database))
	ps, err = s.Others()
	if err != nil || len(ps) != 2 || ps[1].PID != super || ps[1].User != testpg.Superuser {
		t.Fatalf("Others with the superuser's session (pid %d) too: %v, %v", super, ps, err)
	}
	t.Log(ps)
}

// TestPGSecrets: the DSN's password appears in no name nor error: the
// server's Name, a refused DSN, a connection refused (wrong password), a
// server that is not there, both datastores given, a DSN that is not a URL.
func TestPGSecrets(t *testing.T) {
	dsn := testpg.Start(t)
	testkine.InitPG(t, dsn)
	pw := password(t, dsn)
	ctx := context.Background()
	s, _ := pgServe(t, dsn, true)
	if strings.Contains(s.Name(), pw) {
		t.Fatalf("Name %q holds the password", s.Name())
	}
	s.Close()
	u, _ := url.Parse(dsn)
	wrong := *u
	wrong.User = url.UserPassword(testpg.Role, "Wr0ng:p@ss/w%rd")
	gone := *u
	q := gone.Query()
	q.Set("host", t.TempDir())
	gone.RawQuery = q.Encode()
	cases := map[string]kinedb.Config{
		"wrong password": {DSN: wrong.String()},
		"no server":      {DSN: gone.String()},
		"both":           {DSN: dsn, Database: "/var/lib/rancher/k3s/server/db/state.db"},
		"not a URL":      {DSN: "postgres://k3s:" + pw + "%zz@/kine"},
		"password param": {DSN: "postgresql://k3s@/kine?host=" + url.QueryEscape(t.TempDir()) + "&password=" + pw},
		"other scheme":   {DSN: "mysql://k3s:" + pw + "@tcp(db)/kine"},
		"slash in it":    {DSN: "postgres://k3s:" + pw + "/x@db/kine"},
	}
	for name, cfg := range cases {
		cfg.Dir = t.TempDir()
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := kinedb.Serve(ctx, cfg)
		cancel()
		if err == nil {
			t.Errorf("%s: served", name)
			continue
		}
		t.Logf("%s: %v", name, err)
		for _, secret := range []string{pw, "Wr0ng", "p@ss", url.QueryEscape("Wr0ng:p@ss/w%rd")} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error holds a password: %v", name, err)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: not one line: %q", name, err)
		}
	}
}

// TestPGTLS: a datastore reached over TCP with TLS only, the server
// checking a client certificate, is served with the TLS files as k3s's
// datastore-cafile, -certfile and -keyfile give them (kine's connections
// and the tool's own: verify-full), and refused without them; another
// session's client address is named.
func TestPGTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "pg-ca")
	dsn, local := testpg.StartTLS(t, ca)
	testkine.InitPG(t, local)
	cert, key := ca.Issue(t, dir, testpg.Role, false)
	ctx := context.Background()
	_, err := kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), ReadOnly: true})
	if err == nil || strings.Contains(err.Error(), password(t, dsn)) {
		t.Fatalf("served without TLS files, or the error holds the password: %v", err)
	}
	t.Log(err)
	s, err := kinedb.Serve(ctx, kinedb.Config{DSN: dsn, Dir: t.TempDir(), CAFile: ca.File, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if u, _ := url.Parse(dsn); s.Name() != "the PostgreSQL datastore kine on "+u.Host {
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
	// The server saw kine's connections over TLS.
	var ssl bool
	db, err := sql.Open("pgx", testpg.SuperuserDSN(t, local, testpg.Database))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE 'kube-etcd-migrate-%'").Scan(&ssl); err != nil || !ssl {
		t.Errorf("the tool's sessions over TLS: %v, %v", ssl, err)
	}
	ps, err := s.Others()
	if err != nil || len(ps) != 1 || ps[0].User != testpg.Superuser || ps[0].Client != "" {
		t.Fatalf("Others (the superuser's socket session): %v, %v", ps, err)
	}
	tlsSession := fmt.Sprintf("%s?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s", dsn, ca.File, cert, key)
	pid, _ := session(t, tlsSession)
	ps, err = s.Others()
	if err != nil || len(ps) != 2 || ps[1].PID != pid || !strings.HasPrefix(ps[1].Client, "127.0.0.1:") {
		t.Fatalf("Others with a TCP session (pid %d): %v, %v", pid, ps, err)
	}
	t.Log(ps)
}
