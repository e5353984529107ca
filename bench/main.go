// Command bench measures kube-etcd-migrate's verify and migrate against etcd's own
// ceiling (raw paged reads, raw CAS rewrites of the same bytes, same page size, batch
// size and concurrency), verify of a snapshot file of the same keyspace against a
// bare read of that file and, with -apiserver, against the incumbent path (no-op PUTs
// through an in-process kube-apiserver), on an embedded etcd run as a child process.
// Run it with `make bench` / `make bench-apiserver`; see docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/grpclog"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/release"
)

type options struct {
	n                      int
	staleVersion, staleKey float64
	reps                   int
	jsonPath               string
	tool                   string
	baseline               string
	apiserver              bool
	apiserverN             int
	profileDir             string
	quota                  int64
	compactHistory         bool
	snapshot               bool
	rollback               bool
	rollbackN              int
	snap                   snapOptions
	scale                  scaleOptions
	productionN            int
	productionQuota        int64
	productionReps         int
	dataset                string
	rotationN              int
	crN                    int
	sweep                  bool
	kine                   kineOptions
}

func main() {
	var o options
	var child bool
	var childDir string
	flag.IntVar(&o.n, "n", 100000, "objects to seed")
	flag.Float64Var(&o.staleVersion, "stale-version", 0.3, "share of pods, deployments, events, custom resources and DeviceClasses stored stale (JSON media type, v1beta1 CR, 1.34 DeviceClass)")
	flag.Float64Var(&o.staleKey, "stale-key", 0.3, "share of secrets and configmaps encrypted with the old aescbc key (key1; the target config is [key2, key1])")
	flag.IntVar(&o.reps, "reps", 3, "repetitions of each measurement (median and range are reported)")
	flag.StringVar(&o.jsonPath, "json", "bench/results.json", "write the figures here as JSON (empty: do not)")
	flag.StringVar(&o.baseline, "baseline", "", "another kube-etcd-migrate binary (an earlier build) to measure right after the tool in every repetition, on the same keyspace: rows \"verify (baseline)\", \"migrate (baseline)\", \"migrate (watched, baseline)\", \"migrate (defaults, baseline)\" and \"migrate (engine, baseline)\"")
	flag.StringVar(&o.tool, "tool", "", "kube-etcd-migrate binary to measure (default: go build -o from the module root)")
	flag.BoolVar(&o.apiserver, "apiserver", false, "also measure the incumbent: no-op PUTs through an in-process kube-apiserver")
	flag.IntVar(&o.apiserverN, "apiserver-n", 0, "objects for the apiserver path (0: the same N); it re-seeds a keyspace of this size")
	flag.StringVar(&o.profileDir, "profile", "", "after the measurements, run verify, migrate and the engine (migrate --no-undo) once more with --cpuprofile/--memprofile into this directory; with -dataset production, the measured migrate --compact-history itself writes its --cpuprofile there, and the etcd child's CPU is profiled during it and during the ceiling (production-*.etcd.cpu.pprof)")
	flag.Int64Var(&o.quota, "quota", 8<<30, "etcd --quota-backend-bytes")
	flag.BoolVar(&o.compactHistory, "compact-history", true, "also measure migrate --compact-history (row \"migrate (compacting)\"), with etcd's database size before and after")
	flag.BoolVar(&o.snapshot, "snapshot", true, "also measure an etcd snapshot file (the snapshot phase, after the datasets: -snapshot-n mixed objects on an etcd of their own, saved; verify and migrate --snapshot-file beside a bare read of the file and beside the same commands on that etcd)")
	flag.IntVar(&o.snap.n, "snapshot-n", 1000000, "objects of the snapshot phase (mixed dataset; 1,000,000 make a file of about 1.4 GB)")
	flag.IntVar(&o.snap.reps, "snapshot-reps", 1, "repetitions of the snapshot phase")
	flag.BoolVar(&o.snap.restore, "snapshot-restore", true, "in the snapshot phase, also restore about 100,000 of the file's objects (whole namespaces of secrets, configmaps, deployments and pods) into an empty etcd with the tool's defaults: its time and peak private memory beside migrate's")
	flag.StringVar(&o.snap.keep, "snapshot-keep", "", "copy the snapshot phase's file and encryption configurations into this directory (to profile the commands on them by hand)")
	flag.BoolVar(&o.scale.on, "scale", true, "also measure how verify --snapshot-file grows with the file (the scale phase, on an etcd of its own): files of -scale-n and 4 × -scale-n mixed objects read side by side, the ratio of their times and each one's peak private memory")
	flag.IntVar(&o.scale.n, "scale-n", 25000, "objects of the scale phase's smaller file (the larger has 4 ×); 1000000 is the production row: files of about 1.8 and 7.4 GB")
	flag.IntVar(&o.scale.reps, "scale-reps", 1, "repetitions of the scale phase's two reads")
	flag.IntVar(&o.productionN, "production-n", 4000000, "objects of the production phase (-dataset production only: never part of all): 4,000,000 mixed objects fill etcd's largest quota, 8 GiB")
	flag.IntVar(&o.productionReps, "production-reps", 1, "rounds of the production phase's plan, migrate --compact-history, rollback and compaction-matched ceiling, each round the tool's run and its ceiling's side by side (make bench-production: 3)")
	flag.Int64Var(&o.productionQuota, "production-quota", defaultProductionQuota, "etcd's --quota-backend-bytes in the production phase: 8 GiB, the largest etcd recommends; a smaller one with a smaller -production-n fills it as full (1 GiB for 500,000 objects)")
	flag.StringVar(&o.dataset, "dataset", "all", "mixed (N objects of every kind, no managedFields), rotation (-rotation-n 2 KB secrets with managedFields, all under the old key), cr (-cr-n custom resources with three managedFields entries, -stale-version of them in the CRD's other version), snapshot (the snapshot phase only), rollback (the rollback phase only), scale (the scale phase only), kine (the kine phase only), production (the production phase only: -production-n objects filling an 8 GiB quota, every command once, with the disk each used and plan's estimate beside migrate's time), or all (the three, one after the other, each on its own etcd, then the snapshot, rollback, scale and kine phases)")
	flag.BoolVar(&o.rollback, "rollback", true, "also measure rollback of a journal of -rollback-n rewrites of 2 KB values (the rollback phase, on an etcd of its own): its rate and peak private memory against its 150 MB bound")
	flag.IntVar(&o.rollbackN, "rollback-n", 1000000, "journal entries of the rollback phase (1,000,000 make a journal of about 3 GB and 2 GB of etcd data)")
	flag.IntVar(&o.rotationN, "rotation-n", rotationN, "secrets of the rotation dataset")
	flag.IntVar(&o.crN, "cr-n", crNDefault, "custom resources of the cr dataset")
	flag.BoolVar(&o.kine.on, "kine", true, "also measure k3s's SQLite datastore through kine (the kine phase, after the others): -kine-n mixed objects written through kine as kube-apiserver writes them, verify, plan, migrate and rollback on the node as an operator runs them, beside verify and migrate of the same keys on an etcd; each one's peak private memory against 100 MB and plan's range against migrate")
	flag.IntVar(&o.kine.n, "kine-n", 50000, "objects of the kine phase")
	flag.IntVar(&o.kine.reps, "kine-reps", 3, "repetitions of the kine phase's commands")
	flag.BoolVar(&o.sweep, "sweep", true, "find the CAS ceiling's best settings first (16-128 puts per transaction x 4-32 in flight, one run each); false: the tool's own settings")
	flag.Var(&toolEnv, "tool-env", "KEY=VALUE added to the measured tool's environment only, not etcd's (repeatable): a GOGC or GOMEMLIMIT tried on the tool")
	flag.BoolVar(&child, "etcd-child", false, "internal: run the embedded etcd child")
	flag.StringVar(&childDir, "etcd-dir", "", "internal: data directory of the etcd child")
	flag.Parse()
	if child {
		if err := runEtcdChild(childDir, o.quota); err != nil {
			fmt.Fprintln(os.Stderr, "etcd child:", err)
			os.Exit(1)
		}
		return
	}
	// The ceilings' clients get the tool's gRPC buffer pool (see the
	// command's init): with gRPC's default one each 16-put transaction would
	// marshal into a cleared 1 MiB buffer, and the ceiling would not be at its
	// best. Not in the etcd child above: that is a stock etcd server. Set
	// before this process's first gRPC use.
	experimental.SetDefaultBufferPool(etcdscan.BufferPool())
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
	if err := runAll(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// runAll builds the tool once and measures each dataset on its own etcd.
func runAll(ctx context.Context, o options) error {
	var datasets []string
	switch o.dataset {
	case "mixed", "rotation", "cr":
		datasets = []string{o.dataset}
	case "all":
		datasets = []string{"mixed", "rotation", "cr"}
	case "snapshot", "rollback", "scale", "production", "kine": // that phase only
	default:
		return fmt.Errorf("-dataset %q: want mixed, rotation, cr, snapshot, rollback, scale, production, kine or all", o.dataset)
	}
	if o.n <= 0 || o.reps <= 0 || o.rotationN <= 0 || o.crN <= 0 || o.snap.n <= 0 || o.snap.reps <= 0 || o.rollbackN <= 0 || o.scale.n <= 0 || o.scale.reps <= 0 || o.kine.n <= 0 || o.kine.reps <= 0 || o.productionReps <= 0 {
		return fmt.Errorf("-n, -rotation-n, -cr-n, -snapshot-n, -rollback-n, -scale-n, -kine-n, -reps, -snapshot-reps, -scale-reps, -kine-reps and -production-reps must be positive")
	}
	dir, err := os.MkdirTemp("", "kem-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.tool == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		o.tool = filepath.Join(dir, "kube-etcd-migrate")
		logf("building the tool: go build -o %s .", o.tool)
		if err := buildTool(root, o.tool); err != nil {
			return err
		}
	}
	var all []*results
	for _, ds := range datasets {
		dso := o
		if ds == "rotation" {
			dso.n, dso.staleKey, dso.snapshot, dso.apiserver = o.rotationN, 1, false, false
			if o.jsonPath != "" {
				dso.jsonPath = strings.TrimSuffix(o.jsonPath, ".json") + "-rotation.json"
			}
		}
		if ds == "cr" {
			dso.n, dso.staleKey, dso.snapshot, dso.apiserver = o.crN, 0, false, false
			if o.jsonPath != "" {
				dso.jsonPath = strings.TrimSuffix(o.jsonPath, ".json") + "-cr.json"
			}
		}
		if o.profileDir != "" && len(datasets) > 1 {
			dso.profileDir = filepath.Join(o.profileDir, ds)
		}
		dsDir := filepath.Join(dir, ds)
		if err := os.Mkdir(dsDir, 0o700); err != nil {
			return err
		}
		res, err := run(ctx, dso, ds, dsDir)
		if err != nil {
			return fmt.Errorf("%s dataset: %w", ds, err)
		}
		all = append(all, res)
	}
	if o.snapshot && (o.dataset == "all" || o.dataset == "mixed" || o.dataset == "snapshot") {
		res, err := phaseRun(ctx, o, dir, "snapshot", snapshotPhase)
		if err != nil {
			return fmt.Errorf("snapshot phase: %w", err)
		}
		all = append(all, res)
	}
	if o.rollback && (o.dataset == "all" || o.dataset == "rollback") {
		res, err := rollbackRun(ctx, o, dir)
		if err != nil {
			return fmt.Errorf("rollback phase: %w", err)
		}
		all = append(all, res)
	}
	if o.scale.on && (o.dataset == "all" || o.dataset == "scale") {
		res, err := phaseRun(ctx, o, dir, "scale", scalePhase)
		if err != nil {
			return fmt.Errorf("scale phase: %w", err)
		}
		all = append(all, res)
	}
	if o.kine.on && (o.dataset == "all" || o.dataset == "kine") {
		res, err := phaseRun(ctx, o, dir, "kine", kinePhase)
		if err != nil {
			return fmt.Errorf("kine phase: %w", err)
		}
		all = append(all, res)
	}
	if o.dataset == "production" {
		if o.productionN <= 0 {
			return fmt.Errorf("-production-n must be positive")
		}
		res, err := phaseRun(ctx, o, dir, "production", productionPhase)
		if err != nil {
			return fmt.Errorf("production phase: %w", err)
		}
		all = append(all, res)
	}
	if len(all) > 1 {
		fmt.Println("\n==== all datasets ====")
		for _, res := range all {
			printTable(os.Stdout, res)
		}
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// sample is one timed run.
type sample struct {
	Seconds         float64 `json:"seconds"`
	InRunSeconds    float64 `json:"inRunSeconds,omitempty"` // the tool's own duration (migrate summary)
	CPUSeconds      float64 `json:"cpuSeconds,omitempty"`   // the tool's user + system CPU time, whole process
	Objects         int64   `json:"objects"`
	Bytes           int64   `json:"bytes"`
	Rewrites        int64   `json:"rewrites"`
	PeakPrivateKB   int64   `json:"peakPrivateKiB,omitempty"` // private memory at its peak (RssAnon, sampled): the memory figure
	PeakRSSKB       int64   `json:"peakRSSKiB,omitempty"`     // peak resident set (VmHWM), mapped file pages included
	EtcdRSSBeforeKB int64   `json:"etcdRSSBeforeKiB"`
	EtcdRSSAfterKB  int64   `json:"etcdRSSAfterKiB"`
	// etcd's database (every member's largest, as the migrate summary has it).
	DBSizeBeforeKB int64 `json:"dbSizeBeforeKiB,omitempty"`
	DBSizeAfterKB  int64 `json:"dbSizeAfterKiB,omitempty"`
	DBSizeMaxKB    int64 `json:"dbSizeMaxKiB,omitempty"`
	Compactions    int   `json:"compactions,omitempty"`
	// DiskKB is the disk the run used: its undo (state directory) and what
	// it wrote beside it (a journal, an output snapshot).
	DiskKB int64 `json:"diskKiB,omitempty"`
	// EtcdCPUSeconds is the etcd child's CPU time during the run.
	EtcdCPUSeconds float64 `json:"etcdCPUSeconds,omitempty"`
	// EstimateLow and EstimateHigh are plan's range for migrate (a plan row).
	EstimateLow  float64 `json:"estimateLow,omitempty"`
	EstimateHigh float64 `json:"estimateHigh,omitempty"`
}

func (s sample) objPerSec() float64 { return float64(s.Objects) / s.Seconds }

type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1]}
}

type measurement struct {
	Name         string   `json:"name"`
	Samples      []sample `json:"samples"`
	ObjectsPerS  stat     `json:"objectsPerSecond"`
	MBPerS       stat     `json:"megabytesPerSecond"`
	RewritesPerS stat     `json:"rewritesPerSecond"`
	InRunObjPerS stat     `json:"inRunObjectsPerSecond,omitempty"`
	// PeakPrivateMB is the memory figure the bounds judge (RssAnon, the
	// tool's private memory); PeakRSSMB (VmHWM) is kept beside it.
	PeakPrivateMB stat `json:"peakPrivateMB,omitempty"`
	PeakRSSMB     stat `json:"peakRSSMB,omitempty"`
	// CPUMicros is the tool's CPU time per object scanned (µs, whole process):
	// unlike objects/s it hardly depends on what else runs on the machine.
	CPUMicros stat `json:"cpuMicrosPerObject,omitempty"`
	// EtcdCPUMicros is etcd's CPU time per object in the same run (µs): what
	// applying the row's reads and writes cost the etcd child.
	EtcdCPUMicros stat `json:"etcdCPUMicrosPerObject,omitempty"`
	EtcdRSSMB     struct {
		Before stat `json:"before"`
		After  stat `json:"after"`
	} `json:"etcdRSSMB"`
	// DBSizeMB is etcd's database size before and after a migrate run, and
	// the largest seen during it.
	DBSizeMB struct {
		Before stat `json:"before"`
		After  stat `json:"after"`
		Max    stat `json:"max"`
	} `json:"dbSizeMB,omitempty"`
}

func (m *measurement) finish() {
	var ops, mbs, rws, inrun, private, rss, cpu, etcdCPU, eb, ea, db, da, dm []float64
	for _, s := range m.Samples {
		if s.DBSizeBeforeKB > 0 {
			db = append(db, float64(s.DBSizeBeforeKB)/1024)
			da = append(da, float64(s.DBSizeAfterKB)/1024)
			dm = append(dm, float64(s.DBSizeMaxKB)/1024)
		}
		if s.CPUSeconds > 0 && s.Objects > 0 {
			cpu = append(cpu, s.CPUSeconds*1e6/float64(s.Objects))
		}
		if s.EtcdCPUSeconds > 0 && s.Objects > 0 {
			etcdCPU = append(etcdCPU, s.EtcdCPUSeconds*1e6/float64(s.Objects))
		}
		ops = append(ops, s.objPerSec())
		mbs = append(mbs, float64(s.Bytes)/1e6/s.Seconds)
		rws = append(rws, float64(s.Rewrites)/s.Seconds)
		if s.InRunSeconds > 0 {
			inrun = append(inrun, float64(s.Objects)/s.InRunSeconds)
		}
		if s.PeakPrivateKB > 0 {
			private = append(private, float64(s.PeakPrivateKB)/1024)
		}
		if s.PeakRSSKB > 0 {
			rss = append(rss, float64(s.PeakRSSKB)/1024)
		}
		eb = append(eb, float64(s.EtcdRSSBeforeKB)/1024)
		ea = append(ea, float64(s.EtcdRSSAfterKB)/1024)
	}
	m.ObjectsPerS, m.MBPerS, m.RewritesPerS, m.InRunObjPerS, m.PeakRSSMB = statOf(ops), statOf(mbs), statOf(rws), statOf(inrun), statOf(rss)
	m.PeakPrivateMB = statOf(private)
	m.EtcdRSSMB.Before, m.EtcdRSSMB.After = statOf(eb), statOf(ea)
	m.DBSizeMB.Before, m.DBSizeMB.After, m.DBSizeMB.Max = statOf(db), statOf(da), statOf(dm)
	m.CPUMicros, m.EtcdCPUMicros = statOf(cpu), statOf(etcdCPU)
}

type ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target float64 `json:"target"`
	Met    bool    `json:"met"`
	// AtMost: the target is a ceiling (as every memory target is), not a floor.
	AtMost bool `json:"atMost,omitempty"`
	// Low and High, when High is set, are a range the value must be in
	// (plan's estimate), instead of Target.
	Low  float64 `json:"low,omitempty"`
	High float64 `json:"high,omitempty"`
	Note string  `json:"note,omitempty"`
}

