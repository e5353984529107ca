//lint:file-ignore SA1019 the KMS v1 test plugin has to speak the deprecated v1beta1 API that KMS v1 values were written with.

// Package kmstest runs real KMS plugins for tests, the demo and the benchmark: gRPC
// servers on a unix socket that speak the KMS v2 API (through k8s.io/kms/pkg/service,
// the library real plugins are built on) and the deprecated KMS v1beta1 API, and wrap
// data encryption keys with AES-256-GCM under in-memory key-encryption keys. The KMS v2
// plugin's key ID can be changed at run time (values written under the old ID become
// stale for kube-apiserver) and the plugin can be made unhealthy.
//
// These keys are generated per process and protect nothing; never use this package
// outside tests, demos and benchmarks.
package kmstest

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	kmsv1api "k8s.io/kms/apis/v1beta1"
	kmsv2api "k8s.io/kms/apis/v2"
	"k8s.io/kms/pkg/service"
)

// TB is the part of testing.TB the *T constructors need.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// socketServer owns a gRPC server listening on a unix socket in a private temp dir.
// It can be stopped (as a plugin process killed: every connection closed,
// nothing listening) and started again on the same socket.
type socketServer struct {
	dir      string
	socket   string
	register func(*grpc.Server)

	mu     sync.Mutex
	server *grpc.Server // nil while stopped
	done   chan struct{}
	closed bool
}

func listen(register func(*grpc.Server)) (*socketServer, error) {
	// Short directory under the system temp dir: unix socket paths are limited to
	// ~108 bytes and t.TempDir() paths can exceed that with long test names.
	dir, err := os.MkdirTemp("", "kem-kms-")
	if err != nil {
		return nil, fmt.Errorf("kmstest: temp dir: %w", err)
	}
	s := &socketServer{dir: dir, socket: filepath.Join(dir, "kms.sock"), register: register}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// start serves on the socket (again).
func (s *socketServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("kmstest: plugin closed")
	}
	if s.server != nil {
		return nil
	}
	_ = os.Remove(s.socket) // a stopped plugin's socket file, as a killed process leaves it
	ln, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("kmstest: listen on %s: %w", s.socket, err)
	}
	srv, done := grpc.NewServer(), make(chan struct{})
	s.register(srv)
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	s.server, s.done = srv, done
	return nil
}

// stop stops serving at once (connections closed, calls in flight failed).
func (s *socketServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server == nil {
		return
	}
	s.server.Stop()
	<-s.done
	s.server, s.done = nil, nil
}

func (s *socketServer) close() {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		_ = os.RemoveAll(s.dir)
	}
}

// kek is one key-encryption key: AES-256-GCM, the key ID as additional data.
type kek struct{ aead cipher.AEAD }

func newKEK() (*kek, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &kek{aead: aead}, nil
}

func (k *kek) seal(plain, ad []byte) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plain)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return k.aead.Seal(nonce, nonce, plain, ad), nil
}

func (k *kek) open(ct, ad []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(ct) < n+k.aead.Overhead() {
		return nil, errors.New("ciphertext too short")
	}
	out, err := k.aead.Open(nil, ct[:n], ct[n:], ad)
	if err != nil {
		return nil, errors.New("ciphertext does not authenticate under this key")
	}
	return out, nil
}

// PluginV2 is a KMS v2 plugin: k8s.io/kms/pkg/service's gRPC translation layer in
// front of an in-memory AES-GCM keyring indexed by key ID.
type PluginV2 struct {
	srv *socketServer

	mu      sync.Mutex
	keys    map[string]*kek
	current string
	healthy bool

	encrypts, decrypts atomic.Int64
	// stopAt: the Decrypt call of this number is never answered and the
	// plugin stops (0: none).
	stopAt atomic.Int64
	// decryptDelay: how long each Decrypt waits before it answers.
	decryptDelay atomic.Int64
}

var _ service.Service = (*v2impl)(nil)

type v2impl struct{ p *PluginV2 }

