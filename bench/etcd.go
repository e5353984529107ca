package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// runEtcdChild is the -etcd-child mode: an embedded etcd in its own process, so
// that its resident memory can be measured apart from the tool and the benchmark.
// It prints "READY <url>" and serves until its stdin is closed. A line
// "cpuprofile PATH" on its stdin starts a CPU profile of the etcd server into
// PATH, "stopprofile" ends it; each is answered by a line "OK" or "ERR ...".
func runEtcdChild(dir string, quota int64) error {
	srv, err := testetcd.Start(testetcd.Options{Dir: dir, QuotaBackendBytes: quota})
	if err != nil {
		return err
	}
	fmt.Printf("READY %s\n", srv.URL)
	var prof *os.File
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch {
		case cmd == "cpuprofile" && prof == nil:
			f, err := os.Create(arg)
			if err == nil {
				if err = pprof.StartCPUProfile(f); err != nil {
					f.Close()
				} else {
					prof = f
				}
			}
			answer(err)
		case cmd == "stopprofile" && prof != nil:
			pprof.StopCPUProfile()
			answer(prof.Close())
			prof = nil
		default:
			answer(fmt.Errorf("%q: not a command now", in.Text()))
		}
	}
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	srv.Close()
	return nil
}

func answer(err error) {
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		return
	}
	fmt.Println("OK")
}

type etcdProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	URL    string
	cli    *clientv3.Client
}

// Profile starts a CPU profile of the etcd server into path (the child's
// own, apart from the tool's); the returned function ends it.
func (e *etcdProc) Profile(path string) (stop func() error, err error) {
	if err := e.command("cpuprofile " + path); err != nil {
		return nil, fmt.Errorf("etcd's CPU profile %s: %w", path, err)
	}
	return func() error { return e.command("stopprofile") }, nil
}

func (e *etcdProc) command(line string) error {
	if _, err := fmt.Fprintln(e.stdin, line); err != nil {
		return err
	}
	ans, err := e.stdout.ReadString('\n')
	if err != nil {
		return err
	}
	if ans = strings.TrimSpace(ans); ans != "OK" {
		return errors.New(strings.TrimPrefix(ans, "ERR "))
	}
	return nil
}

func startEtcd(dir string, quota int64) (*etcdProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-etcd-child", "-etcd-dir", dir, "-quota", strconv.FormatInt(quota, 10))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("etcd child did not start (%q): %v", line, err)
	}
	e := &etcdProc{cmd: cmd, stdin: stdin, stdout: out, URL: strings.TrimSpace(strings.TrimPrefix(line, "READY "))}
	e.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{e.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 20})
	if err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// RSSKB is etcd's current resident set (VmRSS) in KiB.
func (e *etcdProc) RSSKB() int64 { return procStatusKB(e.cmd.Process.Pid, "VmRSS:") }

func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field) {
			f := strings.Fields(strings.TrimPrefix(l, field))
			if len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				return v
			}
		}
	}
	return 0
}

// Quiet settles etcd (Settle) and this process before a measurement: its
// garbage collected, half a second for both to calm down.
func (e *etcdProc) Quiet(ctx context.Context) error {
	_, err := e.Settle(ctx)
	runtime.GC()
	time.Sleep(500 * time.Millisecond)
	return err
}

// Settle compacts to the current revision and defragments, so that every
// measurement starts from a database of the same shape and the history of the
// previous runs does not pile up towards the quota.
func (e *etcdProc) Settle(ctx context.Context) (dbSize int64, err error) {
	resp, err := e.cli.Get(ctx, "compact-probe")
	if err != nil {
		return 0, err
	}
	if _, err := e.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !strings.Contains(err.Error(), "compacted") {
		return 0, fmt.Errorf("compact: %w", err)
	}
	if _, err := e.cli.Defragment(ctx, e.URL); err != nil {
		return 0, fmt.Errorf("defragment: %w", err)
	}
	st, err := e.cli.Status(ctx, e.URL)
	if err != nil {
		return 0, err
	}
	return st.DbSize, nil
}

func (e *etcdProc) Stop() {
	if e.cli != nil {
		e.cli.Close()
	}
	_ = e.stdin.Close()
	done := make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = e.cmd.Process.Kill()
		<-done
	}
}

func clientV3Prefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }
