package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/release"
)

// The outage rows of each dataset (issue 40): what an operator's migrate at
// its default flags takes (the liveness window, the undo's snapshot and
// journal), beside its floor — the longer of the window and etcd's own
// snapshot save, then etcd's own CAS rewrite of the same keys (the ceiling
// at its best settings) — and beside the range plan gave for it just
// before; and the engine alone (no undo, no watch) against the ceiling.
const (
	mSnapshot       = "snapshot save"
	mPlan           = "plan"
	mMigrateDefault = "migrate (defaults)"
	mMigrateEngine  = "migrate (engine)"
	// -baseline: the same two rows of the other build, right after the tool's.
	mMigrateDefaultBase = "migrate (defaults, baseline)"
	mMigrateEngineBase  = "migrate (engine, baseline)"

	// floorTarget is the most the default run may take against its floor.
	floorTarget = 1.15
	// engineTarget is the least the engine's rate may be against the ceiling's.
	engineTarget = 0.7
)

// planOut is what the benchmark reads of plan's report: its estimate.
type planOut struct {
	Estimate planEstimate `json:"estimate"`
	Blockers []struct {
		Check, Problem string
	} `json:"blockers"`
}

type planEstimate struct {
	Seconds float64 `json:"seconds"`
	Low     float64 `json:"low"`
	High    float64 `json:"high"`
	Basis   string  `json:"basis"`
	Parts   []struct {
		Name  string  `json:"name"`
		Low   float64 `json:"low"`
		High  float64 `json:"high"`
		Basis string  `json:"basis"`
	} `json:"parts"`
}

// parts is the estimate's parts on one line.
func (e planEstimate) parts() string {
	var b []string
	for _, p := range e.Parts {
		b = append(b, fmt.Sprintf("%s %.1f–%.1f", p.Name, p.Low, p.High))
	}
	return strings.Join(b, ", ")
}

// logParts logs each part of plan's estimate with what it is made of.
func (e planEstimate) logParts() {
	for _, p := range e.Parts {
		logf("    %s %.1f–%.1fs: %s", p.Name, p.Low, p.High, p.Basis)
	}
}

// rangeRatio is plan's range against the run measured: met when the run
// landed inside it.
// runPlan runs plan -o json with args: its run and its answer; an exit
// but 0 is an error with the blockers it names.
func runPlan(ctx context.Context, bin string, args ...string) (toolRun, planOut, error) {
	var po planOut
	tr, err := runTool(ctx, bin, append([]string{"plan", "-o", "json"}, args...)...)
	if err != nil {
		return tr, po, err
	}
	if err := parseJSON(tr, &po); err != nil {
		return tr, po, err
	}
	if tr.exit != 0 {
		return tr, po, fmt.Errorf("plan: exit %d, blockers %+v; stderr: %s", tr.exit, po.Blockers, tail(tr.stderr))
	}
	return tr, po, nil
}

func rangeRatio(name string, measured, low, high float64, note string) ratio {
	return ratio{Name: name, Value: measured, Low: low, High: high, Met: low <= measured && measured <= high, Note: note}
}

