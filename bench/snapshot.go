package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
)

const (
	mSnapCeiling     = "snapshot bare read"
	mSnapVerify      = "verify --snapshot"
	mSnapMigrate     = "migrate --snapshot"
	mSnapVerifyBase  = "verify --snap (base)"
	mSnapMigrateBase = "migrate --snap (base)"
	mSnapLiveVerify  = "verify (live etcd)"
	mSnapLiveMigrate = "migrate (live etcd)"
	mSnapRestore     = "restore (new etcd)"
)

// snapOptions are the snapshot phase's flags (-snapshot-n, -snapshot-reps,
// -snapshot-keep).
type snapOptions struct {
	n, reps int
	keep    string
	// restore: also restore about restoreObjects objects of the file into
	// an empty etcd (issue 56).
	restore bool
}

// restoreObjects is how many objects of the backup the restore row puts back
// (issue 56: 100,000 of a 1,000,000-object backup): whole namespaces of the
// built-in resources' objects, as many as hold about that many.
const restoreObjects = 100000

// The snapshot phase's expected cost per object on 2 shared cores, from the
// runs that set it (seeding, the bare read, the snapshot commands, the live
// ones): printed before the phase so that its length is no surprise.
const (
	estSeedPerObj = 80 * time.Microsecond // seed, settle, save
	// snapshotVerifyBoundMB is the peak private memory (RssAnon) a verify
	// of the backup file must stay under.
	snapshotVerifyBoundMB = 100
	estReadPerObj         = 150 * time.Microsecond // bare read, verify --snapshot-file, scan ceiling and verify on the live etcd
	estMigratePerObj      = 300 * time.Microsecond // migrate --snapshot-file --output-snapshot, migrate on the live etcd
	fileBytesPerObj       = 1840                   // the mixed dataset's snapshot file, per object
)