type results struct {
	Machine struct {
		CPUs      int    `json:"cpus"`
		GoVersion string `json:"go"`
		OS        string `json:"os"`
		CPU       string `json:"cpuModel,omitempty"`
	} `json:"machine"`
	Date          string   `json:"date"`
	Dataset       string   `json:"dataset"`
	LoadAvg       []string `json:"loadAverageBeforeAfter,omitempty"` // /proc/loadavg: other work on the machine
	N             int      `json:"n"`
	Keys          int64    `json:"keys"`
	KeyspaceBytes int64    `json:"keyspaceBytes"`
	StaleObjects  int      `json:"staleObjects"`
	StaleVersion  float64  `json:"staleVersionShare"`
	StaleKey      float64  `json:"staleKeyShare"`
	Reps          int      `json:"reps"`
	PageSize      int64    `json:"pageSize"`
	BatchOps      int      `json:"batchOps"`
	BatchBytes    int      `json:"batchBytes"`
	Writers       int      `json:"writers"`
	// The CAS ceiling's best settings, from the sweep (CASSweep), used for "CAS ceiling".
	CeilingOps     int            `json:"ceilingBatchOps"`
	CeilingWriters int            `json:"ceilingWriters"`
	CASSweep       []sweepPoint   `json:"casSweep,omitempty"`
	SeedSeconds    float64        `json:"seedSeconds"`
	Measurements   []*measurement `json:"measurements"`
	Ratios         []ratio        `json:"ratios"`
	APIServerN     int            `json:"apiserverN,omitempty"`
	Notes          []string       `json:"notes,omitempty"`
	// Floor is the default migrate against its floor (the outage rows).
	Floor *floorOf `json:"floor,omitempty"`
}

