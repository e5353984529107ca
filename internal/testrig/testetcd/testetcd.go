// Package testetcd starts a real etcd server on loopback in a temporary
// directory, for tests, the demo and the benchmark: the release this module
// links, embedded (go.etcd.io/etcd/server/v3/embed), or an older release's
// etcd binary built from its own module (internal/build/modbuild) and run as a
// process (Options.Version); and a cluster of embedded members (StartCluster).
package testetcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/loopback"
)

// Options tune the embedded server. The zero value is a plain-HTTP single member.
type Options struct {
	// Dir holds the data; empty means a new temporary directory removed on Close.
	Dir string
	// QuotaBackendBytes is etcd's --quota-backend-bytes (0: etcd's default, 2 GiB).
	QuotaBackendBytes int64
	// MaxTxnOps is etcd's --max-txn-ops (0: etcd's default, 128).
	MaxTxnOps uint
	// MaxRequestBytes is etcd's --max-request-bytes (0: etcd's default, 1.5 MiB).
	MaxRequestBytes uint
	// TLS, when set, serves clients over TLS and requires client certificates
	// signed by TLS.TrustedCAFile.
	TLS *TLSFiles
	// ClientHTTP gives the embedded member a client HTTP listener of its own
	// (etcd's --listen-client-http-urls, as k3s and RKE2 configure theirs):
	// /health and the other HTTP endpoints are served there (Server.HTTPURL),
	// the client URL serves gRPC only.
	ClientHTTP bool
	// IPv6 listens on [::1] instead of 127.0.0.1 (an embedded member).
	IPv6 bool
	// Version is the etcd server release: "" (or Linked) for the one this
	// module links, embedded in the process; another, e.g.
	// modbuild.PreviousEtcd ("v3.6.16"), is that release's etcd binary, built
	// once per machine by modbuild and run as a child process.
	Version string
	// RestoreFrom, when set, is an etcd snapshot file restored into the new
	// data directory before the first start, with the etcdutl of Version,
	// as an operator restores a backup into a cluster of that release.
	RestoreFrom string
}

// TLSFiles are PEM files for a TLS client listener.
type TLSFiles struct {
	CertFile, KeyFile, TrustedCAFile string
}

// Server is a running etcd member: embedded, or a child process.
type Server struct {
	// Etcd is the embedded server (nil for a process, or while stopped).
	Etcd     *embed.Etcd
	Endpoint string // host:port of the client listener
	URL      string // scheme://host:port
	// HTTPURL is the client HTTP listener's scheme://host:port
	// (Options.ClientHTTP), "" when HTTP is served on URL.
	HTTPURL string
	// Version is the server's release, as etcd reports it ("3.7.3").
	Version   string
	dir       string
	removeDir bool
	opts      Options
	clientURL url.URL
	peerURL   url.URL
	httpURL   *url.URL
	// name and initialCluster: the member's name and --initial-cluster.
	name           string
	initialCluster string
	proc           *process
	mu             sync.Mutex
}

// Start starts an etcd member listening on 127.0.0.1 and waits until it serves.
// Its ports are the kernel's picks, taken before etcd binds them: when another
// test's server took one in between, a member in a directory of its own is
// started again on new ports (a few times at most).
func Start(opts Options) (*Server, error) {
	for attempt := 0; ; attempt++ {
		s, err := startOnce(opts)
		if err == nil || opts.Dir != "" || attempt == 2 || !errors.Is(err, syscall.EADDRINUSE) {
			return s, err
		}
	}
}

