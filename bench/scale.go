package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"kube-etcd-migrate/etcdscan"
)

const (
	mScaleN  = "verify --snapshot N"
	mScale4N = "verify --snapshot 4N"
	// With -baseline: the baseline build's reads of the same files.
	mScaleBaseN  = "verify --snap N (base)"
	mScaleBase4N = "verify --snap 4N (base)"
	// scaleTimeTarget is the most the 4N file may take against the N one
	// (wall time, medians): linear, with room for the disk cache.
	scaleTimeTarget = 4.5
	scaleMemTarget  = 150 // MB of private memory (peak RssAnon), at either size
)

// scaleOptions are the scale phase's flags (-scale, -scale-n, -scale-reps).
type scaleOptions struct {
	on      bool
	n, reps int
}

// scalePhase measures how verify --snapshot-file grows with the file: the
// mixed keyspace's first o.scale.n objects seeded into an etcd of its own and
// saved (file N), then the other 3 × o.scale.n seeded into the same etcd and
// saved again (file 4N); then, in each repetition, verify --snapshot-file on
// file N and on file 4N, one after the other, each after a settle. The ratio
// of their wall times (medians) is checked against scaleTimeTarget, the peak
// private memory of each against scaleMemTarget. With -baseline the baseline binary's
// reads follow the tool's in each repetition, and its ratio is printed too.
func scalePhase(ctx context.Context, o options, dir string) (*results, error) {
	n := o.scale.n
	res := &results{Dataset: "snapshot-scale", N: n, StaleVersion: o.staleVersion, StaleKey: o.staleKey, Reps: o.scale.reps,
		PageSize: etcdscan.DefaultPageSize, BatchOps: etcdscan.DefaultMaxOps, BatchBytes: etcdscan.DefaultMaxBytes, Writers: toolWriters,
		Date: time.Now().UTC().Format(time.RFC3339)}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	est := time.Duration(4*n)*estSeedPerObj + time.Duration(5*n*o.scale.reps)*estReadPerObj
	logf("scale phase: snapshot files of %d and %d objects (about %.2f and %.2f GB), %d repetition(s); expect about %s on 2 shared cores, and free disk for the etcd's data and both files (about %.1f GB)",
		n, 4*n, float64(n)*fileBytesPerObj/1e9, float64(4*n)*fileBytesPerObj/1e9, o.scale.reps, est.Round(time.Second), float64(10*n)*fileBytesPerObj/1e9)
	phase := time.Now()

	oldCfg, newCfg, err := writeEncryptionConfigs(dir)
	if err != nil {
		return nil, err
	}
	quota := max(o.quota, int64(float64(8*n)*fileBytesPerObj))
	etcd, err := startEtcd(filepath.Join(dir, "etcd"), quota)
	if err != nil {
		return nil, err
	}
	defer etcd.Stop()
	gen, err := newGenerator(ctx, 4*n, o.staleVersion, o.staleKey, oldCfg, newCfg, false)
	if err != nil {
		return nil, err
	}
	if err := gen.grantLeases(ctx, etcd.cli); err != nil {
		return nil, err
	}
	settle := func() error { return etcd.Quiet(ctx) }
	type file struct {
		name  string
		path  string
		stale int
		size  int64
	}
	var files []file
	for _, part := range []struct {
		name   string
		fixed  bool
		want   func(objSpec) bool
		stales func(objSpec) bool
	}{
		{mScaleN, true, func(s objSpec) bool { return s.i < n }, func(s objSpec) bool { return s.stale && s.i < n }},
		{mScale4N, false, func(s objSpec) bool { return s.i >= n }, func(s objSpec) bool { return s.stale }},
	} {
		start := time.Now()
		seeded, err := gen.seed(ctx, etcd.cli, part.want, part.fixed)
		if err != nil {
			return nil, err
		}
		logf("  seeded %d objects in %.1fs", seeded, time.Since(start).Seconds())
		if err := settle(); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, fmt.Sprintf("scale-%d.db", len(files)))
		if err := etcdscan.Snapshot(ctx, etcd.cli, path); err != nil {
			return nil, fmt.Errorf("snapshot of the seeded etcd: %w", err)
		}
		defer os.Remove(path)
		fi, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		stale := 0
		for i := 0; i < 4*n; i++ {
			if part.stales(gen.spec(i)) {
				stale++
			}
		}
		files = append(files, file{part.name, path, stale, fi.Size()})
		logf("  %s: snapshot file %.1f MB, %d stale", part.name, float64(fi.Size())/1e6, stale)
		res.Notes = append(res.Notes, fmt.Sprintf("%s: snapshot file %.1f MB", part.name, float64(fi.Size())/1e6))
	}
	res.StaleObjects = files[1].stale
	// The binaries run from copies: a freshly linked executable is mapped
	// partly with 2 MB pages, each resident whole, which adds up to 20 MB to
	// its RSS beside a copy of it (docs/benchmarks.md); a copy is how an
	// installed binary sits in the page cache, and both are measured alike.
	tool, baseline := filepath.Join(dir, "tool"), ""
	if err := copyFile(o.tool, tool); err != nil {
		return nil, err
	}
	if o.baseline != "" {
		baseline = filepath.Join(dir, "baseline")
		if err := copyFile(o.baseline, baseline); err != nil {
			return nil, err
		}
	}
	common := []string{"--encryption-provider-config", newCfg}
	for rep := 1; rep <= o.scale.reps; rep++ {
		logf("  scale repetition %d/%d", rep, o.scale.reps)
		for _, f := range files {
			if err := settle(); err != nil {
				return nil, err
			}
			if err := snapVerify(ctx, res, tool, f.name, f.stale, f.size, append([]string{"--snapshot-file", f.path}, common...)); err != nil {
				return nil, err
			}
		}
		if o.baseline == "" {
			continue
		}
		for i, f := range files {
			if err := settle(); err != nil {
				return nil, err
			}
			if err := snapVerify(ctx, res, baseline, []string{mScaleBaseN, mScaleBase4N}[i], f.stale, f.size, append([]string{"--snapshot-file", f.path}, common...)); err != nil {
				return nil, err
			}
		}
	}
	for _, m := range res.Measurements {
		m.finish()
	}
	if s := res.get(mScale4N).Samples; len(s) > 0 {
		res.Keys = s[0].Objects // the larger file's
	}
	rows := [][2]string{{mScaleN, mScale4N}}
	if o.baseline != "" {
		rows = append(rows, [2]string{mScaleBaseN, mScaleBase4N})
	}
	for i, row := range rows {
		a, b := res.get(row[0]), res.get(row[1])
		name := "verify --snapshot"
		if i > 0 {
			name = "verify --snap (base)"
		}
		if ta, tb := medianSeconds(a), medianSeconds(b); ta > 0 {
			v := tb / ta
			res.Ratios = append(res.Ratios, ratio{Name: "time 4N / time N, " + name, Value: v, Target: scaleTimeTarget, Met: v <= scaleTimeTarget, AtMost: true,
				Note: "wall time, medians"})
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %.2fs for N, %.2fs for 4N (%.2f ×); CPU %.0f and %.0f µs an object", name, ta, tb, v, a.CPUMicros.Median, b.CPUMicros.Median))
		}
		for _, m := range []*measurement{a, b} {
			res.Ratios = append(res.Ratios, privateRatio(m, scaleMemTarget))
		}
	}
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	logf("scale phase took %s", time.Since(phase).Round(time.Second))
	return res, nil
}

// copyFile copies from to to, private to its owner (mode 0700: an
// executable runs, a database or configuration is no one else's).
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func medianSeconds(m *measurement) float64 {
	var xs []float64
	for _, s := range m.Samples {
		xs = append(xs, s.Seconds)
	}
	return statOf(xs).Median
}