func (r *results) get(name string) *measurement {
	for _, m := range r.Measurements {
		if m.Name == name {
			return m
		}
	}
	m := &measurement{Name: name}
	r.Measurements = append(r.Measurements, m)
	return m
}

const (
	mVerify  = "verify (tool)"
	mScan    = "scan ceiling"
	mMigrate = "migrate (tool)"
	// The tool with --compact-history: etcd's database before/after.
	mMigrateCompact = "migrate (compacting)"
	// -baseline: another build of the tool, measured beside it.
	mVerifyBase  = "verify (baseline)"
	mMigrateBase = "migrate (baseline)"
	// migrate with its liveness watch (a window of watchedWindow): the
	// watch's cost per object, the tool's and the baseline's.
	mMigrateWatched     = "migrate (watched)"
	mMigrateWatchedBase = "migrate (watched, baseline)"
	watchedWindow       = 2 * time.Second
	// rollback of the tool's migrate run just measured (its journal), on
	// the same keys: the undo beside the change.
	mRollbackMigrate = "rollback of migrate"
	mCAS             = "CAS ceiling"
	mCASTool         = "CAS @tool flags" // the ceiling at the tool's own batch size and writers
	mAPI             = "apiserver no-op PUT"
	// The tool's defaults (migrate.DefaultWriters; etcdscan defaults).
	toolWriters = migrate.DefaultWriters
)

