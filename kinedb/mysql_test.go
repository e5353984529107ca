package kinedb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/internal/testrig/testpki"
	"kube-etcd-migrate/kinedb"
)

// myServe serves endpoint through kinedb and connects a client; both are
// closed when the test ends (or before, by the caller).
func myServe(t *testing.T, endpoint string, readOnly bool) (*kinedb.Server, *clientv3.Client) {
	t.Helper()
	s, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: endpoint, Dir: t.TempDir(), ReadOnly: readOnly})
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

// mySession opens a plain database/sql connection to endpoint's database
// as k3s's kine does and returns its connection ID and what closes it.
func mySession(t *testing.T, endpoint string) (int, func()) {
	t.Helper()
	db := testmysql.Open(t, endpoint)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	var id int
	if err := db.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id, func() { db.Close() }
}

// TestMySQLWrite: a MySQL datastore (on a real MariaDB) served writable
// takes kube-apiserver's create, update and delete transactions and a
// leased key, and reads them back; kine's TTL expiry is not running (an
// expired leased key stays); Watch and Compact are refused cleanly (kine's
// backend is not started), Alarm lists none and refuses to arm one, Status
// answers; the server's own sessions are not Others.
func TestMySQLWrite(t *testing.T) {
	s, c, ep := testkine.ServeMySQL(t)
	ctx := context.Background()
	if s.SQLite() || s.Database != "" || s.Kind() != "MySQL" {
		t.Fatalf("SQLite() %v, Database %q, Kind %q on MySQL", s.SQLite(), s.Database, s.Kind())
	}
	if want := "the MySQL datastore " + testmysql.Database + " on /"; !strings.HasPrefix(s.Name(), want) || !strings.HasSuffix(s.Name(), "/mysqld.sock") {
		t.Errorf("Name %q, want it to begin %q and name the socket", s.Name(), want)
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
	if _, err := c.Maintenance.AlarmDisarm(ctx, &clientv3.AlarmMember{Alarm: etcdserverpb.AlarmType_NOSPACE}); err == nil || !strings.Contains(err.Error(), "MySQL") {
		t.Errorf("disarming an alarm: %v, want a refusal naming MySQL", err)
	}
	if ps, err := s.Others(); err != nil || len(ps) != 0 {
		t.Errorf("Others of a serve alone: %v, %v", ps, err)
	}
	testkine.Get(t, c, "/registry/secrets/default/a")
	rows := testkine.MySQLTable(t, ep)
	if n := len(rows); n < 6 {
		t.Errorf("kine's table: %d rows, want the writes' among them", n)
	}
	if got := testkine.MySQLLatest(t, ep); got["/registry/secrets/default/a"] != "lease 0, value 74776F" {
		t.Errorf("the table's latest row of a: %q", got["/registry/secrets/default/a"])
	}
}

// TestMySQLReadOnly: a read-only serve of a MySQL datastore, read through,
// and written through too, leaves kine's table and its AUTO_INCREMENT as
// they were, row for row — it is served while a k3s session is on the
// database — and an expired leased key is not deleted.
func TestMySQLReadOnly(t *testing.T) {
	ep := testmysql.Start(t)
	testkine.InitMySQL(t, ep)
	{
		s, c := myServe(t, ep, false)
		testkine.Create(t, c, "/registry/events/default/e", "event", testkine.Lease(t, c, 1))
		rev := testkine.Create(t, c, "/registry/secrets/default/a", "one", 0)
		testkine.Update(t, c, "/registry/secrets/default/a", "two", rev, 0)
		c.Close()
		s.Close()
	}
	time.Sleep(1500 * time.Millisecond) // the event's lease runs out
	before := testkine.MySQLTable(t, ep)
	mySession(t, ep) // k3s running: a reader does not mind
	s, c := myServe(t, ep, true)
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
	if after := testkine.MySQLTable(t, ep); !slices.Equal(before, after) {
		t.Fatalf("a read-only serve changed kine's table:\nbefore %q\nafter  %q", before, after)
	}

	// k3s in the middle of a write: kine's start on MySQL takes no lock on
	// its table, so a read-only serve neither waits for it nor holds k3s's
	// next writes behind it.
	k3s := testmysql.Open(t, ep)
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
	s, c = myServe(t, ep, true)
	if got := testkine.Get(t, c, "/registry/secrets/default/a"); len(got.Kvs) != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("a read-only serve beside a write in progress: %v after %v", got.Kvs, time.Since(start))
	}
	c.Close()
	s.Close()
}

