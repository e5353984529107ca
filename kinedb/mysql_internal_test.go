package kinedb

import (
	"strings"
	"testing"
)

// TestParseMySQL: a DSN as k3s's datastore-endpoint gives it is read as
// kine reads it: the database "kubernetes" when none; the name holds the
// host and a port that is not 3306 (a socket's path), never the password;
// the DSN handed to kine tags every session with the Server's user lock.
func TestParseMySQL(t *testing.T) {
	tg, err := parseMySQL(Config{DSN: "mysql://k3s:s@cret/pw@tcp(db.example:3307)/K3S?timeout=5s"})
	if err != nil {
		t.Fatal(err)
	}
	if tg.name != "the MySQL datastore K3S on db.example:3307" {
		t.Errorf("name %q", tg.name)
	}
	if tg.conn.Passwd != "s@cret/pw" || tg.conn.DBName != "K3S" || tg.conn.Addr != "db.example:3307" {
		t.Errorf("config: %+v", tg.conn)
	}
	if !strings.HasPrefix(tg.app, toolApp) || !strings.Contains(tg.kineDSN, tg.app) || !strings.Contains(tg.kineDSN, "GET_LOCK") || tg.conn.Params[myTagParameter] == "" {
		t.Errorf("kine's DSN %q not tagged with %q", strings.ReplaceAll(tg.kineDSN, "s@cret/pw", "xxxxx"), tg.app)
	}
	if !strings.Contains(tg.redact(errorString("x s@cret/pw y")).Error(), "x xxxxx y") {
		t.Errorf("redact left the password")
	}
	for dsn, name := range map[string]string{
		"mysql://k3s@tcp(localhost)/":                 "the MySQL datastore kubernetes on localhost",
		"mysql://k3s:pw@tcp(10.0.0.1:3306)/k":         "the MySQL datastore k on 10.0.0.1",
		"mysql://root@unix(/run/mysqld/mysqld.sock)/": "the MySQL datastore kubernetes on /run/mysqld/mysqld.sock",
	} {
		tg, err := parseMySQL(Config{DSN: dsn})
		if err != nil || tg.name != name {
			t.Errorf("%s: %v, %q; want %q", dsn, err, tg.name, name)
		}
	}
	for _, dsn := range []string{"mysql://k3s:p4ss@tcp(db/kine", "postgres://k3s@db/kine"} {
		if _, err := parseMySQL(Config{DSN: dsn}); err == nil || strings.Contains(err.Error(), "p4ss") {
			t.Errorf("%s: %v", dsn, err)
		}
	}
}