func run(ctx context.Context, o options, dataset, dir string) (*results, error) {
	res := &results{Dataset: dataset, N: o.n, StaleVersion: o.staleVersion, StaleKey: o.staleKey, Reps: o.reps,
		PageSize: etcdscan.DefaultPageSize, BatchOps: etcdscan.DefaultMaxOps, BatchBytes: etcdscan.DefaultMaxBytes, Writers: toolWriters,
		Date: time.Now().UTC().Format(time.RFC3339)}
	if dataset == "rotation" {
		res.StaleVersion = 0
	}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	return res, runDataset(ctx, o, res, dataset, dir)
}

func runDataset(ctx context.Context, o options, res *results, dataset, dir string) error {
	bin := o.tool
	oldCfg, newCfg, err := writeEncryptionConfigs(dir)
	if err != nil {
		return err
	}
	etcd, err := startEtcd(filepath.Join(dir, "etcd"), o.quota)
	if err != nil {
		return err
	}
	defer etcd.Stop()
	logf("%s dataset: etcd child pid %d at %s (RSS %d MB)", dataset, etcd.cmd.Process.Pid, etcd.URL, etcd.RSSKB()/1024)

	gen, err := newGenerator(ctx, o.n, o.staleVersion, o.staleKey, oldCfg, newCfg, dataset == "rotation")
	if err != nil {
		return err
	}
	gen.cr = dataset == "cr"
	if err := gen.grantLeases(ctx, etcd.cli); err != nil {
		return err
	}
	start := time.Now()
	seeded, err := gen.seed(ctx, etcd.cli, func(objSpec) bool { return true }, true)
	if err != nil {
		return err
	}
	res.SeedSeconds = time.Since(start).Seconds()
	stale := gen.staleKeys()
	res.StaleObjects = len(stale)
	logf("seeded %d objects (+%d namespaces, 1 CRD) in %.1fs (%.0f objects/s); %d stale", seeded, namespaces, res.SeedSeconds, float64(seeded)/res.SeedSeconds, len(stale))

	common := []string{"--endpoints", etcd.URL, "--encryption-provider-config", newCfg}
	reseedStale := func() error {
		t := time.Now()
		n, err := gen.seed(ctx, etcd.cli, func(s objSpec) bool { return s.stale }, true)
		if err == nil {
			logf("  re-seeded the %d stale objects and the CRD in %.1fs", n, time.Since(t).Seconds())
		}
		return err
	}
	settle := func() error { return etcd.Quiet(ctx) }

	res.CeilingOps, res.CeilingWriters = etcdscan.DefaultMaxOps, toolWriters
	if o.sweep {
		if err := casSweep(ctx, res, etcd, stale, settle); err != nil {
			return err
		}
	}

	// The tool, and the -baseline binary measured right after it on the same
	// keyspace (rows "verify (baseline)", "migrate (baseline)").
	type measured struct {
		bin, verify, migrate string
		flags                []string // migrate's own
		// watched: migrate with its liveness watch (a short window), not
		// --allow-live-apiserver: what the watch costs per object.
		watched bool
	}
	tools := []measured{{bin: bin, verify: mVerify, migrate: mMigrate}}
	if o.baseline != "" {
		tools = append(tools, measured{bin: o.baseline, verify: mVerifyBase, migrate: mMigrateBase})
	}
	// The migrate runs: the tools', and the tool's with --compact-history.
	migrates := tools
	if o.compactHistory {
		migrates = append(append([]measured(nil), tools...), measured{bin: bin, migrate: mMigrateCompact, flags: []string{"--compact-history"}})
	}
	migrates = append(migrates, measured{bin: bin, migrate: mMigrateWatched, watched: true})
	if o.baseline != "" {
		migrates = append(migrates, measured{bin: o.baseline, migrate: mMigrateWatchedBase, watched: true})
	}
	for rep := 1; rep <= o.reps; rep++ {
		logf("repetition %d/%d", rep, o.reps)
		// Scan ceiling.
		if err := settle(); err != nil {
			return err
		}
		before := etcd.RSSKB()
		c, err := scanCeiling(ctx, etcd.cli, etcdscan.DefaultPageSize)
		if err != nil {
			return fmt.Errorf("scan ceiling: %w", err)
		}
		res.Keys, res.KeyspaceBytes = c.keys, c.bytes
		res.get(mScan).Samples = append(res.get(mScan).Samples, sample{Seconds: c.elapsed.Seconds(), Objects: c.keys, Bytes: c.bytes, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB()})
		logf("  scan ceiling: %d keys in %.2fs", c.keys, c.elapsed.Seconds())

		// kube-apiserver's read of every object, in this process, no etcd.
		if err := settle(); err != nil {
			return err
		}
		rp, err := readPath(ctx, etcd.cli, gen, gen.newEnc)
		if err != nil {
			return err
		}
		res.get(mReadPath).Samples = append(res.get(mReadPath).Samples, rp)
		logf("  read path: %d values decoded in %.2fs (CPU %.2fs)", rp.Objects, rp.Seconds, rp.CPUSeconds)

		// verify (and the baseline's, right after it).
		for _, v := range tools {
			if err := settle(); err != nil {
				return err
			}
			before, cpu0 := etcd.RSSKB(), etcd.CPU()
			tr, err := runTool(ctx, v.bin, append([]string{"verify", "-o", "json", "--show-keys", "-1"}, common...)...)
			etcdCPU := etcd.CPU() - cpu0
			if err != nil {
				return err
			}
			var vo verifyOut
			if err := parseJSON(tr, &vo); err != nil {
				return err
			}
			if err := checkRotationVerdicts(dataset, vo); err != nil {
				return err
			}
			if tr.exit != 3 || vo.Summary.Stale != int64(len(stale)) || vo.Summary.Unreadable != 0 {
				return fmt.Errorf("%s: exit %d, %d stale, %d unreadable; want exit 3, %d stale (the seeding or the tool is wrong): stale/objects by resource:%s; expected stale by kind: %v; stderr: %s",
					v.verify, tr.exit, vo.Summary.Stale, vo.Summary.Unreadable, len(stale), vo.byResource(), gen.staleByKind(), tail(tr.stderr))
			}
			res.get(v.verify).Samples = append(res.get(v.verify).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: vo.Summary.Objects + vo.Summary.NotObjects, Bytes: c.bytes,
				PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB(), EtcdCPUSeconds: etcdCPU.Seconds()})
			logf("  %s: %d objects, %d stale in %.2fs (CPU %.2fs), peak private %d MB, RSS %d MB", v.verify, vo.Summary.Objects, vo.Summary.Stale, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
		}

		// CAS ceilings (rewrite the same bytes: the keyspace stays stale): at
		// their best settings and at the tool's own.
		for _, cc := range []struct {
			name         string
			ops, writers int
		}{{mCAS, res.CeilingOps, res.CeilingWriters}, {mCASTool, etcdscan.DefaultMaxOps, toolWriters}} {
			if err := settle(); err != nil {
				return err
			}
			before = etcd.RSSKB()
			cpu0, m0, client0 := etcd.CPU(), etcd.metrics(ctx), processCPU()
			c, err = casCeiling(ctx, etcd.cli, etcdscan.DefaultPageSize, stale, cc.ops, etcdscan.DefaultMaxBytes, cc.writers)
			etcdCPU, clientCPU := etcd.CPU()-cpu0, processCPU()-client0
			if err != nil {
				return fmt.Errorf("CAS ceiling: %w", err)
			}
			if c.rewrites != int64(len(stale)) {
				return fmt.Errorf("CAS ceiling rewrote %d keys, want %d (%d failed)", c.rewrites, len(stale), c.failed)
			}
			// The bare client runs in this process: its CPU is the
			// process's during the ceiling.
			res.get(cc.name).Samples = append(res.get(cc.name).Samples, sample{Seconds: c.elapsed.Seconds(), CPUSeconds: clientCPU.Seconds(), Objects: c.keys, Bytes: c.bytes, Rewrites: c.rewrites, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB(), EtcdCPUSeconds: etcdCPU.Seconds()})
			logf("  %s (%d puts/txn, %d in flight): %d keys, %d rewritten in %.2fs (client CPU %.2fs, etcd CPU %.2fs); etcd: %s", cc.name, cc.ops, cc.writers, c.keys, c.rewrites, c.elapsed.Seconds(), clientCPU.Seconds(), etcdCPU.Seconds(), etcdCosts(m0, etcd.metrics(ctx)))
		}

		// migrate (and the baseline's, right after it).
		for _, v := range migrates {
			if err := settle(); err != nil {
				return err
			}
			before := etcd.RSSKB()
			// --allow-live-apiserver: the rows measure the rewrite, not the
			// liveness preflight's fixed watch (--liveness-window, 15 s).
			args := []string{"migrate", "-o", "json", "--quota-backend-bytes", fmt.Sprint(o.quota), "--allow-live-apiserver"}
			if v.watched {
				args = []string{"migrate", "-o", "json", "--quota-backend-bytes", fmt.Sprint(o.quota), "--liveness-window", watchedWindow.String()}
			}
			args = append(args, v.flags...)
			// migrate writes only for a release it is told (so does a
			// -baseline built since that rule).
			args = append(args, "--target-version", release.Linked())
			// The tool's own run keeps its journal beside the benchmark's
			// files, for the rollback measured after it.
			journal := ""
			if v.migrate == mMigrate {
				journal = filepath.Join(dir, fmt.Sprintf("migrate-%d.journal", rep))
				args = append(args, "--journal", journal)
			}
			cpu0 := etcd.CPU()
			tr, err := runTool(ctx, v.bin, append(args, common...)...)
			if err != nil {
				return err
			}
			etcdCPU := etcd.CPU() - cpu0
			var mo migrateOut
			if err := parseJSON(tr, &mo); err != nil {
				return err
			}
			if tr.exit != 0 || mo.Summary.Rewritten != int64(len(stale)) {
				return fmt.Errorf("%s: exit %d, rewrote %d, want %d; stderr: %s", v.migrate, tr.exit, mo.Summary.Rewritten, len(stale), tail(tr.stderr))
			}
			inRun, _ := time.ParseDuration(mo.Duration)
			res.get(v.migrate).Samples = append(res.get(v.migrate).Samples, sample{Seconds: tr.wall.Seconds(), InRunSeconds: inRun.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: mo.Summary.Scanned, Bytes: c.bytes,
				Rewrites: mo.Summary.Rewritten, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB(),
				DBSizeBeforeKB: mo.Space.DBSizeBefore >> 10, DBSizeAfterKB: mo.Space.DBSizeAfter >> 10, DBSizeMaxKB: mo.Space.DBSizeMax >> 10, Compactions: mo.Space.Compactions, EtcdCPUSeconds: etcdCPU.Seconds()})
			logf("  %s: %d scanned, %d rewritten in %.2fs (in-run %s, CPU %.2fs, etcd CPU %.2fs), peak private %d MB, RSS %d MB; etcd database %d -> %d MB (at most %d MB, %d compaction(s))", v.migrate, mo.Summary.Scanned, mo.Summary.Rewritten, tr.wall.Seconds(), mo.Duration, tr.cpu.Seconds(), etcdCPU.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024,
				mo.Space.DBSizeBefore>>20, mo.Space.DBSizeAfter>>20, mo.Space.DBSizeMax>>20, mo.Space.Compactions)
			if journal != "" {
				if err := rollbackOfMigrate(ctx, o, res, v.bin, journal, common, c.bytes, settle, etcd); err != nil {
					return err
				}
			}
			if err := reseedStale(); err != nil {
				return err
			}
		}

		if err := outageRows(ctx, res, etcd, bin, o.baseline, dir, o.quota, len(stale), common, reseedStale, settle); err != nil {
			return err
		}
	}

	if o.profileDir != "" {
		if err := profileRuns(ctx, o, bin, common, reseedStale, settle); err != nil {
			return err
		}
	}

	if o.apiserver {
		if err := apiserverRuns(ctx, o, res, gen, etcd, newCfg, settle); err != nil {
			return err
		}
	}

	for _, m := range res.Measurements {
		m.finish()
	}
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	addRatios(res)
	printTable(os.Stdout, res)
	if o.jsonPath != "" {
		return writeResults(res, o.jsonPath)
	}
	return nil
}

