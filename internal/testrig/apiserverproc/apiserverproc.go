// Package apiserverproc runs a kube-apiserver binary (another release's, built
// by internal/build/modbuild) as a process on an existing etcd, for the tests that
// need what that release itself writes and accepts back: nothing of the code
// this module links runs inside it.
//
// The server listens on a loopback port picked by the kernel, serves a
// self-signed certificate from its own --cert-dir, authenticates a static
// token of a system:masters user, authorizes with Node,RBAC as a kubeadm
// control plane does and advertises 192.0.2.1 (TEST-NET-1: kube-apiserver
// refuses a loopback advertise address). As kube-apiserver's own test server,
// it runs no endpoint reconciler: the lease reconciler empties the kubernetes
// Service's Endpoints when the server stops and fills them again when it
// starts, so nothing of them would survive a restart for the tests to
// compare. The ServiceAccount admission plugin is off, since no
// kube-controller-manager creates the default ServiceAccounts.
// Its stderr goes to a file in the test's temporary directory, whose tail is
// logged when the test fails.
package apiserverproc

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kube-etcd-migrate/internal/loopback"
)

// Options configure one kube-apiserver process.
type Options struct {
	// Binary is the kube-apiserver executable (modbuild.Build). Required.
	Binary string
	// EtcdURL is --etcd-servers, e.g. testetcd.Server.URL. Required.
	EtcdURL string
	// Prefix is --etcd-prefix; default "/registry".
	Prefix string
	// RuntimeConfig is --runtime-config, e.g. "api/beta=true".
	RuntimeConfig string
	// FeatureGates is --feature-gates.
	FeatureGates string
	// EmulatedVersion is --emulated-version.
	EmulatedVersion string
	// EncryptionConfigPath is --encryption-provider-config.
	EncryptionConfigPath string
	// Port is --secure-port; 0 picks a free one. A restart of the same
	// control plane keeps its port (the kubernetes Service's Endpoints hold
	// it): pass the previous Server's Port.
	Port int
	// ExtraFlags are appended last and so win over everything above.
	ExtraFlags []string
}

// Server is a running kube-apiserver process.
type Server struct {
	// ClientConfig authenticates as a system:masters user (static token).
	ClientConfig *rest.Config
	// Flags are the command-line flags the process was started with.
	Flags []string
	// LogFile holds the process's stderr (and stdout).
	LogFile string
	// Port is the loopback port it serves on.
	Port int

	t        testing.TB
	cmd      *exec.Cmd
	exited   chan struct{}
	exitErr  error
	stopOnce sync.Once
}

const (
	token         = "apiserverproc-admin-token"
	advertiseAddr = "192.0.2.1"
	readyTimeout  = 3 * time.Minute
	stopTimeout   = time.Minute
)

// Start starts kube-apiserver and waits until /readyz is ok (every post-start
// hook done: RBAC and API Priority and Fairness bootstrap objects, the
// kubernetes Service, ...). It fails the test on error. The process is
// stopped by Stop or, at the latest, when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Binary == "" || opts.EtcdURL == "" {
		t.Fatalf("apiserverproc: Options.Binary and Options.EtcdURL are required")
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := writeECKey(saKey); err != nil {
		t.Fatal(err)
	}
	// The port is free when picked; another process may take it before
	// kube-apiserver binds it, which a new attempt on another port survives.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port := opts.Port
		if port == 0 {
			var err error
			if port, err = loopback.FreePort(); err != nil {
				t.Fatal(err)
			}
		}
		s, err := start(t, opts, dir, tokenFile, saKey, port, attempt)
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) || opts.Port != 0 {
			break
		}
	}
	t.Fatalf("apiserverproc: %v", lastErr)
	return nil
}

var errPortTaken = errors.New("port taken")

// Flags returns the command line Start runs the binary with.
func Flags(opts Options, dir, tokenFile, saKey string, port int) []string {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "/registry"
	}
	flags := []string{
		"--etcd-servers=" + opts.EtcdURL,
		"--etcd-prefix=" + prefix,
		// Tests read old revisions; kube-apiserver compacts every 5 min by default.
		"--etcd-compaction-interval=0",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--advertise-address=" + advertiseAddr,
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--disable-admission-plugins=ServiceAccount",
	}
	if opts.RuntimeConfig != "" {
		flags = append(flags, "--runtime-config="+opts.RuntimeConfig)
	}
	if opts.FeatureGates != "" {
		flags = append(flags, "--feature-gates="+opts.FeatureGates)
	}
	if opts.EmulatedVersion != "" {
		flags = append(flags, "--emulated-version="+opts.EmulatedVersion)
	}
	if opts.EncryptionConfigPath != "" {
		flags = append(flags, "--encryption-provider-config="+opts.EncryptionConfigPath)
	}
	return append(flags, opts.ExtraFlags...)
}

func start(t testing.TB, opts Options, dir, tokenFile, saKey string, port, attempt int) (*Server, error) {
	flags := Flags(opts, dir, tokenFile, saKey, port)
	logFile := filepath.Join(dir, fmt.Sprintf("kube-apiserver-%d.log", attempt))
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(opts.Binary, flags...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: an interrupted test run does not leave it
	// behind in the terminal's group, and Stop signals only it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", opts.Binary, err)
	}
	s := &Server{
		ClientConfig: &rest.Config{
			Host:        "https://127.0.0.1:" + strconv.Itoa(port),
			BearerToken: token,
			// The server's certificate is self-signed, generated at start
			// for this loopback address; nothing else listens there.
			TLSClientConfig: rest.TLSClientConfig{Insecure: true},
			QPS:             -1,
		},
		Flags:   flags,
		LogFile: logFile,
		Port:    port,
		t:       t,
		cmd:     cmd,
		exited:  make(chan struct{}),
	}
	go func() {
		s.exitErr = cmd.Wait()
		log.Close()
		close(s.exited)
	}()
	begin := time.Now()
	if err := s.waitReady(); err != nil {
		s.kill()
		tail := logTail(logFile, 4000)
		if strings.Contains(tail, "address already in use") {
			return nil, fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return nil, fmt.Errorf("kube-apiserver %s (flags %q): %v\n%s", opts.Binary, flags, err, tail)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("apiserverproc: end of %s:\n%s", logFile, logTail(logFile, 8000))
		}
	})
	t.Logf("apiserverproc: %s ready in %s with flags %q", filepath.Base(opts.Binary), time.Since(begin).Round(time.Millisecond), flags)
	return s, nil
}

// waitReady polls /readyz until it answers 200, the process exits or
// readyTimeout passes.
func (s *Server) waitReady() error {
	cs, err := kubernetes.NewForConfig(s.ClientConfig)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("exited before ready: %v", s.exitErr)
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var code int
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&code).Raw()
		cancel()
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %v %s", code, err, bytes.TrimSpace(body))
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: last /readyz %s", readyTimeout, last)
		}
	}
}

// Stop stops the process (SIGTERM, then SIGKILL after a minute) and waits for
// it to exit. Safe to call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		select {
		case <-s.exited:
			return
		default:
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			s.t.Errorf("apiserverproc: kube-apiserver did not stop within %s of SIGTERM; killed", stopTimeout)
			s.kill()
		}
	})
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func logTail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// writeECKey writes a new P-256 private key, the service account signing key.
func writeECKey(file string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}
