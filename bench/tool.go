package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kube-etcd-migrate/undo"
)

// buildTool builds the kube-etcd-migrate binary from the module root.
func buildTool(root, out string) error {
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -o %s . (in %s): %w", out, root, err)
	}
	return nil
}

// moduleRoot finds the directory of kube-etcd-migrate's go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module kube-etcd-migrate\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run from inside the kube-etcd-migrate module (no go.mod found)")
		}
		dir = parent
	}
}

type toolRun struct {
	wall      time.Duration
	cpu       time.Duration // user + system time of the tool's process (wait4's rusage)
	sys       time.Duration // of which system time
	peakRSSKB int64         // VmHWM: the kernel's high-water mark of the resident set
	// peakPrivateKB is the largest RssAnon seen at the 20 ms samples: the
	// process's private memory (heap, stacks, the runtime's own), without
	// the pages of files it maps (its executable, a backup read in place),
	// which belong to the page cache. It is the memory figure the bounds
	// judge; VmHWM is kept beside it.
	peakPrivateKB int64
	exit          int
	stdout        []byte
	stderr        []byte
	// stateBytes is what the run left in its state directory (its undo: the
	// snapshot taken before the first write, the journal), measured before
	// the directory is emptied.
	stateBytes int64
	// What the machine's memory did meanwhile (production rows, diag): the
	// tool's own page faults and involuntary switches (wait4's rusage), the
	// collections its runtime ran (GODEBUG=gctrace, counted and taken out of
	// stderr), and the system's reclaim (/proc/vmstat's deltas).
	diag *toolDiag
}

// runTool runs the tool as a child process and samples its memory every 20 ms
// while it runs: its private memory (RssAnon in /proc/PID/status, the largest
// seen: a peak shorter than a tick can be missed) and its peak RSS (VmHWM
// there, a high-water mark the kernel keeps, exact). wait4's ru_maxrss cannot be used: Go starts children with clone(CLONE_VM|CLONE_VFORK),
// and exec records the parent's resident set as the child's high-water mark, so
// it reported this benchmark's own RSS (which grows with N) instead of the tool's.
func runTool(ctx context.Context, bin string, args ...string) (toolRun, error) {
	return runToolDiag(ctx, false, bin, args...)
}

// runToolDiag is runTool, and with diag also what the memory did (toolDiag).
// toolEnv is what -tool-env adds to the measured tool's environment (not to
// etcd's: a GOGC or GOMEMLIMIT tried on the tool alone).
var toolEnv envList

type envList []string

func (l *envList) String() string { return strings.Join(*l, " ") }

func (l *envList) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	*l = append(*l, v)
	return nil
}

func runToolDiag(ctx context.Context, diag bool, bin string, args ...string) (toolRun, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	// The writing commands keep their undo (a snapshot before the first write,
	// the journal) as an operator's run does, in a state directory of the
	// benchmark's own, emptied after each run.
	stateDir, err := os.MkdirTemp("", "kem-bench-state-")
	if err != nil {
		return toolRun{}, err
	}
	defer os.RemoveAll(stateDir)
	cmd.Env = append(os.Environ(), undo.EnvStateDir+"="+stateDir)
	cmd.Env = append(cmd.Env, toolEnv...)
	var vm0 map[string]int64
	if diag {
		cmd.Env = append(cmd.Env, "GODEBUG=gctrace=1")
		vm0 = machineCounters()
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return toolRun{}, fmt.Errorf("%s %s: %w", filepath.Base(bin), args[0], err)
	}
	var peak, peakPrivate int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			hwm, anon := procMemory(cmd.Process.Pid)
			peak, peakPrivate = max(peak, hwm), max(peakPrivate, anon)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	err = cmd.Wait()
	close(stop)
	<-sampled
	r := toolRun{wall: time.Since(start), stdout: out.Bytes(), stderr: errb.Bytes(), peakRSSKB: peak, peakPrivateKB: peakPrivate, stateBytes: dirBytes(stateDir)}
	if cmd.ProcessState != nil {
		r.exit = cmd.ProcessState.ExitCode()
		r.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		r.sys = cmd.ProcessState.SystemTime()
		if diag {
			r.diag = &toolDiag{vm: vmDelta(vm0, machineCounters())}
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				r.diag.majflt, r.diag.minflt, r.diag.nivcsw = ru.Majflt, ru.Minflt, ru.Nivcsw
			}
			r.stderr, r.diag.gcs, r.diag.liveMB = takeGCTrace(r.stderr)
		}
	}
	if err != nil && r.exit <= 0 {
		return r, fmt.Errorf("%s %s: %w", filepath.Base(bin), args[0], err)
	}
	return r, nil
}

// toolDiag is what the memory did during a run (toolRun.diag).
type toolDiag struct {
	majflt, minflt, nivcsw int64
	gcs                    int
	// liveMB is the heap each collection left marked (gctrace's third
	// "A->B->C MB" figure), sorted.
	liveMB []float64
	vm     map[string]int64
}

func (d *toolDiag) String() string {
	if d == nil {
		return ""
	}
	live := ""
	if n := len(d.liveMB); n > 0 {
		live = fmt.Sprintf(" (the heap they left: median %.0f MB, 90th percentile %.0f, at most %.0f)", d.liveMB[n/2], d.liveMB[n*9/10], d.liveMB[n-1])
	}
	ticks := func(k string) float64 { return float64(d.vm[k]) / clockTicks }
	return fmt.Sprintf("%d GCs%s; its faults %d major, %d minor; %d involuntary switches; the system's pgmajfault +%d, pgscan_direct +%d, pgscan_kswapd +%d, allocstall +%d; the machine's cores idle %.0fs, waiting on I/O %.0fs, stolen by the host %.1fs",
		d.gcs, live, d.majflt, d.minflt, d.nivcsw, d.vm["pgmajfault"], d.vm["pgscan_direct"], d.vm["pgscan_kswapd"], d.vm["allocstall"], ticks("idle"), ticks("iowait"), ticks("steal"))
}