func profileRuns(ctx context.Context, o options, bin string, common []string, reseed, settle func() error) error {
	if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
		return err
	}
	abs, _ := filepath.Abs(o.profileDir)
	// migrate as the rows above run it (its undo, no liveness watch), then
	// the engine alone (--no-undo), each from the same stale keyspace.
	for _, run := range []struct{ name, cmd string }{{"verify", "verify"}, {"migrate", "migrate"}, {"engine", "migrate"}} {
		if err := settle(); err != nil {
			return err
		}
		args := []string{run.cmd, "-o", "json", "--cpuprofile", filepath.Join(abs, run.name+".cpu.pprof"), "--memprofile", filepath.Join(abs, run.name+".mem.pprof")}
		if run.cmd == "migrate" {
			args = append(args, "--quota-backend-bytes", fmt.Sprint(o.quota), "--target-version", release.Linked(), "--allow-live-apiserver")
		}
		if run.name == "engine" {
			args = append(args, "--no-undo")
		}
		tr, err := runTool(ctx, bin, append(args, common...)...)
		if err != nil {
			return err
		}
		logf("profiled %s in %.2fs (exit %d): %s/%s.{cpu,mem}.pprof", run.name, tr.wall.Seconds(), tr.exit, abs, run.name)
		if run.name == "migrate" {
			if err := reseed(); err != nil {
				return err
			}
		}
	}
	return reseed()
}

