package testetcd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/build/modbuild"
)

// Linked is Options.Version for the etcd server release this module links
// (go.mod's go.etcd.io/etcd/server/v3), run embedded.
const Linked = ""

// LinkedVersion is that release, as etcd reports it ("3.7.3").
var LinkedVersion = version.Version

// Versions are the etcd server releases the tests of etcd-version-dependent
// behaviour run against: the linked one, embedded, and the two minors before
// it (modbuild.PreviousEtcd, modbuild.OldestEtcd), each its own binary.
func Versions() []string { return []string{Linked, modbuild.PreviousEtcd, modbuild.OldestEtcd} }

// IsLinked reports whether v names the linked release.
func IsLinked(v string) bool {
	return v == Linked || strings.TrimPrefix(v, "v") == LinkedVersion
}

// Name is v as a subtest name: "etcd-3.7.3", "etcd-3.6.16".
func Name(v string) string {
	if IsLinked(v) {
		return "etcd-" + LinkedVersion
	}
	return "etcd-" + strings.TrimPrefix(v, "v")
}

// Runner is what Each needs of a test (*testing.T).
type Runner[T any] interface {
	Run(name string, f func(T)) bool
}

// Each runs f as one subtest per release of Versions, named by Name.
func Each[T Runner[T]](t T, f func(t T, version string)) {
	for _, v := range Versions() {
		t.Run(Name(v), func(t T) { f(t, v) })
	}
}

// restore restores s.opts.RestoreFrom into the member's data directory
// with the etcdutl of its release: etcdutl's own snapshot package for the
// linked one, that release's etcdutl binary (modbuild) otherwise.
func (s *Server) restore() error {
	dataDir := filepath.Join(s.dir, "data")
	if IsLinked(s.opts.Version) {
		err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath:   s.opts.RestoreFrom,
			Name:           s.name,
			OutputDataDir:  dataDir,
			PeerURLs:       []string{s.peerURL.String()},
			InitialCluster: s.initialCluster,
		})
		if err != nil {
			return fmt.Errorf("etcdutl %s snapshot restore %s: %w", LinkedVersion, s.opts.RestoreFrom, err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := modbuild.Build(ctx, modbuild.Etcdutl("v"+strings.TrimPrefix(s.opts.Version, "v")))
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, bin, "snapshot", "restore", s.opts.RestoreFrom, "--name", s.name, "--data-dir", dataDir,
		"--initial-cluster", s.initialCluster, "--initial-advertise-peer-urls", s.peerURL.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdutl %s snapshot restore %s: %v: %s", s.opts.Version, s.opts.RestoreFrom, err, out)
	}
	return nil
}

// process is an etcd binary running as a child of the test process.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done
}

// startProcess starts the member as a child process running the release
// s.opts.Version, built by modbuild, and waits until it serves clients.
func (s *Server) startProcess() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := modbuild.Build(ctx, modbuild.Etcd("v"+strings.TrimPrefix(s.opts.Version, "v")))
	if err != nil {
		return err
	}
	opts := s.opts
	args := []string{
		"--name", s.name,
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.clientURL.String(),
		"--advertise-client-urls", s.clientURL.String(),
		"--listen-peer-urls", s.peerURL.String(),
		"--initial-advertise-peer-urls", s.peerURL.String(),
		"--initial-cluster", s.initialCluster,
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "info",
	}
	if s.httpURL != nil {
		args = append(args, "--listen-client-http-urls", s.httpURL.String())
	}
	if opts.QuotaBackendBytes > 0 {
		args = append(args, "--quota-backend-bytes", strconv.FormatInt(opts.QuotaBackendBytes, 10))
	}
	if opts.MaxTxnOps > 0 {
		args = append(args, "--max-txn-ops", strconv.FormatUint(uint64(opts.MaxTxnOps), 10))
	}
	if opts.MaxRequestBytes > 0 {
		args = append(args, "--max-request-bytes", strconv.FormatUint(uint64(opts.MaxRequestBytes), 10))
	}
	if opts.TLS != nil {
		args = append(args, "--cert-file", opts.TLS.CertFile, "--key-file", opts.TLS.KeyFile,
			"--trusted-ca-file", opts.TLS.TrustedCAFile, "--client-cert-auth")
	}
	logPath := filepath.Join(s.dir, "etcd.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	// The server dies with the test process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	// The log goes to etcd.log; the line etcd writes when it starts serving
	// clients (after its ready notification) says it is up.
	serving := make(chan struct{})
	go func() {
		defer logFile.Close()
		r := bufio.NewReader(stderr)
		seen := false
		for {
			line, err := r.ReadString('\n')
			_, _ = logFile.WriteString(line)
			if !seen && strings.Contains(line, "serving client traffic") {
				seen = true
				close(serving)
			}
			if err != nil {
				_, _ = io.Copy(logFile, r)
				break
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-serving:
	case <-p.done:
		tail := logTail(logPath)
		if strings.Contains(tail, "address already in use") {
			// A port picked free was taken before etcd bound it: Start
			// tries again on new ports, as for an embedded member.
			return fmt.Errorf("etcd %s (%s) exited before serving: %v; its log: %s: %w", s.opts.Version, bin, p.err, tail, syscall.EADDRINUSE)
		}
		return fmt.Errorf("etcd %s (%s) exited before serving: %v; its log: %s", s.opts.Version, bin, p.err, tail)
	case <-time.After(60 * time.Second):
		p.stop()
		return fmt.Errorf("etcd %s (%s) did not serve clients within 60s; its log: %s", s.opts.Version, bin, logTail(logPath))
	}
	s.mu.Lock()
	s.proc = p
	s.Version = strings.TrimPrefix(s.opts.Version, "v")
	s.mu.Unlock()
	return nil
}

// stop ends the process as a service manager would: SIGTERM, then SIGKILL
// if it is still there after 30 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// logTail is what the log says went wrong: its fatal, panic and error lines
// (zap's JSON), else its end.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	var bad []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, lvl := range []string{`"level":"fatal"`, `"level":"panic"`, `"level":"error"`} {
			if strings.Contains(l, lvl) {
				bad = append(bad, l)
			}
		}
	}
	if len(bad) > 0 {
		return strings.Join(bad, "\n")
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