func startOnce(opts Options) (*Server, error) {
	dir := opts.Dir
	remove := false
	if dir == "" {
		d, err := os.MkdirTemp("", "testetcd-")
		if err != nil {
			return nil, err
		}
		dir, remove = d, true
	}
	clientPort, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if opts.TLS != nil {
		scheme = "https"
	}
	host := "127.0.0.1"
	if opts.IPv6 {
		host = "[::1]"
	}
	cu, _ := url.Parse(fmt.Sprintf("%s://%s:%d", scheme, host, clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://%s:%d", host, peerPort))
	var hu *url.URL
	if opts.ClientHTTP {
		httpPort, err := loopback.FreePort()
		if err != nil {
			return nil, err
		}
		hu, _ = url.Parse(fmt.Sprintf("%s://%s:%d", scheme, host, httpPort))
	}
	s := &Server{
		Endpoint:  cu.Host,
		URL:       cu.String(),
		dir:       dir,
		removeDir: remove,
		opts:      opts,
		clientURL: *cu,
		peerURL:   *pu,
		httpURL:   hu,
		name:      "testetcd",
	}
	if hu != nil {
		s.HTTPURL = hu.String()
	}
	s.initialCluster = s.name + "=" + pu.String()
	if err := s.start(); err != nil {
		if remove {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	if s.opts.RestoreFrom != "" {
		if _, err := os.Stat(filepath.Join(s.dir, "data")); os.IsNotExist(err) {
			if err := s.restore(); err != nil {
				return err
			}
		}
	}
	if !IsLinked(s.opts.Version) {
		return s.startProcess()
	}
	e, err := s.startEmbedded()
	if err != nil {
		return err
	}
	return s.waitReady(e)
}

// startEmbedded starts the member; it is ready when ReadyNotify says so (a
// member of a cluster only once a quorum is up).
func (s *Server) startEmbedded() (*embed.Etcd, error) {
	opts := s.opts
	cfg := embed.NewConfig()
	cfg.Name = s.name
	cfg.Dir = filepath.Join(s.dir, "data")
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	if s.httpURL != nil {
		cfg.ListenClientHttpUrls = []url.URL{*s.httpURL}
	}
	cfg.InitialCluster = s.initialCluster
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if opts.QuotaBackendBytes > 0 {
		cfg.QuotaBackendBytes = opts.QuotaBackendBytes
	}
	if opts.MaxTxnOps > 0 {
		cfg.MaxTxnOps = opts.MaxTxnOps
	}
	if opts.MaxRequestBytes > 0 {
		cfg.MaxRequestBytes = opts.MaxRequestBytes
	}
	if opts.TLS != nil {
		cfg.ClientTLSInfo.CertFile = opts.TLS.CertFile
		cfg.ClientTLSInfo.KeyFile = opts.TLS.KeyFile
		cfg.ClientTLSInfo.TrustedCAFile = opts.TLS.TrustedCAFile
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	return e, nil
}

func (s *Server) waitReady(e *embed.Etcd) error {
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("embedded etcd %s did not become ready within 60s", s.name)
	}
	s.mu.Lock()
	s.Etcd = e
	s.Version = LinkedVersion
	s.mu.Unlock()
	return nil
}

// Stop stops the member but keeps its data, so that Restart can bring it back
// on the same address (clients see the outage a real restart causes).
func (s *Server) Stop() {
	s.mu.Lock()
	e, p := s.Etcd, s.proc
	s.Etcd, s.proc = nil, nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
	if p != nil {
		p.stop()
	}
}

// Name is the member's name (etcd --name).
func (s *Server) Name() string { return s.name }

// Kill stops the member as a crash does: an embedded member's raft stops at
// once, without handing its leadership to a peer (as Stop does), then its
// listeners close; a process gets SIGKILL. Restart brings it back.
func (s *Server) Kill() {
	s.mu.Lock()
	e, p := s.Etcd, s.proc
	s.Etcd, s.proc = nil, nil
	s.mu.Unlock()
	if e != nil {
		e.Server.HardStop()
		e.Close()
	}
	if p != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Restart starts a stopped member again on the same address and data.
func (s *Server) Restart() error {
	s.mu.Lock()
	running := s.Etcd != nil || s.proc != nil
	s.mu.Unlock()
	if running {
		return fmt.Errorf("etcd %s is running", s.name)
	}
	return s.start()
}

// Client returns a plain (non-TLS) client for the server.
func (s *Server) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{s.URL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// Revision returns the current revision of the store.
func (s *Server) Revision(ctx context.Context) (int64, error) {
	cli, err := s.Client()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "health-probe-nonexistent")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// Close stops the server and removes its temporary directory.
func (s *Server) Close() {
	s.Stop()
	if s.removeDir {
		os.RemoveAll(s.dir)
	}
}

// TB is the part of testing.TB that StartT needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// ClientT is Client for a test: it fails the test on error and closes the
// client when the test ends.
func (s *Server) ClientT(t TB) *clientv3.Client {
	t.Helper()
	cli, err := s.Client()
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// StartT starts a server for a test and stops it when the test ends.
func StartT(t TB, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}