func ratioOf(res *results, num, den string) float64 {
	a, b := res.get(num).ObjectsPerS.Median, res.get(den).ObjectsPerS.Median
	if b == 0 {
		return 0
	}
	return a / b
}

func addRatios(res *results) {
	add := func(name string, v, target float64, note string) {
		res.Ratios = append(res.Ratios, ratio{Name: name, Value: v, Target: target, Met: v >= target, Note: note})
	}
	add("verify / scan ceiling", ratioOf(res, mVerify, mScan), 0.5, "objects/s, medians; tool wall clock includes process start and setup")
	add("migrate / CAS ceiling", ratioOf(res, mMigrate, mCAS), 0.7, "objects/s, medians; tool wall clock includes process start and setup")
	if m := res.get(mMigrate); m.InRunObjPerS.Median > 0 {
		add("migrate in-run / CAS ceiling", m.InRunObjPerS.Median/res.get(mCAS).ObjectsPerS.Median, 0.7, "the tool's own duration (after setup)")
	}
	if len(res.get(mAPI).Samples) > 0 {
		add("migrate / apiserver", ratioOf(res, mMigrate, mAPI), 25, "objects/s, medians")
	}
	if len(res.get(mRollbackMigrate).Samples) > 0 {
		r := 0.0
		if m := res.get(mMigrate).RewritesPerS.Median; m > 0 {
			r = res.get(mRollbackMigrate).RewritesPerS.Median / m
		}
		add("rollback / migrate", r, 0.8, "keys restored/s against keys rewritten/s, medians, the same keys right after; both keep their undo (snapshot, journal), no liveness watch")
	}
	if m, c := res.get(mMigrate), res.get(mCAS); m.CPUMicros.Median > 0 && c.EtcdCPUMicros.Median > 0 {
		res.Ratios = append(res.Ratios, ratio{Name: "migrate CPU / etcd's in the ceiling", Value: m.CPUMicros.Median / c.EtcdCPUMicros.Median, Target: 1, Met: m.CPUMicros.Median <= c.EtcdCPUMicros.Median, AtMost: true,
			Note: fmt.Sprintf("CPU per object, medians, the machine's speed and cores aside: the tool's whole process %.0f µs (etcd beside it %.0f µs) against etcd's %.0f µs applying the CAS ceiling's rewrite of the same keys (its bare client %.0f µs)",
				m.CPUMicros.Median, m.EtcdCPUMicros.Median, c.EtcdCPUMicros.Median, c.CPUMicros.Median)})
	}
	peak := max(res.get(mMigrate).PeakPrivateMB.Max, res.get(mVerify).PeakPrivateMB.Max)
	rss := max(res.get(mMigrate).PeakRSSMB.Max, res.get(mVerify).PeakRSSMB.Max)
	res.Ratios = append(res.Ratios, ratio{Name: "tool peak private (MB, max of all runs)", Value: peak, Target: 150, Met: peak <= 150, AtMost: true,
		Note: fmt.Sprintf("private memory (RssAnon) of verify and migrate, the largest; their peak RSS (VmHWM) beside it: %.0f MB", rss)})
	if m, c := res.get(mMigrate), res.get(mCASTool); len(m.Samples) > 0 && len(c.Samples) > 0 {
		a, b := m.EtcdRSSMB.After.Median, c.EtcdRSSMB.After.Median
		res.Ratios = append(res.Ratios, ratio{Name: "etcd RSS MB after migrate (vs CAS@16)", Value: a, Target: math.Round(b), Met: a <= b,
			Note: "etcd's resident set after migrate, medians, against after the CAS ceiling at 16 puts per transaction"})
	}
	if rp := res.get(mReadPath); len(rp.Samples) > 0 {
		bound := "above both ceilings: etcd's, not kube-apiserver's read, is the lower bound here"
		if r := ratioOf(res, mReadPath, mCAS); r < 1 {
			bound = "below the CAS ceiling: no tool that reads each object as kube-apiserver does rewrites faster on these cores"
		}
		res.Notes = append(res.Notes, fmt.Sprintf("kube-apiserver's read path alone (decrypt and decode every object, both cores, no etcd) runs at %.2f of the CAS ceiling and %.2f of the scan ceiling, %s; migrate runs at %.2f of it, verify at %.2f",
			ratioOf(res, mReadPath, mCAS), ratioOf(res, mReadPath, mScan), bound, ratioOf(res, mMigrate, mReadPath), ratioOf(res, mVerify, mReadPath)))
	}
	outageRatios(res)
	if m, a := res.get(mMigrateWatched), res.get(mMigrate); m.CPUMicros.Median > 0 && a.CPUMicros.Median > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the liveness watch: migrate with it (a %s window) %.0f µs of the tool's CPU and %.0f µs of etcd's per object, without it (--allow-live-apiserver) %.0f and %.0f (medians)",
			watchedWindow, m.CPUMicros.Median, m.EtcdCPUMicros.Median, a.CPUMicros.Median, a.EtcdCPUMicros.Median))
	}
	res.Notes = append(res.Notes, baselineNotes(res, [][2]string{{mVerify, mVerifyBase}, {mMigrate, mMigrateBase}, {mMigrateWatched, mMigrateWatchedBase},
		{mMigrateDefault, mMigrateDefaultBase}, {mMigrateEngine, mMigrateEngineBase}})...)
}