// snapshotPhase measures a backup of production size: a mixed keyspace of
// o.snap.n objects seeded into an etcd of its own and saved with etcd's
// snapshot code (etcdscan.Snapshot, what etcdctl snapshot save does), then, on
// that file and beside each other:
//
//   - the ceiling, a bare read of the same file by etcd's own code (etcdutl
//     snapshot status: bbolt's integrity check, then every record read,
//     decoded and hashed, in this process);
//   - verify --snapshot-file (the sha256 and bbolt checks, then the file read in
//     place: the scan's passes, decode and decisions, all within its wall
//     time);
//   - migrate --snapshot-file --output-snapshot (the file read in place, the
//     rewrites kept beside the output, the new file built from the input's
//     live records and them, then read afresh and verified);
//   - and, on the live etcd the file was saved from (the same data), the scan
//     ceiling, verify and, last (it changes the keyspace), migrate.
//
// With -baseline the baseline binary's verify --snapshot-file and migrate
// --snapshot-file are measured right after the tool's. Objects are the
// keyspace's keys. o.snap.reps repetitions (one is the default: at 1M keys
// a repetition takes minutes).
func snapshotPhase(ctx context.Context, o options, dir string) (*results, error) {
	n := o.snap.n
	res := &results{Dataset: "snapshot", N: n, StaleVersion: o.staleVersion, StaleKey: o.staleKey, Reps: o.snap.reps,
		PageSize: etcdscan.DefaultPageSize, BatchOps: etcdscan.DefaultMaxOps, BatchBytes: etcdscan.DefaultMaxBytes, Writers: toolWriters,
		CeilingOps: etcdscan.DefaultMaxOps, CeilingWriters: toolWriters, Date: time.Now().UTC().Format(time.RFC3339)}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	perRep := estReadPerObj + estMigratePerObj
	if o.baseline != "" {
		// The baseline's verify and migrate of the file too; a build from
		// before the private etcd's memory limit was lifted migrates 4x slower.
		perRep += estReadPerObj/2 + 2*estMigratePerObj
	}
	est := time.Duration(n) * (estSeedPerObj + time.Duration(o.snap.reps)*perRep)
	logf("snapshot phase: %d objects (a file of about %.2f GB), %d repetition(s); expect about %s on 2 shared cores (seeding %s, each repetition %s), and free disk for 6 copies of the file",
		n, float64(n)*fileBytesPerObj/1e9, o.snap.reps, est.Round(time.Second), (time.Duration(n) * estSeedPerObj).Round(time.Second),
		(time.Duration(n) * perRep).Round(time.Second))
	phase := time.Now()

	bin := o.tool
	s, err := seedOwnEtcd(ctx, o, dir, n, o.quota, res)
	if err != nil {
		return nil, err
	}
	defer s.etcd.Stop()
	etcd, gen, oldCfg, newCfg, stale := s.etcd, s.gen, s.oldCfg, s.newCfg, res.StaleObjects
	settle := func() error { return etcd.Quiet(ctx) }
	if err := settle(); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "bench-snapshot.db")
	t := time.Now()
	if err := etcdscan.Snapshot(ctx, etcd.cli, path); err != nil {
		return nil, fmt.Errorf("snapshot of the seeded etcd: %w", err)
	}
	defer os.Remove(path)
	if o.snap.keep != "" {
		if err := keepSnapshot(o.snap.keep, path, oldCfg, newCfg); err != nil {
			return nil, err
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	logf("  snapshot file: %.1f MB, saved in %.1fs", float64(fi.Size())/1e6, time.Since(t).Seconds())
	res.Notes = append(res.Notes, fmt.Sprintf("snapshot file %.1f MB (the mixed keyspace of %d objects, saved by etcd's snapshot code after compaction and defragmentation)", float64(fi.Size())/1e6, n))
	rel := release.Linked()
	common := []string{"--encryption-provider-config", newCfg}

	type measured struct{ bin, verify, migrate string }
	tools := []measured{{bin, mSnapVerify, mSnapMigrate}}
	if o.baseline != "" {
		tools = append(tools, measured{o.baseline, mSnapVerifyBase, mSnapMigrateBase})
	}
	step := func(name string, fn func() error) error {
		if err := settle(); err != nil {
			return err
		}
		t := time.Now()
		if err := fn(); err != nil {
			return err
		}
		logf("    (%s took %s)", name, time.Since(t).Round(100*time.Millisecond))
		return nil
	}
	for rep := 1; rep <= o.snap.reps; rep++ {
		logf("  snapshot repetition %d/%d", rep, o.snap.reps)
		err := step("bare read", func() error {
			start := time.Now()
			st, err := snapshot.NewV3(zap.NewNop()).Status(path)
			if err != nil {
				return fmt.Errorf("etcdutl snapshot status: %w", err)
			}
			elapsed := time.Since(start)
			res.Keys = int64(st.TotalKey)
			res.get(mSnapCeiling).Samples = append(res.get(mSnapCeiling).Samples, sample{Seconds: elapsed.Seconds(), Objects: int64(st.TotalKey), Bytes: fi.Size()})
			logf("  bare read: %d keys in %.2fs", st.TotalKey, elapsed.Seconds())
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, v := range tools {
			err := step(v.verify, func() error {
				return snapVerify(ctx, res, v.bin, v.verify, stale, fi.Size(), append([]string{"--snapshot-file", path}, common...))
			})
			if err != nil {
				return nil, err
			}
		}
		for _, v := range tools {
			err := step(v.migrate, func() error {
				out := filepath.Join(dir, "bench-snapshot-out.db")
				defer os.Remove(out)
				// The release the seeded keyspace is written for (a backup has
				// no kubeadm-config): migrate refuses to guess it.
				return snapMigrate(ctx, res, v.bin, v.migrate, stale, fi.Size(), append([]string{"--snapshot-file", path, "--output-snapshot", out, "--force", "--target-version", rel}, common...))
			})
			if err != nil {
				return nil, err
			}
		}
		live := append([]string{"--endpoints", etcd.URL}, common...)
		err = step("scan ceiling", func() error {
			c, err := scanCeiling(ctx, etcd.cli, etcdscan.DefaultPageSize)
			if err != nil {
				return fmt.Errorf("scan ceiling: %w", err)
			}
			res.KeyspaceBytes = c.bytes
			res.get(mScan).Samples = append(res.get(mScan).Samples, sample{Seconds: c.elapsed.Seconds(), Objects: c.keys, Bytes: c.bytes})
			logf("  scan ceiling (the live etcd): %d keys in %.2fs", c.keys, c.elapsed.Seconds())
			return nil
		})
		if err != nil {
			return nil, err
		}
		err = step("live verify", func() error {
			return snapVerify(ctx, res, bin, mSnapLiveVerify, stale, fi.Size(), live)
		})
		if err != nil {
			return nil, err
		}
		err = step("live migrate", func() error {
			return snapMigrate(ctx, res, bin, mSnapLiveMigrate, stale, fi.Size(), append([]string{"--target-version", rel, "--quota-backend-bytes", fmt.Sprint(o.quota), "--allow-live-apiserver"}, live...))
		})
		if err != nil {
			return nil, err
		}
		if o.snap.restore {
			err = step("restore", func() error {
				return snapRestore(ctx, o, res, bin, dir, path, fi.Size(), append([]string{"--target-version", rel}, common...))
			})
			if err != nil {
				return nil, err
			}
		}
		if rep < o.snap.reps {
			t := time.Now()
			n, err := gen.seed(ctx, etcd.cli, func(s objSpec) bool { return s.stale }, true)
			if err != nil {
				return nil, err
			}
			logf("  re-seeded the %d stale objects in %.1fs", n, time.Since(t).Seconds())
		}
	}
	for _, m := range res.Measurements {
		m.finish()
	}
	res.Notes = append(res.Notes, snapshotNotes(res)...)
	for _, m := range res.Measurements {
		if m.PeakPrivateMB.Max > 0 && strings.HasPrefix(m.Name, "verify") {
			// Issue 55: verify --snapshot-file of a 1,000,000-object backup
			// (BENCH_SNAPSHOT_N) within 100 MB of private memory.
			res.Ratios = append(res.Ratios, privateRatio(m, snapshotVerifyBoundMB))
		}
	}
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	logf("snapshot phase took %s", time.Since(phase).Round(time.Second))
	return res, nil
}

// phaseRun runs a phase (snapshot, scale) in a directory of its own, named
// after it, and writes its figures beside the datasets'
// (bench/results-NAME.json and .txt).
func phaseRun(ctx context.Context, o options, dir, name string, phase func(context.Context, options, string) (*results, error)) (*results, error) {
	pdir := filepath.Join(dir, name)
	if err := os.Mkdir(pdir, 0o700); err != nil {
		return nil, err
	}
	res, err := phase(ctx, o, pdir)
	if err != nil {
		return nil, err
	}
	printTable(os.Stdout, res)
	if o.jsonPath != "" {
		if err := writeResults(res, strings.TrimSuffix(o.jsonPath, ".json")+"-"+name+".json"); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// snapVerify runs verify with args and records it as row name.
func snapVerify(ctx context.Context, res *results, bin, name string, stale int, size int64, args []string) error {
	tr, err := runTool(ctx, bin, append([]string{"verify", "-o", "json", "--show-keys", "-1"}, args...)...)
	if err != nil {
		return err
	}
	var vo verifyOut
	if err := parseJSON(tr, &vo); err != nil {
		return err
	}
	if tr.exit != 3 || vo.Summary.Stale != int64(stale) || vo.Summary.Unreadable != 0 {
		return fmt.Errorf("%s: exit %d, %d stale, %d unreadable; want exit 3, %d stale; stderr: %s", name, tr.exit, vo.Summary.Stale, vo.Summary.Unreadable, stale, tail(tr.stderr))
	}
	res.get(name).Samples = append(res.get(name).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: vo.Summary.Objects + vo.Summary.NotObjects, Bytes: size, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB})
	logf("  %s: %d objects in %.2fs (CPU %.2fs), peak private %d MB, RSS %d MB", name, vo.Summary.Objects+vo.Summary.NotObjects, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
	return nil
}

// snapMigrate runs migrate with args and records it as row name.
func snapMigrate(ctx context.Context, res *results, bin, name string, stale int, size int64, args []string) error {
	tr, err := runTool(ctx, bin, append([]string{"migrate", "-o", "json"}, args...)...)
	if err != nil {
		return err
	}
	var mo migrateOut
	if err := parseJSON(tr, &mo); err != nil {
		return err
	}
	if tr.exit != 0 || mo.Summary.Rewritten != int64(stale) {
		return fmt.Errorf("%s: exit %d, rewrote %d, want %d; stderr: %s", name, tr.exit, mo.Summary.Rewritten, stale, tail(tr.stderr))
	}
	inRun, _ := time.ParseDuration(mo.Duration)
	res.get(name).Samples = append(res.get(name).Samples, sample{Seconds: tr.wall.Seconds(), InRunSeconds: inRun.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: mo.Summary.Scanned, Bytes: size, Rewrites: mo.Summary.Rewritten, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB})
	logf("  %s: %d scanned, %d rewritten in %.2fs (in-run %s, CPU %.2fs), peak private %d MB, RSS %d MB", name, mo.Summary.Scanned, mo.Summary.Rewritten, tr.wall.Seconds(), mo.Duration, tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
	return nil
}

// snapRestore restores whole namespaces of the backup at path (secrets,
// configmaps, deployments and pods: about restoreObjects objects) into an
// etcd of its own, empty, at the tool's defaults (its undo, the liveness
// window), and records it as a row: each object created, none failed.
func snapRestore(ctx context.Context, o options, res *results, bin, dir, path string, size int64, common []string) error {
	rdir := filepath.Join(dir, "restore")
	if err := os.Mkdir(rdir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(rdir)
	e, err := startEtcd(filepath.Join(rdir, "etcd"), o.quota)
	if err != nil {
		return err
	}
	defer e.Stop()
	// The mixed dataset's secrets, configmaps, pods and deployments are 75 %
	// of its objects, spread over its namespaces.
	perNS := max(o.snap.n*75/100/namespaces, 1)
	k := min(max((restoreObjects+perNS-1)/perNS, 1), namespaces)
	args := []string{"restore", "-o", "json", "--endpoints", e.URL, "--snapshot-file", path, "--state-dir", filepath.Join(rdir, "state"),
		"--resource", "secrets", "--resource", "configmaps", "--resource", "deployments.apps", "--resource", "pods"}
	for i := range k {
		args = append(args, "--namespace", fmt.Sprintf("bench-%02d", i))
	}
	tr, err := runTool(ctx, bin, append(args, common...)...)
	if err != nil {
		return err
	}
	var ro struct{ Create, Written, Failed, Conflicts int64 }
	if err := parseJSON(tr, &ro); err != nil {
		return err
	}
	if tr.exit != 0 || ro.Create == 0 || ro.Written != ro.Create || ro.Failed+ro.Conflicts != 0 {
		return fmt.Errorf("%s: exit %d, %d to create, %d written, %d failed, %d conflicts; stderr: %s", mSnapRestore, tr.exit, ro.Create, ro.Written, ro.Failed, ro.Conflicts, tail(tr.stderr))
	}
	res.get(mSnapRestore).Samples = append(res.get(mSnapRestore).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: ro.Written, Bytes: size, Rewrites: ro.Written, PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB})
	logf("  %s: %d namespace(s), %d objects created in %.2fs (CPU %.2fs), peak private %d MB, RSS %d MB", mSnapRestore, k, ro.Written, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
	return nil
}

// snapshotNotes compare the snapshot commands with their ceilings: verify
// --snapshot-file with the bare read and with verify on the live etcd,
// migrate --output-snapshot with migrate on the live etcd.
func snapshotNotes(res *results) []string {
	var notes []string
	ratio1 := func(name string, num, den string, target float64) {
		a, b := res.get(num), res.get(den)
		if len(a.Samples) == 0 || len(b.Samples) == 0 || b.ObjectsPerS.Median == 0 {
			return
		}
		v := a.ObjectsPerS.Median / b.ObjectsPerS.Median
		if target > 0 {
			res.Ratios = append(res.Ratios, ratio{Name: name, Value: v, Target: target, Met: v >= target, Note: "objects/s, medians"})
		}
		if a.CPUMicros.Median > 0 && b.CPUMicros.Median > 0 {
			notes = append(notes, fmt.Sprintf("%s: %.2f × the objects/s, %.2f × the CPU per object (%.0f µs against %.0f)", name, v, a.CPUMicros.Median/b.CPUMicros.Median, a.CPUMicros.Median, b.CPUMicros.Median))
		}
	}
	ratio1("verify --snapshot / bare read", mSnapVerify, mSnapCeiling, 0.5)
	ratio1("verify --snapshot / live verify", mSnapVerify, mSnapLiveVerify, 0)
	ratio1("migrate --snapshot / live migrate", mSnapMigrate, mSnapLiveMigrate, 0.5)
	return append(notes, baselineNotes(res, [][2]string{{mSnapVerify, mSnapVerifyBase}, {mSnapMigrate, mSnapMigrateBase}})...)
}

// keepSnapshot copies the snapshot file and the encryption configurations into
// dir (-snapshot-keep), to profile the commands on them by hand.
func keepSnapshot(dir string, files ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		in, err := os.Open(f)
		if err != nil {
			return err
		}
		out, err := os.OpenFile(filepath.Join(dir, filepath.Base(f)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = io.Copy(out, in)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
		}
		in.Close()
		if err != nil {
			return err
		}
	}
	logf("  kept the snapshot file and the encryption configurations in %s", dir)
	return nil
}

// writeResults writes res as JSON to path and its table to the .txt beside it.
func writeResults(res *results, path string) error {
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	txt := strings.TrimSuffix(path, ".json") + ".txt"
	f, err := os.Create(txt)
	if err != nil {
		return err
	}
	printTable(f, res)
	if err := f.Close(); err != nil {
		return err
	}
	logf("figures written to %s and %s", path, txt)
	return nil
}

// seeded is an etcd of a phase's own with the mixed objects in it.
type seeded struct {
	etcd           *etcdProc
	gen            *generator
	oldCfg, newCfg string
	objects        int
}

// seedOwnEtcd starts an etcd of its own in dir with quota and seeds n mixed
// objects into it (the fixed ones included), with the seeding time and the
// stale count in res. The caller stops the etcd.
func seedOwnEtcd(ctx context.Context, o options, dir string, n int, quota int64, res *results) (*seeded, error) {
	oldCfg, newCfg, err := writeEncryptionConfigs(dir)
	if err != nil {
		return nil, err
	}
	etcd, err := startEtcd(filepath.Join(dir, "etcd"), quota)
	if err != nil {
		return nil, err
	}
	s := &seeded{etcd: etcd, oldCfg: oldCfg, newCfg: newCfg}
	if s.gen, err = newGenerator(ctx, n, o.staleVersion, o.staleKey, oldCfg, newCfg, false); err == nil {
		err = s.gen.grantLeases(ctx, etcd.cli)
	}
	start := time.Now()
	if err == nil {
		s.objects, err = s.gen.seed(ctx, etcd.cli, func(objSpec) bool { return true }, true)
	}
	if err != nil {
		etcd.Stop()
		return nil, err
	}
	res.SeedSeconds = time.Since(start).Seconds()
	res.StaleObjects = len(s.gen.staleKeys())
	logf("  seeded %d objects in %.1fs (%.0f objects/s); %d stale", s.objects, res.SeedSeconds, float64(s.objects)/res.SeedSeconds, res.StaleObjects)
	return s, nil
}