// outageRows runs, once in a repetition of a dataset: etcd's snapshot save,
// plan (with the flags of the default migrate), migrate at its default
// flags, and the engine (--no-undo --allow-live-apiserver), each run that
// writes followed by reseed; with a baseline binary, each of the two
// migrate rows of the baseline right after the tool's.
func outageRows(ctx context.Context, res *results, etcd *etcdProc, bin, baseline, dir string, quota int64, stale int, common []string, reseed, settle func() error) error {
	// etcd's own snapshot save, as the undo takes it.
	if err := settle(); err != nil {
		return err
	}
	path := filepath.Join(dir, "bench-snapshot.db")
	start := time.Now()
	if err := etcdscan.Snapshot(ctx, etcd.cli, path); err != nil {
		return fmt.Errorf("snapshot save: %w", err)
	}
	el := time.Since(start)
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	os.Remove(path)
	res.get(mSnapshot).Samples = append(res.get(mSnapshot).Samples, sample{Seconds: el.Seconds(), Objects: res.Keys, Bytes: fi.Size()})
	logf("  %s: %.1f MB in %.2fs", mSnapshot, float64(fi.Size())/1e6, el.Seconds())

	write := []string{"--quota-backend-bytes", fmt.Sprint(quota), "--target-version", release.Linked()}
	// plan, as before the window: its range for the default run.
	if err := settle(); err != nil {
		return err
	}
	cpu0 := etcd.CPU()
	tr, po, err := runPlan(ctx, bin, slices.Concat(write, common)...)
	if err != nil {
		return err
	}
	res.get(mPlan).Samples = append(res.get(mPlan).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: res.Keys, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB,
		EstimateLow: po.Estimate.Low, EstimateHigh: po.Estimate.High})
	logf("  %s: %.2fs (CPU %.2fs, etcd CPU %.2fs); its estimate of migrate %.1f–%.1fs (%s)", mPlan, tr.wall.Seconds(), tr.cpu.Seconds(), (etcd.CPU() - cpu0).Seconds(), po.Estimate.Low, po.Estimate.High, po.Estimate.parts())
	po.Estimate.logParts()

	type run struct {
		name, bin string
		flags     []string
	}
	engine := []string{"--no-undo", "--allow-live-apiserver"}
	rows := []run{{mMigrateDefault, bin, nil}, {mMigrateEngine, bin, engine}}
	if baseline != "" {
		rows = []run{{mMigrateDefault, bin, nil}, {mMigrateDefaultBase, baseline, nil}, {mMigrateEngine, bin, engine}, {mMigrateEngineBase, baseline, engine}}
	}
	for _, row := range rows {
		if err := settle(); err != nil {
			return err
		}
		cpu0, m0 := etcd.CPU(), etcd.metrics(ctx)
		tr, err := runTool(ctx, row.bin, append(append(append([]string{"migrate", "-o", "json"}, write...), row.flags...), common...)...)
		if err != nil {
			return err
		}
		var mo migrateOut
		if err := parseJSON(tr, &mo); err != nil {
			return err
		}
		if tr.exit != 0 || mo.Summary.Rewritten != int64(stale) {
			return fmt.Errorf("%s: exit %d, rewrote %d, want %d; stderr: %s", row.name, tr.exit, mo.Summary.Rewritten, stale, tail(tr.stderr))
		}
		inRun, _ := time.ParseDuration(mo.Duration)
		etcdCPU := etcd.CPU() - cpu0
		res.get(row.name).Samples = append(res.get(row.name).Samples, sample{Seconds: tr.wall.Seconds(), InRunSeconds: inRun.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: mo.Summary.Scanned,
			Rewrites: mo.Summary.Rewritten, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, EtcdCPUSeconds: etcdCPU.Seconds(), DiskKB: tr.stateBytes >> 10})
		logf("  %s: %d scanned, %d rewritten in %.2fs (in-run %s, CPU %.2fs, etcd CPU %.2fs), peak private %d MB, RSS %d MB; etcd: %s", row.name, mo.Summary.Scanned, mo.Summary.Rewritten, tr.wall.Seconds(), mo.Duration, tr.cpu.Seconds(), etcdCPU.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024, etcdCosts(m0, etcd.metrics(ctx)))
		if err := reseed(); err != nil {
			return err
		}
	}
	return nil
}