// baselineNotes compares each pair's medians (the tool against the
// -baseline build), then drops the measurements never taken (get creates
// them).
func baselineNotes(res *results, pairs [][2]string) []string {
	var notes []string
	for _, p := range pairs {
		t, b := res.get(p[0]), res.get(p[1])
		if len(t.Samples) == 0 || len(b.Samples) == 0 || b.CPUMicros.Median == 0 {
			continue
		}
		notes = append(notes, fmt.Sprintf("%s against %s: %.2f × its objects/s, %.2f × its CPU per object (medians)",
			p[0], p[1], t.ObjectsPerS.Median/b.ObjectsPerS.Median, t.CPUMicros.Median/b.CPUMicros.Median))
	}
	var ms []*measurement
	for _, m := range res.Measurements {
		if len(m.Samples) > 0 {
			ms = append(ms, m)
		}
	}
	res.Measurements = ms
	return notes
}

// privateRatio judges a row's peak private memory (the largest of its
// samples, MB) against bound, its peak RSS (VmHWM) in the note.
func privateRatio(m *measurement, bound float64) ratio {
	v := m.PeakPrivateMB.Max
	return ratio{Name: "peak private MB, " + m.Name, Value: v, Target: bound, Met: v <= bound, AtMost: true,
		Note: fmt.Sprintf("private memory (RssAnon); peak RSS (VmHWM) beside it: %.0f MB", m.PeakRSSMB.Max)}
}