// StartV2 starts a KMS v2 plugin whose current key ID is keyID.
func StartV2(keyID string) (*PluginV2, error) {
	if keyID == "" {
		return nil, errors.New("kmstest: empty key ID")
	}
	p := &PluginV2{keys: map[string]*kek{}, healthy: true}
	if err := p.SetKeyID(keyID); err != nil {
		return nil, err
	}
	// service.NewGRPCService translates the gRPC API to service.Service; we register
	// it on our own server so that we control the listener's lifecycle.
	grpcSvc := service.NewGRPCService("", 10*time.Second, &v2impl{p: p})
	srv, err := listen(func(s *grpc.Server) { kmsv2api.RegisterKeyManagementServiceServer(s, grpcSvc) })
	if err != nil {
		return nil, err
	}
	p.srv = srv
	return p, nil
}

// StartV2T starts a KMS v2 plugin for a test and stops it when the test ends.
func StartV2T(t TB, keyID string) *PluginV2 {
	t.Helper()
	p, err := StartV2(keyID)
	if err != nil {
		t.Fatalf("kms v2 plugin: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the value for an EncryptionConfiguration's kms.endpoint.
func (p *PluginV2) Endpoint() string { return "unix://" + p.srv.socket }

// SocketPath is the unix socket the plugin listens on.
func (p *PluginV2) SocketPath() string { return p.srv.socket }

// SetKeyID makes keyID the current key (creating a new key-encryption key if the ID is
// new). Data encrypted under earlier key IDs still decrypts.
func (p *PluginV2) SetKeyID(keyID string) error {
	if keyID == "" {
		return errors.New("kmstest: empty key ID")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.keys[keyID]; !ok {
		k, err := newKEK()
		if err != nil {
			return fmt.Errorf("kmstest: new key: %w", err)
		}
		p.keys[keyID] = k
	}
	p.current = keyID
	return nil
}

// ForgetKeyID drops a key: data encrypted under it can no longer be decrypted.
func (p *PluginV2) ForgetKeyID(keyID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.keys, keyID)
}

// KeyID is the current key ID.
func (p *PluginV2) KeyID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current
}

// SetHealthy switches the plugin between healthy and failing every call.
func (p *PluginV2) SetHealthy(ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.healthy = ok
}

// EncryptCalls and DecryptCalls count the RPCs served (DEK wraps and unwraps).
func (p *PluginV2) EncryptCalls() int64 { return p.encrypts.Load() }

// DecryptCalls counts Decrypt RPCs served.
func (p *PluginV2) DecryptCalls() int64 { return p.decrypts.Load() }

// Close stops the server and removes its socket. Safe to call more than once.
func (p *PluginV2) Close() { p.srv.close() }

// Stop stops the plugin as a killed plugin process stops: every connection
// closed, calls in flight failed, nothing listening on its socket. Its keys
// are kept: Start serves them again, as a plugin restarted with the same
// key-encryption keys (a real KMS keeps them).
func (p *PluginV2) Stop() { p.srv.stop() }

// StopAtDecrypt makes the plugin stop (Stop) when it receives its nth
// Decrypt call from now, n >= 1, which it never answers: a plugin killed
// in the middle of a run that decrypts data keys, wherever that run is.
func (p *PluginV2) StopAtDecrypt(n int64) {
	p.stopAt.Store(p.decrypts.Load() + n)
}

// SetDecryptDelay makes each Decrypt call wait d before it answers (0: at
// once), as a remote KMS far away does: a run that unwraps data keys is
// still doing so seconds after it started.
func (p *PluginV2) SetDecryptDelay(d time.Duration) { p.decryptDelay.Store(int64(d)) }

// Start serves again on the same socket after Stop (a no-op while serving).
func (p *PluginV2) Start() error { return p.srv.start() }

func (v *v2impl) Status(ctx context.Context) (*service.StatusResponse, error) {
	p := v.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.healthy {
		return &service.StatusResponse{Version: "v2", Healthz: "unhealthy: kmstest plugin switched off", KeyID: p.current}, nil
	}
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: p.current}, nil
}

func (v *v2impl) Encrypt(ctx context.Context, uid string, data []byte) (*service.EncryptResponse, error) {
	p := v.p
	p.encrypts.Add(1)
	p.mu.Lock()
	healthy, id, k := p.healthy, p.current, p.keys[p.current]
	p.mu.Unlock()
	if !healthy {
		return nil, errors.New("kmstest plugin is unhealthy")
	}
	ct, err := k.seal(data, []byte(id))
	if err != nil {
		return nil, err
	}
	return &service.EncryptResponse{Ciphertext: ct, KeyID: id}, nil
}

func (v *v2impl) Decrypt(ctx context.Context, uid string, req *service.DecryptRequest) ([]byte, error) {
	p := v.p
	if n := p.decrypts.Add(1); n == p.stopAt.Load() && p.stopAt.CompareAndSwap(n, 0) {
		// Killed while this call was in flight: it is never answered.
		go p.Stop()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if d := time.Duration(p.decryptDelay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p.mu.Lock()
	healthy, k := p.healthy, p.keys[req.KeyID]
	p.mu.Unlock()
	if !healthy {
		return nil, errors.New("kmstest plugin is unhealthy")
	}
	if k == nil {
		return nil, errors.New("kmstest plugin: unknown key ID")
	}
	return k.open(req.Ciphertext, []byte(req.KeyID))
}

// PluginV1 is a deprecated KMS v1beta1 plugin (kube-apiserver needs the KMSv1 feature
// gate to use it) with a single AES-GCM key-encryption key.
type PluginV1 struct {
	kmsv1api.UnimplementedKeyManagementServiceServer

	srv     *socketServer
	key     *kek
	healthy atomic.Bool

	encrypts, decrypts atomic.Int64
}

// StartV1 starts a KMS v1beta1 plugin.
func StartV1() (*PluginV1, error) {
	k, err := newKEK()
	if err != nil {
		return nil, fmt.Errorf("kmstest: new key: %w", err)
	}
	p := &PluginV1{key: k}
	p.healthy.Store(true)
	srv, err := listen(func(s *grpc.Server) { kmsv1api.RegisterKeyManagementServiceServer(s, p) })
	if err != nil {
		return nil, err
	}
	p.srv = srv
	return p, nil
}

// StartV1T starts a KMS v1 plugin for a test and stops it when the test ends.
func StartV1T(t TB) *PluginV1 {
	t.Helper()
	p, err := StartV1()
	if err != nil {
		t.Fatalf("kms v1 plugin: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the value for an EncryptionConfiguration's kms.endpoint.
func (p *PluginV1) Endpoint() string { return "unix://" + p.srv.socket }

// SocketPath is the unix socket the plugin listens on.
func (p *PluginV1) SocketPath() string { return p.srv.socket }

// SetHealthy switches the plugin between healthy and failing Encrypt/Decrypt.
func (p *PluginV1) SetHealthy(ok bool) { p.healthy.Store(ok) }

// EncryptCalls counts Encrypt RPCs served.
func (p *PluginV1) EncryptCalls() int64 { return p.encrypts.Load() }

// DecryptCalls counts Decrypt RPCs served.
func (p *PluginV1) DecryptCalls() int64 { return p.decrypts.Load() }

// Close stops the server and removes its socket. Safe to call more than once.
func (p *PluginV1) Close() { p.srv.close() }

var v1AD = []byte("kmstest-v1")

// Version implements the v1beta1 API.
func (p *PluginV1) Version(ctx context.Context, req *kmsv1api.VersionRequest) (*kmsv1api.VersionResponse, error) {
	return &kmsv1api.VersionResponse{Version: "v1beta1", RuntimeName: "kmstest", RuntimeVersion: "0.1.0"}, nil
}

// Encrypt implements the v1beta1 API.
func (p *PluginV1) Encrypt(ctx context.Context, req *kmsv1api.EncryptRequest) (*kmsv1api.EncryptResponse, error) {
	p.encrypts.Add(1)
	if !p.healthy.Load() {
		return nil, errors.New("kmstest plugin is unhealthy")
	}
	ct, err := p.key.seal(req.Plain, v1AD)
	if err != nil {
		return nil, err
	}
	return &kmsv1api.EncryptResponse{Cipher: ct}, nil
}

// Decrypt implements the v1beta1 API.
func (p *PluginV1) Decrypt(ctx context.Context, req *kmsv1api.DecryptRequest) (*kmsv1api.DecryptResponse, error) {
	p.decrypts.Add(1)
	if !p.healthy.Load() {
		return nil, errors.New("kmstest plugin is unhealthy")
	}
	plain, err := p.key.open(req.Cipher, v1AD)
	if err != nil {
		return nil, err
	}
	return &kmsv1api.DecryptResponse{Plain: plain}, nil
}
