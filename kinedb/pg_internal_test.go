package kinedb

import (
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testpki"
)

// TestParsePG: a DSN as k3s's datastore-endpoint gives it, with its TLS
// files, is read as kine reads it: the database lowercased ("kubernetes"
// when none), sslmode verify-full with the CA and the client certificate;
// the name holds the host and a port that is not 5432, never the password
// (also percent-encoded); the DSN handed to kine is tagged with the
// Server's application_name.
func TestParsePG(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "pg-ca")
	cert, key := ca.Issue(t, dir, "k3s", false)
	tg, err := parsePG(Config{DSN: "postgres://k3s:s%40cret%2Fpw@db.example:5433/K3S?connect_timeout=5", CAFile: ca.File, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	if tg.name != "the PostgreSQL datastore k3s on db.example:5433" {
		t.Errorf("name %q", tg.name)
	}
	c := tg.conn
	if c.Database != "k3s" || c.Password != "s@cret/pw" || c.TLSConfig == nil || c.TLSConfig.RootCAs == nil || len(c.TLSConfig.Certificates) != 1 || c.TLSConfig.InsecureSkipVerify || c.TLSConfig.ServerName != "db.example" {
		t.Errorf("config: database %q, TLS %+v", c.Database, c.TLSConfig)
	}
	if c.RuntimeParams["application_name"] != tg.app || !strings.HasPrefix(tg.app, toolApp) || !strings.Contains(tg.kineDSN, "application_name="+tg.app) {
		t.Errorf("application_name %q, kine's DSN tagged: %v", c.RuntimeParams["application_name"], strings.Contains(tg.kineDSN, tg.app))
	}
	for _, s := range []string{"s@cret/pw", "s%40cret%2Fpw"} {
		if !strings.Contains(tg.redact(errorString("x "+s+" y")).Error(), "x xxxxx y") {
			t.Errorf("redact left %q", s)
		}
	}
	tg, err = parsePG(Config{DSN: "postgresql://k3s@localhost"})
	if err != nil || tg.name != "the PostgreSQL datastore kubernetes on localhost" || tg.conn.TLSConfig == nil || !tg.conn.TLSConfig.InsecureSkipVerify {
		t.Errorf("no database, no TLS files: %v, %q (sslmode prefer, as kine)", err, tg.name)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestInUseErrorCapped: a running k3s server's kine keeps a pool of
// sessions on the database; the refusal names the first five and counts
// the rest, on one line; six are all named (no "and 1 more").
func TestInUseErrorCapped(t *testing.T) {
	sessions := func(n int) []Process {
		var ps []Process
		for i := range n {
			ps = append(ps, Process{PID: 100 + i, Session: true, User: "k3s", Client: "10.0.0.5:4000"})
		}
		return ps
	}
	msg := (&InUseError{Datastore: "the MySQL datastore k3s on db", Holders: sessions(21)}).Error()
	if !strings.Contains(msg, `session 104 of user "k3s" from 10.0.0.5:4000, and 16 more: stop every k3s`) || strings.Contains(msg, "session 105") || strings.Contains(msg, "\n") {
		t.Errorf("21 sessions: %s", msg)
	}
	if msg := (&InUseError{Datastore: "the MySQL datastore k3s on db", Holders: sessions(6)}).Error(); !strings.Contains(msg, "session 105") || strings.Contains(msg, "more") {
		t.Errorf("6 sessions: %s", msg)
	}
}