func rng(s stat, f string) string {
	return fmt.Sprintf(f+" ["+f+"–"+f+"]", s.Median, s.Min, s.Max)
}

func printTable(w *os.File, res *results) {
	fmt.Fprintf(w, "\nkube-etcd-migrate benchmark, %s dataset: N=%d (%d keys, %.1f MB of values), %d stale; %d CPUs %s; %d reps, median [min–max]\n",
		res.Dataset, res.N, res.Keys, float64(res.KeyspaceBytes)/1e6, res.StaleObjects, res.Machine.CPUs, res.Machine.CPU, res.Reps)
	fmt.Fprintf(w, "tool: page %d keys, CAS txn %d ops / %d KiB, %d writers (its defaults); CAS ceiling at its best: %d ops, %d in flight\n",
		res.PageSize, res.BatchOps, res.BatchBytes>>10, res.Writers, res.CeilingOps, res.CeilingWriters)
	if len(res.LoadAvg) > 0 {
		fmt.Fprintf(w, "load average (1, 5, 15 min) before / after: %s\n", strings.Join(res.LoadAvg, " / "))
	}
	if len(res.CASSweep) > 0 {
		fmt.Fprintf(w, "CAS ceiling sweep (objects/s, one run each):")
		for i, p := range res.CASSweep {
			if i%len(sweepWriters) == 0 {
				fmt.Fprintf(w, "\n  %3d puts/txn:", p.Ops)
			}
			fmt.Fprintf(w, "  %2d in flight %6.0f", p.Writers, p.ObjectsPerS)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-20s %-26s %-20s %-24s %-20s %-20s %-20s %-20s %-24s\n", "measurement", "objects/s", "MB/s", "rewrites/s", "peak private MB", "peak RSS MB (VmHWM)", "tool CPU µs/object", "etcd CPU µs/object", "etcd RSS MB before→after")
	for _, m := range res.Measurements {
		private, rss := "-", "-"
		if m.PeakPrivateMB.Median > 0 {
			private = rng(m.PeakPrivateMB, "%.0f")
		}
		if m.PeakRSSMB.Median > 0 {
			rss = rng(m.PeakRSSMB, "%.0f")
		}
		mb := "-"
		if m.MBPerS.Median > 0 {
			mb = rng(m.MBPerS, "%.1f")
		}
		rw := "-"
		if m.RewritesPerS.Median > 0 {
			rw = rng(m.RewritesPerS, "%.0f")
		}
		etcdRSS := "-" // no etcd child involved (a snapshot file)
		if m.EtcdRSSMB.Before.Median > 0 || m.EtcdRSSMB.After.Median > 0 {
			etcdRSS = fmt.Sprintf("%.0f→%.0f", m.EtcdRSSMB.Before.Median, m.EtcdRSSMB.After.Median)
		}
		cpu := "-"
		if m.CPUMicros.Median > 0 {
			cpu = rng(m.CPUMicros, "%.0f")
		}
		etcdCPU := "-"
		if m.EtcdCPUMicros.Median > 0 {
			etcdCPU = rng(m.EtcdCPUMicros, "%.0f")
		}
		fmt.Fprintf(w, "%-20s %-26s %-20s %-24s %-20s %-20s %-20s %-20s %s\n", m.Name, rng(m.ObjectsPerS, "%.0f"), mb, rw, private, rss, cpu, etcdCPU, etcdRSS)
		if m.DBSizeMB.Before.Median > 0 {
			fmt.Fprintf(w, "%-20s etcd database %.0f→%.0f MB, at most %.0f MB during the run (medians)\n", "  space", m.DBSizeMB.Before.Median, m.DBSizeMB.After.Median, m.DBSizeMB.Max.Median)
		}
		if m.InRunObjPerS.Median > 0 {
			fmt.Fprintf(w, "%-20s %-26s (the tool's own duration, without process start and setup)\n", "  in-run", rng(m.InRunObjPerS, "%.0f"))
		}
	}
	fmt.Fprintln(w)
	for _, r := range res.Ratios {
		verdict := "MET"
		if !r.Met {
			verdict = "NOT MET"
		}
		if r.High > 0 {
			fmt.Fprintf(w, "%-36s %8.2f   in %.2f–%.2f   %s\n", r.Name, r.Value, r.Low, r.High, verdict)
			continue
		}
		if r.Target == 0 { // no target: a figure reported beside the others
			fmt.Fprintf(w, "%-36s %8.2f   (reported)\n", r.Name, r.Value)
			continue
		}
		cmp := "≥"
		if r.AtMost || strings.Contains(r.Name, "RSS") {
			cmp = "≤"
		}
		fmt.Fprintf(w, "%-36s %8.2f   target %s %g   %s\n", r.Name, r.Value, cmp, r.Target, verdict)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// checkRotationVerdicts: on the rotation dataset every secret is stale for its
// key only (a no-op update through kube-apiserver would change nothing else,
// managedFields included).
func checkRotationVerdicts(dataset string, vo verifyOut) error {
	if dataset != "rotation" {
		return nil
	}
	for _, r := range vo.Resources {
		if r.Resource != "secrets" || r.Group != "" {
			continue
		}
		if len(r.StaleBy) != 1 || r.StaleBy["encryption"] != int(r.Stale) {
			return fmt.Errorf("rotation dataset: secrets stale by %v, want encryption only", r.StaleBy)
		}
	}
	return nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return ""
}