// machineCounters is vmstat and cpuStat in one map.
func machineCounters() map[string]int64 {
	m := map[string]int64{}
	for k, v := range vmstat() {
		m[k] = v
	}
	for k, v := range cpuStat() {
		m[k] = v
	}
	return m
}

// cpuStat reads the machine's idle, iowait and steal times (USER_HZ ticks,
// all cores) from /proc/stat's first line.
func cpuStat() map[string]int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return nil
	}
	m := map[string]int64{}
	for k, i := range map[string]int{"idle": 4, "iowait": 5, "steal": 8} {
		m[k], _ = strconv.ParseInt(f[i], 10, 64)
	}
	return m
}

// vmstat reads the reclaim counters of /proc/vmstat (allocstall summed over
// its zones).
func vmstat() map[string]int64 {
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch {
		case f[0] == "pgmajfault", f[0] == "pgscan_direct", f[0] == "pgscan_kswapd":
			m[f[0]] = v
		case strings.HasPrefix(f[0], "allocstall_"):
			m["allocstall"] += v
		}
	}
	return m
}

func vmDelta(a, b map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range b {
		d[k] = v - a[k]
	}
	return d
}

// takeGCTrace counts the runtime's gctrace lines ("gc 12 @3.4s 2%: ...,
// 40->52->31 MB, 64 MB goal, ...") in stderr, with the heap each left
// marked (sorted), and returns stderr without them.
func takeGCTrace(stderr []byte) ([]byte, int, []float64) {
	var kept bytes.Buffer
	n := 0
	var live []float64
	for _, line := range bytes.SplitAfter(stderr, []byte("\n")) {
		if !bytes.HasPrefix(line, []byte("gc ")) || !bytes.Contains(line, []byte(" @")) {
			kept.Write(line)
			continue
		}
		n++
		for _, f := range strings.Split(string(line), ", ") {
			if mb, ok := strings.CutSuffix(f, " MB"); ok && strings.Count(mb, "->") == 2 {
				if v, err := strconv.ParseFloat(mb[strings.LastIndex(mb, ">")+1:], 64); err == nil {
					live = append(live, v)
				}
			}
		}
	}
	sort.Float64s(live)
	return kept.Bytes(), n, live
}

// procMemory reads a live process's peak resident set (VmHWM) and its
// private resident memory now (RssAnon), in KiB, from one read of
// /proc/PID/status (0, 0 once it has exited).
func procMemory(pid int) (hwmKB, anonKB int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	return parseStatus(b)
}

// parseStatus takes VmHWM and RssAnon (KiB) from the text of a
// /proc/PID/status ("VmHWM:\t  12345 kB"); a field missing is 0.
func parseStatus(b []byte) (hwmKB, anonKB int64) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmHWM:":
			hwmKB, _ = strconv.ParseInt(f[1], 10, 64)
		case "RssAnon:":
			anonKB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return hwmKB, anonKB
}

type verifyCounts struct {
	Objects, Current, Stale, Unreadable, NotObjects int64
}

type verifyOut struct {
	Summary   verifyCounts `json:"summary"`
	Resources []struct {
		Group, Resource string
		verifyCounts
		StaleBy map[string]int `json:"staleBy"`
	} `json:"resources"`
}

func (v verifyOut) byResource() string {
	var b strings.Builder
	for _, r := range v.Resources {
		fmt.Fprintf(&b, " %s.%s=%d/%d%v", r.Resource, r.Group, r.Stale, r.Objects, r.StaleBy)
	}
	return b.String()
}

type migrateOut struct {
	Duration string `json:"duration"`
	Summary  struct {
		Scanned, Current, Stale, Rewritten, Conflicts, Skipped, Unreadable, Failed int64
		BytesRead                                                                  int64 `json:"bytesRead"`
		BytesWritten                                                               int64 `json:"bytesWritten"`
	} `json:"summary"`
	// How the writes went (etcdscan.WriterStats) and the scan's restarts
	// (a compaction of the revision it read at).
	Writer struct {
		Txns, Fallbacks, Singles, Splits, Retries int64
	} `json:"writer"`
	Restarts []struct{} `json:"restarts"`
	// Batches decided ahead while the writes waited (migrate.Summary.Backlog).
	Backlog int `json:"backlog"`
	Space   struct {
		DBSizeBefore int64 `json:"dbSizeBefore"`
		DBSizeAfter  int64 `json:"dbSizeAfter"`
		DBSizeMax    int64 `json:"dbSizeMax"`
		Compactions  int   `json:"compactions"`
		// Where a compacting run's time went (guard.SpaceReport).
		CompactSeconds float64 `json:"compactSeconds"`
		WaitSeconds    float64 `json:"waitSeconds"`
		EndWaitSeconds float64 `json:"endWaitSeconds"`
	} `json:"space"`
}

func parseJSON(r toolRun, v any) error {
	if err := json.Unmarshal(r.stdout, v); err != nil {
		return fmt.Errorf("tool output is not the expected JSON (exit %d): %v; stderr: %s", r.exit, err, tail(r.stderr))
	}
	return nil
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 800 {
		s = "..." + s[len(s)-800:]
	}
	return s
}

// dirBytes is the size of the files under dir (0 when it cannot be read).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