// TestMySQLNotKine: a missing database and a database without kine's table
// are refused, read-only or not, and nothing is made in them; nor is
// anything served with KINE_SCHEMA_MIGRATION set.
func TestMySQLNotKine(t *testing.T) {
	ep := testmysql.Start(t)
	testkine.InitMySQL(t, ep)
	ctx := context.Background()
	super := testmysql.SuperuserDSN(t, ep, "")
	testmysql.Exec(t, super, "CREATE DATABASE empty", "GRANT ALL ON *.* TO '"+testmysql.User+"'@'localhost'")
	other := func(db string) string { return strings.Replace(ep, "/"+testmysql.Database, "/"+db, 1) }
	pw := testmysql.Password(t, ep)
	for _, ro := range []bool{true, false} {
		for _, db := range []string{"nosuch", "empty"} {
			_, err := kinedb.Serve(ctx, kinedb.Config{DSN: other(db), Dir: t.TempDir(), ReadOnly: ro})
			var nf *kinedb.NotFoundError
			if !errors.As(err, &nf) || !strings.Contains(err.Error(), db) || strings.Contains(err.Error(), pw) {
				t.Errorf("database %s (read-only %v): %v; want a NotFoundError naming it, without the password", db, ro, err)
			}
			t.Log(err)
		}
	}
	t.Setenv("KINE_SCHEMA_MIGRATION", "2")
	if _, err := kinedb.Serve(ctx, kinedb.Config{DSN: ep, Dir: t.TempDir(), ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "KINE_SCHEMA_MIGRATION") {
		t.Errorf("KINE_SCHEMA_MIGRATION set: %v", err)
	}
	db := testmysql.Open(t, super)
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM information_schema.SCHEMATA WHERE schema_name = 'nosuch'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the missing database: %d, %v; want it not made", n, err)
	}
	if err := db.QueryRow("SELECT count(*) FROM information_schema.TABLES WHERE table_schema = 'empty'").Scan(&n); err != nil || n != 0 {
		t.Errorf("tables made in the empty database: %d, %v", n, err)
	}
}

// TestMySQLLocked: a second writable serve of a MySQL datastore is refused
// with a LockedError while the first holds its user lock (a read-only one
// is not), and served once the first is closed; the lock is the
// database's: another database of the same server is not locked.
func TestMySQLLocked(t *testing.T) {
	first, _, ep := testkine.ServeMySQL(t)
	_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: ep, Dir: t.TempDir()})
	var le *kinedb.LockedError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), first.Name()) || !strings.Contains(err.Error(), "locked by another writing run of kube-etcd-migrate") ||
		!strings.Contains(err.Error(), kinedb.MySQLLockName(testmysql.Database)) || strings.Contains(err.Error(), testmysql.Password(t, ep)) {
		t.Fatalf("a second writable serve: %v; want a LockedError naming the datastore and the lock", err)
	}
	t.Log(err)
	ro, _ := myServe(t, ep, true)
	ro.Close()
	// Another database of the server: its own lock.
	testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "CREATE DATABASE other", "GRANT ALL ON other.* TO '"+testmysql.User+"'@'localhost'")
	other := strings.Replace(ep, "/"+testmysql.Database, "/other", 1)
	testkine.InitMySQL(t, other)
	o, _ := myServe(t, other, false)
	o.Close()
	first.Close()
	second, c := myServe(t, ep, false)
	testkine.Create(t, c, "/registry/secrets/default/after", "x", 0)
	second.Close()
	if n := kinedb.MySQLLockName(strings.Repeat("d", 64)); len(n) > 64 || !strings.HasPrefix(n, kinedb.MySQLLockPrefix) {
		t.Errorf("the lock of a database of 64 characters: %q", n)
	}
}

