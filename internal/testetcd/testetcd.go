// Package testetcd starts a real etcd server (go.etcd.io/etcd/server/v3/embed) on
// loopback in a temporary directory, for tests, the demo and the benchmark.
package testetcd

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
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
}

// TLSFiles are PEM files for a TLS client listener.
type TLSFiles struct {
	CertFile, KeyFile, TrustedCAFile string
}

// Server is a running embedded etcd.
type Server struct {
	Etcd      *embed.Etcd
	Endpoint  string // host:port of the client listener
	URL       string // scheme://host:port
	dir       string
	removeDir bool
	opts      Options
	clientURL url.URL
	peerURL   url.URL
	mu        sync.Mutex
}

// Start starts an etcd member listening on 127.0.0.1 and waits until it serves.
func Start(opts Options) (*Server, error) {
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
	cu, _ := url.Parse(fmt.Sprintf("%s://127.0.0.1:%d", scheme, clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	s := &Server{
		Endpoint:  cu.Host,
		URL:       cu.String(),
		dir:       dir,
		removeDir: remove,
		opts:      opts,
		clientURL: *cu,
		peerURL:   *pu,
	}
	if err := s.start(); err != nil {
		if remove {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	opts := s.opts
	cfg := embed.NewConfig()
	cfg.Name = "testetcd"
	cfg.Dir = filepath.Join(s.dir, "data")
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
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
		return fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("embedded etcd did not become ready within 60s")
	}
	s.mu.Lock()
	s.Etcd = e
	s.mu.Unlock()
	return nil
}

// Stop stops the member but keeps its data, so that Restart can bring it back
// on the same address (clients see the outage a real restart causes).
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.Etcd
	s.Etcd = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped member again on the same address and data.
func (s *Server) Restart() error {
	s.mu.Lock()
	running := s.Etcd != nil
	s.mu.Unlock()
	if running {
		return fmt.Errorf("embedded etcd is running")
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
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}
