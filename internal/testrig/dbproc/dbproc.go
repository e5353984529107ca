// Package dbproc runs a database server's process for a test, what testpg
// (PostgreSQL) and testmysql (MariaDB) share: the user it runs as when the
// test runs as root, its private temporary directory, its TLS files, its
// process (stopped when the test ends) and the wait until it accepts
// connections.
package dbproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"kube-etcd-migrate/internal/loopback"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// RunAs is who runs the server: the user named when the test runs as root
// (the server refuses root), else the test's own user (nil). server and
// pkg name the server's binary and Debian's package in the failure when
// there is no such user.
func RunAs(t testing.TB, name, server, pkg string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("the tests run as root, and %s refuses root: they run it as the %s user, which does not exist (%v): install Debian's %s package", server, name, err, pkg)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

// Dir makes a private temporary directory (its name beginning with
// prefix, removed when the test ends) and the subdirectories named in it
// (0700), all of them cred's when it is set. Not t.TempDir: its parents
// are the test process's, 0700, which the server's user cannot traverse.
func Dir(t testing.TB, prefix string, cred *syscall.Credential, subdirs ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	owned := []string{dir}
	for _, d := range subdirs {
		d = filepath.Join(dir, d)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		owned = append(owned, d)
	}
	Chown(t, cred, owned...)
	return dir
}

// Chown makes the files cred's, when it is set.
func Chown(t testing.TB, cred *syscall.Credential, files ...string) {
	t.Helper()
	if cred == nil {
		return
	}
	for _, f := range files {
		if err := os.Chown(f, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// TLSFiles writes the server's TLS files into dir, cred's when it is set:
// a certificate and key issued by ca for 127.0.0.1, and ca's certificate.
func TLSFiles(t testing.TB, ca *testpki.CA, dir string, cred *syscall.Credential) (cert, key, caFile string) {
	t.Helper()
	cert, key = ca.Issue(t, dir, "server", true)
	caFile = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	Chown(t, cred, cert, key, caFile)
	return cert, key, caFile
}

// Start starts the server's process cmd as cred (nil: the test's user),
// killed with the test process and in a process group of its own; when
// the test ends it is sent stop, and killed when it has not exited 20 s
// later. name names it in a failure. The channel is closed once it has
// exited.
func Start(t testing.TB, cmd *exec.Cmd, cred *syscall.Credential, stop syscall.Signal, name string) <-chan struct{} {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(stop)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	return exited
}

// WaitReady tries connect every 50 ms until it succeeds; the test fails
// when the server's process cmd (started by Start, exited its channel)
// exits first or ctx ends, with the server's log. name names it.
func WaitReady(t testing.TB, ctx context.Context, cmd *exec.Cmd, exited <-chan struct{}, name string, log func() string, connect func() error) {
	t.Helper()
	for {
		err := connect()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("%s exited: %v\n%s", name, cmd.ProcessState, log())
		case <-ctx.Done():
			t.Fatalf("%s does not accept connections: %v\n%s", name, err, log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FreePort is loopback.FreePort for a test: a port of 127.0.0.1 free a
// moment ago; another process may take it before the server binds it,
// which fails the test, rarely.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Random is 16 random hex digits (a password's).
func Random(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