// TestMySQLInUse: a writable serve is refused while another session is on
// the database (k3s running), naming it; once served, Others sees a
// session opened afterwards (k3s started), not the server's own — nor
// kine's pool, however many sessions it opens — and, with the PROCESS
// privilege (without it MySQL shows a user its own sessions only), another
// user's (an administrator's).
func TestMySQLInUse(t *testing.T) {
	ep := testmysql.Start(t)
	testkine.InitMySQL(t, ep)
	testmysql.Exec(t, testmysql.SuperuserDSN(t, ep, ""), "GRANT PROCESS ON *.* TO '"+testmysql.User+"'@'localhost'")
	id, closeSession := mySession(t, ep)
	_, err := kinedb.Serve(context.Background(), kinedb.Config{DSN: ep, Dir: t.TempDir()})
	var iu *kinedb.InUseError
	if !errors.As(err, &iu) || len(iu.Holders) != 1 || iu.Holders[0].PID != id {
		t.Fatalf("served beside another session (id %d): %v", id, err)
	}
	want := fmt.Sprintf(`session %d of user "k3s"`, id)
	if msg := err.Error(); !strings.Contains(msg, want) || !strings.Contains(msg, "stop every k3s or RKE2 server") || strings.Contains(msg, testmysql.Password(t, ep)) {
		t.Fatalf("in use: %q; want it to name %s and the remedy", msg, want)
	}
	t.Log(err)
	closeSession()
	var s *kinedb.Server
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, err = kinedb.Serve(context.Background(), kinedb.Config{DSN: ep, Dir: t.TempDir()})
		if err == nil {
			break
		}
		if !errors.As(err, &iu) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	defer s.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// kine's pool in use, several sessions at once.
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			testkine.Create(t, c, fmt.Sprintf("/registry/secrets/default/p%d", i), "x", 0)
		}()
	}
	for range 8 {
		<-done
	}
	if ps, err := s.Others(); err != nil || len(ps) != 0 {
		t.Fatalf("Others, alone: %v, %v", ps, err)
	}
	id, _ = mySession(t, ep)
	ps, err := s.Others()
	if err != nil || len(ps) != 1 || ps[0].PID != id || ps[0].User != testmysql.User || ps[0].Application != "" {
		t.Fatalf("Others with a new session (id %d): %v, %v", id, ps, err)
	}
	// The superuser's session is seen: the tool's user may see another
	// user's (PROCESS).
	super, _ := mySession(t, testmysql.SuperuserDSN(t, ep, testmysql.Database))
	ps, err = s.Others()
	if err != nil || len(ps) != 2 || ps[1].PID != super || ps[1].User != testmysql.Superuser {
		t.Fatalf("Others with the superuser's session (id %d) too: %v, %v", super, ps, err)
	}
	t.Log(ps)
}

// TestMySQLSecrets: the DSN's password appears in no name nor error: the
// server's Name, a connection refused (wrong password), a server that is
// not there, both datastores given, a DSN that does not parse.
func TestMySQLSecrets(t *testing.T) {
	ep := testmysql.Start(t)
	testkine.InitMySQL(t, ep)
	pw := testmysql.Password(t, ep)
	ctx := context.Background()
	s, _ := myServe(t, ep, true)
	if strings.Contains(s.Name(), pw) {
		t.Fatalf("Name %q holds the password", s.Name())
	}
	s.Close()
	wrongPW := "Wr0ng:p@ss/w%rd"
	cases := map[string]kinedb.Config{
		"wrong password":  {DSN: strings.Replace(ep, pw, wrongPW, 1)},
		"no server":       {DSN: "mysql://k3s:" + pw + "@unix(" + t.TempDir() + "/mysqld.sock)/kine"},
		"no tcp server":   {DSN: "mysql://k3s:" + pw + "@tcp(127.0.0.1:1)/kine"},
		"both":            {DSN: ep, Database: "/var/lib/rancher/k3s/server/db/state.db"},
		"does not parse":  {DSN: "mysql://k3s:" + pw + "@tcp(db/kine"},
		"bad parameter":   {DSN: "mysql://k3s:" + pw + "@tcp(db)/kine?parseTime=" + pw},
		"slash in it":     {DSN: "mysql://k3s:" + pw + "/x@tcp(db/kine"},
		"other scheme":    {DSN: "mysqlx://k3s:" + pw + "@tcp(db)/kine"},
		"no such user db": {DSN: strings.Replace(ep, "/"+testmysql.Database, "/secretdb", 1)},
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
		for _, secret := range []string{pw, "Wr0ng", "p@ss"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error holds a password: %v", name, err)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: not one line: %q", name, err)
		}
	}
}

