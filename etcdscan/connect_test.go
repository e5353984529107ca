package etcdscan

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// TestEndpointSchemes: scheme-less endpoints get http:// without TLS and
// https:// with --cacert or --cert; an explicit scheme is kept.
func TestEndpointSchemes(t *testing.T) {
	if got := (Config{Endpoints: []string{DefaultEndpoint}}).endpoints(); len(got) != 1 || got[0] != "http://127.0.0.1:2379" {
		t.Fatalf("scheme-less endpoint without TLS: %v", got)
	}
	eps := (Config{Endpoints: []string{"10.0.0.1:2379", "https://10.0.0.2:2379"}, CACert: "ca.pem"}).endpoints()
	if len(eps) != 2 || eps[0] != "https://10.0.0.1:2379" || eps[1] != "https://10.0.0.2:2379" {
		t.Fatalf("endpoints with --cacert: %v", eps)
	}
	eps = (Config{Endpoints: []string{"10.0.0.1:2379"}, Cert: "c.pem", Key: "k.pem"}).endpoints()
	if len(eps) != 1 || eps[0] != "https://10.0.0.1:2379" {
		t.Fatalf("endpoints with --cert: %v", eps)
	}
}

// assertFix checks that err says which settings would mend it (the command
// layer names their flags).
func assertFix(t *testing.T, err error, want ...Setting) {
	t.Helper()
	var ce *ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v: not a *ConnectError naming what would mend it", err)
	}
	if !slices.Equal(ce.Fix, want) {
		t.Errorf("error %v: mended by %v, want %v", err, ce.Fix, want)
	}
}

func assertOneLine(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got success", wants)
	}
	msg := err.Error()
	t.Logf("error: %s", msg)
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans several lines: %q", msg)
	}
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not contain %q", msg, w)
		}
	}
}

func TestConnectTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	otherCA := testpki.NewCA(t, dir, "other-ca")
	srvCert, srvKey := ca.Issue(t, dir, "server", true)
	cliCert, cliKey := ca.Issue(t, dir, "client", false)
	foreignCert, foreignKey := otherCA.Issue(t, dir, "foreign-client", false)
	s := testetcd.StartT(t, testetcd.Options{TLS: &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}})
	ctx := context.Background()
	base := Config{Endpoints: []string{s.Endpoint}, DialTimeout: 3 * time.Second, CommandTimeout: 5 * time.Second}

	good := base
	good.CACert, good.Cert, good.Key = ca.File, cliCert, cliKey
	c, err := Connect(ctx, good)
	if err != nil {
		t.Fatalf("connect with the right CA and client certificate: %v", err)
	}
	if _, err := c.Put(ctx, "/registry/tls-ok", "1"); err != nil {
		t.Fatal(err)
	}
	c.Close()

	good.DialTimeout = time.Second // the failures below wait for it
	wrongCA := good
	wrongCA.CACert = otherCA.File
	_, err = Connect(ctx, wrongCA)
	assertOneLine(t, err, "TLS", s.Endpoint, "not signed by the CA certificate "+otherCA.File)
	assertFix(t, err, SettingCACert)

	noClientCert := base
	noClientCert.DialTimeout = time.Second
	noClientCert.CACert = ca.File
	_, err = Connect(ctx, noClientCert)
	assertOneLine(t, err, "TLS", s.Endpoint, "requires a client certificate")
	assertFix(t, err, SettingCert, SettingKey)

	foreign := good
	foreign.Cert, foreign.Key = foreignCert, foreignKey
	_, err = Connect(ctx, foreign)
	assertOneLine(t, err, "TLS", s.Endpoint, "rejected the client certificate")

	plain := base
	plain.DialTimeout = time.Second
	plain.Endpoints = []string{"http://" + s.Endpoint}
	_, err = Connect(ctx, plain)
	assertOneLine(t, err, s.Endpoint, "serves TLS")
}

func TestConnectUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there any more
	_, err = Connect(context.Background(), Config{Endpoints: []string{addr}, DialTimeout: time.Second, CommandTimeout: time.Second})
	assertOneLine(t, err, "unreachable", "http://"+addr)
}

func TestConnectAuth(t *testing.T) {
	s := testetcd.StartT(t, testetcd.Options{})
	admin, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	if _, err := admin.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	base := Config{Endpoints: []string{s.Endpoint}, DialTimeout: 3 * time.Second, CommandTimeout: 5 * time.Second}

	_, err = Connect(ctx, base)
	assertOneLine(t, err, "authentication", "requires a user")
	assertFix(t, err, SettingUser, SettingPassword)

	wrong := base
	wrong.Username, wrong.Password = "root", "wrong"
	_, err = Connect(ctx, wrong)
	assertOneLine(t, err, "authentication failed")
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("error shows the password: %v", err)
	}

	right := base
	right.Username, right.Password = "root", "s3cret"
	c, err := Connect(ctx, right)
	if err != nil {
		t.Fatalf("connect with the right password: %v", err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, "/registry/auth-ok", "1", clientv3.WithPrevKV()); err != nil {
		t.Fatal(err)
	}
}

func TestConnectOneOfSeveralUnreachable(t *testing.T) {
	s := testetcd.StartT(t, testetcd.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	cfg := Config{Endpoints: []string{s.Endpoint, dead}, DialTimeout: time.Second, CommandTimeout: time.Second}
	_, err = Connect(context.Background(), cfg)
	assertOneLine(t, err, "unreachable", "http://"+dead)
	// With a user, the client authenticates while connecting: same diagnosis.
	cfg.Endpoints, cfg.Username, cfg.Password = []string{dead}, "root", "pw"
	_, err = Connect(context.Background(), cfg)
	assertOneLine(t, err, "unreachable", "http://"+dead)
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("error shows the password: %v", err)
	}
}