// outageRatios adds, per dataset: the default run against its floor, the
// engine against the ceiling, and whether plan's range held the default run.
func outageRatios(res *results) {
	def, snap, cas := res.get(mMigrateDefault), res.get(mSnapshot), res.get(mCAS)
	if len(def.Samples) == 0 || len(snap.Samples) == 0 || len(cas.Samples) == 0 {
		return
	}
	window := liveness.DefaultWindow.Seconds()
	floor := max(window, medianSeconds(snap)) + medianSeconds(cas)
	measured := medianSeconds(def)
	res.Floor = &floorOf{Window: window, Snapshot: medianSeconds(snap), Ceiling: medianSeconds(cas), Seconds: floor, Default: measured}
	res.Ratios = append(res.Ratios, ratio{Name: "migrate (defaults) / its floor", Value: measured / floor, Target: floorTarget, Met: measured/floor <= floorTarget, AtMost: true,
		Note: fmt.Sprintf("wall time, medians: %.2fs against max(window %.0fs, snapshot save %.2fs) + the CAS ceiling's rewrite %.2fs = %.2fs", measured, window, medianSeconds(snap), medianSeconds(cas), floor)})
	if eng := res.get(mMigrateEngine); len(eng.Samples) > 0 {
		v := ratioOf(res, mMigrateEngine, mCAS)
		res.Ratios = append(res.Ratios, ratio{Name: "engine / CAS ceiling", Value: v, Target: engineTarget, Met: v >= engineTarget,
			Note: "migrate --no-undo --allow-live-apiserver, objects/s, medians, whole process"})
		// Issue 58's measure: the whole process without its undo or watch,
		// CPU per object against etcd's applying the ceiling's rewrite.
		if c := cas.EtcdCPUMicros.Median; eng.CPUMicros.Median > 0 && c > 0 {
			res.Ratios = append(res.Ratios, ratio{Name: "engine CPU / etcd's in the ceiling", Value: eng.CPUMicros.Median / c, Target: 1, Met: eng.CPUMicros.Median <= c, AtMost: true,
				Note: fmt.Sprintf("CPU per object, medians: migrate --no-undo --allow-live-apiserver's whole process %.0f µs (etcd beside it %.0f µs) against etcd's %.0f µs applying the CAS ceiling's rewrite of the same keys", eng.CPUMicros.Median, eng.EtcdCPUMicros.Median, c)})
		}
	}
	if p := res.get(mPlan); len(p.Samples) > 0 {
		// Each repetition's default run against the range plan gave just before it.
		for i, s := range p.Samples {
			if i >= len(def.Samples) {
				break
			}
			res.Ratios = append(res.Ratios, rangeRatio(fmt.Sprintf("plan's range holds migrate (defaults), rep %d", i+1), def.Samples[i].Seconds, s.EstimateLow, s.EstimateHigh, "seconds"))
		}
	}
}

// floorOf is a dataset's outage against its floor (seconds, medians).
type floorOf struct {
	Window   float64 `json:"window"`
	Snapshot float64 `json:"snapshotSave"`
	Ceiling  float64 `json:"ceilingRewrite"`
	Seconds  float64 `json:"floor"`
	Default  float64 `json:"migrateDefaults"`
}

// CPU is the etcd child's CPU time so far (user and system, /proc/PID/stat).
func (e *etcdProc) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100

// etcdMetrics is the bench etcd's own metrics (nil when they do not answer).
func (e *etcdProc) metrics(ctx context.Context) *etcdscan.MemberMetrics {
	ms, err := etcdscan.Metrics(ctx, e.cli)
	if err != nil || len(ms) == 0 {
		return nil
	}
	return &ms[0]
}

// etcdCosts says what etcd's metrics counted between a and b: writes and
// the apply time per write, WAL fsyncs, backend commits, compactions.
func etcdCosts(a, b *etcdscan.MemberMetrics) string {
	if a == nil || b == nil {
		return "etcd's metrics did not answer"
	}
	d := func(x, y etcdscan.Histogram) (uint64, float64) { return y.Count - x.Count, y.Sum - x.Sum }
	writes := b.Writes - a.Writes
	an, as := d(a.Apply, b.Apply)
	fn, fs := d(a.WALFsync, b.WALFsync)
	cn, cs := d(a.BackendCommit, b.BackendCommit)
	kn, ks := d(a.Compaction, b.Compaction)
	per := func(sum float64, n int64) float64 {
		if n == 0 {
			return 0
		}
		return sum / float64(n) * 1e6
	}
	return fmt.Sprintf("%d writes in %d applies (%.1f µs a write), %d WAL fsyncs (%.2f ms each, %.1f writes each), %d backend commits (%.1f ms each), %d compactions (%.1f s)",
		writes, an, per(as, writes), fn, per(fs, int64(fn))/1e3, float64(writes)/float64(max(fn, 1)), cn, per(cs, int64(cn))/1e3, kn, ks)
}