// TestMySQLTLS: a datastore reached over TCP with TLS only (MariaDB's
// require_secure_transport), the server checking a client certificate
// (REQUIRE X509), is served with the TLS files as k3s's datastore-cafile,
// -certfile and -keyfile give them (kine's connections and the tool's own
// session), and refused without them; another session's client address is
// named.
func TestMySQLTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "mysql-ca")
	ep, local := testmysql.StartTLS(t, ca)
	testkine.InitMySQL(t, local)
	cert, key := ca.Issue(t, dir, testmysql.User, false)
	ctx := context.Background()
	// The account of the TCP sessions ('k3s'@'127.0.0.1') is not the
	// socket's ('k3s'@'localhost'): without PROCESS it would see none of
	// the socket's sessions.
	testmysql.Exec(t, testmysql.SuperuserDSN(t, local, ""), "GRANT PROCESS ON *.* TO '"+testmysql.User+"'@'127.0.0.1'")
	_, err := kinedb.Serve(ctx, kinedb.Config{DSN: ep, Dir: t.TempDir(), ReadOnly: true})
	if err == nil || strings.Contains(err.Error(), testmysql.Password(t, ep)) {
		t.Fatalf("served without TLS files, or the error holds the password: %v", err)
	}
	t.Log(err)
	s, err := kinedb.Serve(ctx, kinedb.Config{DSN: ep, Dir: t.TempDir(), CAFile: ca.File, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if want := "the MySQL datastore kine on 127.0.0.1:"; !strings.HasPrefix(s.Name(), want) {
		t.Errorf("Name %q, want it to begin %q", s.Name(), want)
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
	// The server saw every session of the tool over TLS: it takes no other
	// on TCP; and the tool's are over TCP, not the socket.
	db := testmysql.Open(t, testmysql.SuperuserDSN(t, local, ""))
	defer db.Close()
	var tcp int
	if err := db.QueryRow("SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND HOST LIKE '127.0.0.1:%'", testmysql.Database).Scan(&tcp); err != nil || tcp < 2 {
		t.Errorf("the tool's sessions over TCP: %d, %v; want kine's and the lock's", tcp, err)
	}
	if ps, err := s.Others(); err != nil || len(ps) != 0 {
		t.Fatalf("Others, alone: %v, %v", ps, err)
	}
	id, _ := mySession(t, local)
	ps, err := s.Others()
	if err != nil || len(ps) != 1 || ps[0].PID != id || ps[0].Client != "" {
		t.Fatalf("Others with a socket session (id %d): %v, %v", id, ps, err)
	}
	tlsCfg, err := (kinetls.Config{CAFile: ca.File, CertFile: cert, KeyFile: key}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := mysql.RegisterTLSConfig("testmysqltls", tlsCfg); err != nil {
		t.Fatal(err)
	}
	tcpID, _ := mySession(t, ep+"?tls=testmysqltls")
	ps, err = s.Others()
	if err != nil || len(ps) != 2 || ps[1].PID != tcpID || !strings.HasPrefix(ps[1].Client, "127.0.0.1:") {
		t.Fatalf("Others with a TCP session (id %d): %v, %v", tcpID, ps, err)
	}
	t.Log(ps)
}
