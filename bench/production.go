package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/rollback"
)

// The production phase (-dataset production; make bench-production): the size
// at which disaster recovery happens. -production-n mixed objects (4,000,000
// fill etcd's largest quota, 8 GiB) are seeded into an etcd of their own
// with that quota and saved as its backup; then, in the order of an
// operator's night: plan (its estimate kept), verify, migrate
// --compact-history with a journal (the estimate beside the time measured),
// rollback of that whole journal and the compaction-matched ceiling, all but
// verify -production-reps times (rounds: each migrate beside its own
// ceiling, its median ratio judged), and on the backup verify --snapshot-file and
// migrate --snapshot-file --output-snapshot, whose output is restored by
// etcd's own restore code and read again by verify. Each row has objects/s,
// CPU per object, peak private memory against its bound (peak RSS beside it),
// and the disk the run used.
const (
	mProdPlan     = "plan"
	mProdVerify   = "verify"
	mProdMigrate  = "migrate --compact-history"
	mProdRollback = "rollback (whole journal)"
	// mProdCeiling is the compaction-matched ceiling (compactingCeiling):
	// etcd's own CAS rewrite of the same keys with the same compactions.
	mProdCeiling     = "CAS ceiling, compacting"
	mProdSnapVerify  = "verify --snapshot-file"
	mProdSnapMigrate = "migrate --output-snapshot"

	// defaultProductionQuota is etcd's largest recommended --quota-backend-bytes.
	defaultProductionQuota = 8 << 30
	// Peak private memory bounds (MB, RssAnon): verify, migrate and rollback
	// of the live etcd and verify --snapshot-file of its backup (issue 55);
	// plan's, and the output snapshot's (issue 28).
	prodPrivateBound = 100
	prodPlanBound    = 150
	prodOutputBound  = 300
	// prodOutputRate is the least an output snapshot may go at against a live
	// migrate of the same data (objects/s).
	prodOutputRate = 0.8
)

func productionPhase(ctx context.Context, o options, dir string) (*results, error) {
	n, productionQuota := o.productionN, o.productionQuota
	res := &results{Dataset: "production", N: n, StaleVersion: o.staleVersion, StaleKey: o.staleKey, Reps: o.productionReps,
		PageSize: etcdscan.DefaultPageSize, BatchOps: etcdscan.DefaultMaxOps, BatchBytes: etcdscan.DefaultMaxBytes, Writers: toolWriters,
		Date: time.Now().UTC().Format(time.RFC3339)}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	gb := float64(n) * fileBytesPerObj / 1e9
	logf("production phase: %d mixed objects (a backup of about %.1f GB) in an etcd with a %s quota; expect about %s on 2 shared cores and about %.0f GB of free disk (etcd, its backup, the undo's snapshot, the output and its restore)",
		n, gb, quotaText(productionQuota), (time.Duration(n) * (estSeedPerObj + time.Duration(2+4*o.productionReps)*estReadPerObj)).Round(time.Second), 6*gb)
	phase := time.Now()

	sd, err := seedOwnEtcd(ctx, o, dir, n, productionQuota, res)
	if err != nil {
		return nil, err
	}
	defer sd.etcd.Stop()
	etcd, newCfg, seeded, stale := sd.etcd, sd.newCfg, sd.objects, res.StaleObjects
	settle := func() (int64, error) {
		db, err := etcd.Settle(ctx)
		runtime.GC()
		time.Sleep(500 * time.Millisecond)
		return db, err
	}
	db, err := settle()
	if err != nil {
		return nil, err
	}
	logf("  etcd's database %.1f GB of the %s quota", float64(db)/1e9, quotaText(productionQuota))
	res.Notes = append(res.Notes, fmt.Sprintf("etcd's database after seeding: %.2f GB of its %s quota (%.0f%%)", float64(db)/1e9, quotaText(productionQuota), 100*float64(db)/float64(productionQuota)))

	backup := filepath.Join(dir, "backup.db")
	snapStart := time.Now()
	if err := etcdscan.Snapshot(ctx, etcd.cli, backup); err != nil {
		return nil, fmt.Errorf("backup of the seeded etcd: %w", err)
	}
	snapTook := time.Since(snapStart)
	defer os.Remove(backup)
	in, err := os.Stat(backup)
	if err != nil {
		return nil, err
	}
	logf("  backup %s: %.1f MB", backup, float64(in.Size())/1e6)
	res.Notes = append(res.Notes, fmt.Sprintf("backup: %.1f MB", float64(in.Size())/1e6))

	tool := filepath.Join(dir, "tool") // a copy, as an installed binary sits (scale.go)
	if err := copyFile(o.tool, tool); err != nil {
		return nil, err
	}
	rel := release.Linked()
	live := []string{"--endpoints", etcd.URL, "--encryption-provider-config", newCfg}
	write := []string{"--target-version", rel, "--quota-backend-bytes", fmt.Sprint(productionQuota), "--compact-history", "--liveness-window", "1s"}

	// The rounds: plan, migrate --compact-history, the rollback of its whole
	// journal (which makes the keys stale again) and the compaction-matched
	// ceiling (which rewrites them as they are: still stale), -production-reps
	// times, the tool's run and its ceiling's interleaved; verify once, in
	// the first, after plan.
	var rounds []prodRound
	for rep := 1; rep <= o.productionReps; rep++ {
		if o.productionReps > 1 {
			logf("  round %d/%d", rep, o.productionReps)
		}
		rd, err := productionRound(ctx, o, res, dir, etcd, sd, tool, in.Size(), rep, settle, live, write)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", rep, err)
		}
		rounds = append(rounds, rd)
	}
	prodRatios(res, rounds, snapTook)

	// The ceiling's last compaction goes on in etcd after it, as a run's
	// does: let it end before the rows that share the cores.
	if _, err := settle(); err != nil {
		return nil, err
	}

	// The backup: verify it, then re-encrypt it into a new one.
	var vo verifyOut
	var mo migrateOut
	tr, err := runTool(ctx, tool, "verify", "-o", "json", "--show-keys", "-1", "--snapshot-file", backup, "--encryption-provider-config", newCfg)
	if err != nil {
		return nil, err
	}
	if err := parseJSON(tr, &vo); err != nil {
		return nil, err
	}
	if tr.exit != 3 || vo.Summary.Stale != int64(stale) || vo.Summary.Unreadable != 0 {
		return nil, fmt.Errorf("verify --snapshot-file: exit %d, %d stale, %d unreadable; want exit 3, %d stale; stderr: %s", tr.exit, vo.Summary.Stale, vo.Summary.Unreadable, stale, tail(tr.stderr))
	}
	record(res, mProdSnapVerify, tr, vo.Summary.Objects+vo.Summary.NotObjects, in.Size(), 0, 0)
	backupObjects := vo.Summary.Objects

	out := filepath.Join(dir, "backup-rotated.db")
	defer os.Remove(out)
	tr, err = runTool(ctx, tool, "migrate", "-o", "json", "--snapshot-file", backup, "--output-snapshot", out, "--target-version", rel, "--encryption-provider-config", newCfg)
	if err != nil {
		return nil, err
	}
	if err := parseJSON(tr, &mo); err != nil {
		return nil, err
	}
	if tr.exit != 0 || mo.Summary.Rewritten != int64(stale) {
		return nil, fmt.Errorf("migrate --output-snapshot: exit %d, rewrote %d, want %d; stderr: %s", tr.exit, mo.Summary.Rewritten, stale, tail(tr.stderr))
	}
	ofi, err := os.Stat(out)
	if err != nil {
		return nil, err
	}
	record(res, mProdSnapMigrate, tr, mo.Summary.Scanned, in.Size(), mo.Summary.Rewritten, ofi.Size())
	if after, err := os.Stat(backup); err != nil || after.Size() != in.Size() || !after.ModTime().Equal(in.ModTime()) {
		return nil, fmt.Errorf("the backup changed under migrate --snapshot-file (%v)", err)
	}
	restored, err := restoreSnapshot(out, filepath.Join(dir, "restored"))
	if err != nil {
		return nil, err
	}
	tr, err = runTool(ctx, tool, "verify", "-o", "json", "--show-keys", "-1", "--snapshot-file", out, "--encryption-provider-config", newCfg)
	if err != nil {
		return nil, err
	}
	if err := parseJSON(tr, &vo); err != nil {
		return nil, err
	}
	if tr.exit != 0 || vo.Summary.Stale != 0 || vo.Summary.Unreadable != 0 || vo.Summary.Objects != backupObjects {
		return nil, fmt.Errorf("verify of the output snapshot: exit %d, %d objects, %d stale, %d unreadable; want exit 0, the backup's %d objects; stderr: %s", tr.exit, vo.Summary.Objects, vo.Summary.Stale, vo.Summary.Unreadable, backupObjects, tail(tr.stderr))
	}
	res.Notes = append(res.Notes, fmt.Sprintf("output snapshot: %.1f MB, restored by etcd's snapshot restore into a %.1f MB data directory, verified current (exit 0); the backup unchanged", float64(ofi.Size())/1e6, float64(restored)/1e6))

	for _, m := range res.Measurements {
		m.finish()
	}
	res.Keys = int64(seeded)
	for _, b := range []struct {
		name  string
		bound float64
	}{{mProdPlan, prodPlanBound}, {mProdVerify, prodPrivateBound}, {mProdMigrate, prodPrivateBound}, {mProdRollback, prodPrivateBound}, {mProdSnapVerify, prodPrivateBound}, {mProdSnapMigrate, prodOutputBound}} {
		res.Ratios = append(res.Ratios, privateRatio(res.get(b.name), b.bound))
	}
	if v := ratioOf(res, mProdSnapMigrate, mProdMigrate); v > 0 {
		res.Ratios = append(res.Ratios, ratio{Name: "output snapshot / live migrate (objects/s)", Value: v, Target: prodOutputRate, Met: v >= prodOutputRate,
			Note: "the live migrate compacts as it goes (--compact-history), as it must to fit the quota"})
	}
	for _, m := range res.Measurements {
		if len(m.Samples) > 0 && m.Samples[0].DiskKB > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("disk used by %s: %.1f MB", m.Name, float64(m.Samples[0].DiskKB)/1024))
		}
	}
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	logf("production phase took %s", time.Since(phase).Round(time.Second))
	return res, nil
}

// prodRound is one round's figures: plan's range, the tool's migrate and
// the ceiling beside it (wall and CPU seconds, the tool's or client's and
// etcd's), and where the run's time went.
type prodRound struct {
	low, high                      float64
	parts                          string
	migrate, migrateCPU, migrateEt float64
	ceiling, ceilingCPU, ceilingEt float64
	compactions, ceilCompactions   int
	inRun, compactSecs, waited     float64
	endWait, ceilWaited, ceilEnd   float64
}

// productionRound runs one round of the production phase (productionPhase):
// plan, verify (first only), migrate --compact-history, rollback of its
// whole journal and the compaction-matched ceiling, each a sample of its row.
func productionRound(ctx context.Context, o options, res *results, dir string, etcd *etcdProc, sd *seeded, tool string, inSize int64, round int, settle func() (int64, error), live, write []string) (prodRound, error) {
	var rd prodRound
	stale, productionQuota, newCfg := res.StaleObjects, o.productionQuota, sd.newCfg
	// A round's profiles and ratios are named for it when there are several.
	suffix, profile := "", "production-"
	if o.productionReps > 1 {
		suffix, profile = fmt.Sprintf(", round %d", round), fmt.Sprintf("production-round%d-", round)
	}
	// plan, as before the window.
	if _, err := settle(); err != nil {
		return rd, err
	}
	tr, po, err := runPlan(ctx, tool, slices.Concat(write, live)...)
	if err != nil {
		return rd, err
	}
	pm := record(res, mProdPlan, tr, int64(sd.objects), inSize, 0, 0)
	pm.Samples[len(pm.Samples)-1].EstimateLow, pm.Samples[len(pm.Samples)-1].EstimateHigh = po.Estimate.Low, po.Estimate.High
	rd.low, rd.high, rd.parts = po.Estimate.Low, po.Estimate.High, po.Estimate.parts()
	logf("  plan's estimate of migrate: %.0f–%.0fs (%s)", po.Estimate.Low, po.Estimate.High, po.Estimate.parts())
	po.Estimate.logParts()

	// verify, in the first round.
	if round == 1 {
		if _, err := settle(); err != nil {
			return rd, err
		}
		tr, err = runToolDiag(ctx, true, tool, append([]string{"verify", "-o", "json", "--show-keys", "-1"}, live...)...)
		if err != nil {
			return rd, err
		}
		var vo verifyOut
		if err := parseJSON(tr, &vo); err != nil {
			return rd, err
		}
		if tr.exit != 3 || vo.Summary.Stale != int64(stale) || vo.Summary.Unreadable != 0 {
			return rd, fmt.Errorf("verify: exit %d, %d stale, %d unreadable; want exit 3, %d stale; stderr: %s", tr.exit, vo.Summary.Stale, vo.Summary.Unreadable, stale, tail(tr.stderr))
		}
		record(res, mProdVerify, tr, vo.Summary.Objects+vo.Summary.NotObjects, inSize, 0, 0)

	}

	// migrate --compact-history, its journal kept for the rollback.
	journal := filepath.Join(dir, "migrate.journal")
	defer os.Remove(journal)
	if _, err := settle(); err != nil {
		return rd, err
	}
	cpu0, m0 := etcd.CPU(), etcd.metrics(ctx)
	margs := []string{"migrate", "-o", "json", "--journal", journal}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return rd, err
		}
		margs = append(margs, "--cpuprofile", filepath.Join(o.profileDir, profile+"migrate.cpu.pprof"))
	}
	stopEtcdProfile, err := profileEtcd(o, etcd, profile+"migrate")
	if err != nil {
		return rd, err
	}
	tr, err = runToolDiag(ctx, true, tool, append(append(margs, write...), live...)...)
	if perr := stopEtcdProfile(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return rd, err
	}
	migrateEtcdCPU := etcd.CPU() - cpu0
	logf("  migrate: etcd CPU %.1fs; etcd: %s", migrateEtcdCPU.Seconds(), etcdCosts(m0, etcd.metrics(ctx)))
	var mo migrateOut
	if err := parseJSON(tr, &mo); err != nil {
		return rd, err
	}
	if tr.exit != 0 || mo.Summary.Rewritten != int64(stale) {
		return rd, fmt.Errorf("migrate: exit %d, rewrote %d, want %d; stderr: %s", tr.exit, mo.Summary.Rewritten, stale, tail(tr.stderr))
	}
	jfi, err := os.Stat(journal)
	if err != nil {
		return rd, err
	}
	m := record(res, mProdMigrate, tr, mo.Summary.Scanned, inSize, mo.Summary.Rewritten, jfi.Size())
	ms := &m.Samples[len(m.Samples)-1]
	ms.EtcdCPUSeconds = migrateEtcdCPU.Seconds()
	ws := mo.Writer
	writes := fmt.Sprintf("migrate's writes: %d transactions, %d fallen back to single writes (%d), %d split, %d retried; its scan restarted %d time(s) and kept %d batches on disk while its writes waited", ws.Txns, ws.Fallbacks, ws.Singles, ws.Splits, ws.Retries, len(mo.Restarts), mo.Backlog)
	logf("    %s", writes)
	res.Notes = append(res.Notes, writes)
	ms.DBSizeBeforeKB, ms.DBSizeAfterKB, ms.DBSizeMaxKB, ms.Compactions = mo.Space.DBSizeBefore>>10, mo.Space.DBSizeAfter>>10, mo.Space.DBSizeMax>>10, mo.Space.Compactions
	rd.migrate, rd.migrateCPU, rd.migrateEt, rd.compactions = ms.Seconds, ms.CPUSeconds, ms.EtcdCPUSeconds, mo.Space.Compactions
	inRun, _ := time.ParseDuration(mo.Duration)
	rd.inRun, rd.compactSecs, rd.waited, rd.endWait = inRun.Seconds(), mo.Space.CompactSeconds, mo.Space.WaitSeconds, mo.Space.EndWaitSeconds
	res.Notes = append(res.Notes, fmt.Sprintf("migrate: etcd's database %.2f -> %.2f GB, at most %.2f GB of the %s quota, %d compaction(s)", float64(mo.Space.DBSizeBefore)/1e9, float64(mo.Space.DBSizeAfter)/1e9, float64(mo.Space.DBSizeMax)/1e9, quotaText(productionQuota), mo.Space.Compactions))

	// rollback of the whole journal: it writes every old value back, more than
	// the room a migrate that compacted as it went leaves, so it compacts too.
	if _, err := settle(); err != nil {
		return rd, err
	}
	tr, err = runToolDiag(ctx, true, tool, "rollback", "-o", "json", "--endpoints", etcd.URL, "--encryption-provider-config", newCfg, "--journal", journal, "--liveness-window", "1s", "--compact-history")
	if err != nil {
		return rd, err
	}
	var rb rollback.RollbackResult
	if err := parseJSON(tr, &rb); err != nil {
		return rd, err
	}
	// The journal holds every rewrite and the CRDs' storedVersions updates.
	if tr.exit != 0 || rb.Restored < stale || rb.Skipped != 0 || rb.Failed != 0 {
		return rd, fmt.Errorf("rollback: exit %d, restored %d of at least %d (%d skipped, %d failed); stderr: %s", tr.exit, rb.Restored, stale, rb.Skipped, rb.Failed, tail(tr.stderr))
	}
	r := record(res, mProdRollback, tr, int64(rb.Restored), jfi.Size(), int64(rb.Restored), 0)
	if sp := rb.Space; sp != nil {
		r.Samples[0].DBSizeBeforeKB, r.Samples[0].DBSizeAfterKB, r.Samples[0].DBSizeMaxKB, r.Samples[0].Compactions = sp.DBSizeBefore>>10, sp.DBSizeAfter>>10, sp.DBSizeMax>>10, sp.Compactions
		res.Notes = append(res.Notes, fmt.Sprintf("rollback: etcd's database %.2f -> %.2f GB, at most %.2f GB of the %s quota, %d compaction(s)", float64(sp.DBSizeBefore)/1e9, float64(sp.DBSizeAfter)/1e9, float64(sp.DBSizeMax)/1e9, quotaText(productionQuota), sp.Compactions))
	}
	for _, p := range rb.Preflight {
		if strings.Contains(p, "rollback") {
			res.Notes = append(res.Notes, "rollback's preflight: "+p)
		}
	}
	if rs := r.Samples[len(r.Samples)-1]; ms.Rewrites > 0 {
		v := (float64(rb.Restored) / rs.Seconds) / (float64(ms.Rewrites) / ms.Seconds)
		res.Ratios = append(res.Ratios, ratio{Name: "rollback / migrate (rewrites/s)" + suffix, Value: v, Target: 0.8,
			Met: v >= 0.8, Note: "the whole journal undone against the rewrite it undoes, both compacting"})
	}

	// The compaction-matched ceiling: the rollback made the keys stale
	// again; etcd's own CAS rewrite of them, compacting where the tool does.
	if _, err := settle(); err != nil {
		return rd, err
	}
	if stopEtcdProfile, err = profileEtcd(o, etcd, profile+"ceiling"); err != nil {
		return rd, err
	}
	cpu0, m0, client0 := etcd.CPU(), etcd.metrics(ctx), processCPU()
	cc, ccSpace, err := compactingCeiling(ctx, etcd.cli, sd.gen.staleKeys(), productionQuota)
	ceilingEtcdCPU, ceilingClientCPU := etcd.CPU()-cpu0, processCPU()-client0
	if perr := stopEtcdProfile(); perr != nil && err == nil {
		err = perr
	}
	logf("  %s: client CPU %.1fs, etcd CPU %.1fs; etcd: %s", mProdCeiling, ceilingClientCPU.Seconds(), ceilingEtcdCPU.Seconds(), etcdCosts(m0, etcd.metrics(ctx)))
	if err != nil {
		return rd, fmt.Errorf("%s: %w", mProdCeiling, err)
	}
	if cc.rewrites != int64(stale) {
		return rd, fmt.Errorf("%s rewrote %d keys, want %d (%d failed)", mProdCeiling, cc.rewrites, stale, cc.failed)
	}
	res.get(mProdCeiling).Samples = append(res.get(mProdCeiling).Samples, sample{Seconds: cc.elapsed.Seconds(), CPUSeconds: ceilingClientCPU.Seconds(), EtcdCPUSeconds: ceilingEtcdCPU.Seconds(),
		Objects: cc.keys, Bytes: cc.bytes, Rewrites: cc.rewrites, Compactions: ccSpace.Compactions})
	logf("  %s: %d rewritten in %.2fs, %d compaction(s), %.2fs waited for them (%.2fs of it for the last, at the end)", mProdCeiling, cc.rewrites, cc.elapsed.Seconds(), ccSpace.Compactions, ccSpace.WaitSeconds, ccSpace.EndWaitSeconds)
	rd.ceiling, rd.ceilingCPU, rd.ceilingEt = cc.elapsed.Seconds(), ceilingClientCPU.Seconds(), ceilingEtcdCPU.Seconds()
	rd.ceilCompactions, rd.ceilWaited, rd.ceilEnd = ccSpace.Compactions, ccSpace.WaitSeconds, ccSpace.EndWaitSeconds
	return rd, nil
}

// prodRatios judges the rounds: plan's range against each round's migrate;
// migrate against the ceiling of its own round, in time and in CPU (the
// tool's whole process and etcd beside it against the ceiling's bare
// client and etcd: the machine's speed and cores aside), each round's
// ratio and, with several rounds, their median as the one judged.
func prodRatios(res *results, rounds []prodRound, snapTook time.Duration) {
	several := len(rounds) > 1
	var times, cpus []float64
	for i, rd := range rounds {
		suffix := ""
		if several {
			suffix = fmt.Sprintf(", round %d", i+1)
		}
		res.Ratios = append(res.Ratios, rangeRatio("plan's range holds "+mProdMigrate+suffix, rd.migrate, rd.low, rd.high, "seconds, process start to exit"))
		res.Notes = append(res.Notes, fmt.Sprintf("plan's estimate of migrate%s: %.0f–%.0fs (%s); measured: %.0fs", suffix, rd.low, rd.high, rd.parts, rd.migrate))
		over := rd.migrate / rd.ceiling
		ran, ceil := rd.migrateCPU+rd.migrateEt, rd.ceilingCPU+rd.ceilingEt
		times = append(times, over)
		cpuNote := fmt.Sprintf("CPU seconds: the tool %.1f + etcd %.1f = %.1f against the ceiling's client %.1f + etcd %.1f = %.1f", rd.migrateCPU, rd.migrateEt, ran, rd.ceilingCPU, rd.ceilingEt, ceil)
		timeNote := fmt.Sprintf("the tool's whole process (its 1 s window, snapshot, journal, decisions), %.1fs, against etcd's CAS rewrite of the same keys with the same compactions (%d; the tool's %d), %.1fs", rd.migrate, rd.ceilCompactions, rd.compactions, rd.ceiling)
		if ceil > 0 {
			cpus = append(cpus, ran/ceil)
		}
		if several {
			res.Notes = append(res.Notes, fmt.Sprintf("round %d: migrate / ceiling %.2f in time (%s), %.2f in CPU (%s)", i+1, over, timeNote, ran/ceil, cpuNote))
		} else {
			res.Ratios = append(res.Ratios, ratio{Name: "migrate --compact-history / compaction-matched ceiling (time)", Value: over, Target: 1.5, Met: over <= 1.5, AtMost: true, Note: timeNote})
			if ceil > 0 {
				res.Ratios = append(res.Ratios, ratio{Name: "migrate --compact-history / compaction-matched ceiling (CPU)", Value: ran / ceil, Target: 1.5, Met: ran/ceil <= 1.5, AtMost: true, Note: cpuNote})
			}
		}
		res.Notes = append(res.Notes, fmt.Sprintf("where migrate --compact-history's %.1fs went%s: in-run %.1fs (after setup); a snapshot of this etcd took %.1fs before the rounds (the backup); its %d compaction(s) ran %.1fs in the background; its writes waited %.1fs in the space guard (%.1fs of it for the last compaction, at the end); the compaction-matched ceiling: %.1fs, %d compaction(s), %.1fs waited for them (%.1fs at the end)",
			rd.migrate, suffix, rd.inRun, snapTook.Seconds(), rd.compactions, rd.compactSecs, rd.waited, rd.endWait, rd.ceiling, rd.ceilCompactions, rd.ceilWaited, rd.ceilEnd))
	}
	if several {
		t, c := statOf(times), statOf(cpus)
		res.Ratios = append(res.Ratios,
			ratio{Name: fmt.Sprintf("migrate --compact-history / compaction-matched ceiling (time), median of %d interleaved rounds", len(rounds)), Value: t.Median, Target: 1.5, Met: t.Median <= 1.5, AtMost: true,
				Note: fmt.Sprintf("each round's migrate against the ceiling run after it: %.2f–%.2f", t.Min, t.Max)},
			ratio{Name: fmt.Sprintf("migrate --compact-history / compaction-matched ceiling (CPU), median of %d interleaved rounds", len(rounds)), Value: c.Median, Target: 1.5, Met: c.Median <= 1.5, AtMost: true,
				Note: fmt.Sprintf("tool + etcd against the ceiling's client + etcd, each round's: %.2f–%.2f", c.Min, c.Max)})
	}
}

// record adds a run of the tool as row name: objects read, the input's bytes,
// rewrites, and the disk it used (its state directory, plus extra: a journal
// or an output file).
func record(res *results, name string, tr toolRun, objects, bytes, rewrites, extra int64) *measurement {
	m := res.get(name)
	m.Samples = append(m.Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: objects, Bytes: bytes, Rewrites: rewrites,
		PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, DiskKB: (tr.stateBytes + extra) >> 10})
	logf("  %s: %d objects, %d rewritten in %.2fs (CPU %.2fs, %.2fs of it the kernel's), peak private %d MB, RSS %d MB, disk %d MB", name, objects, rewrites, tr.wall.Seconds(), tr.cpu.Seconds(), tr.sys.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024, (tr.stateBytes+extra)>>20)
	if tr.diag != nil {
		logf("    memory: %s", tr.diag)
		res.Notes = append(res.Notes, fmt.Sprintf("%s's memory: %s", name, tr.diag))
	}
	return m
}

// restoreSnapshot restores the snapshot file with etcd's own restore code
// (the etcdutl snapshot restore an operator runs) into dir, and returns the
// size of the data directory it made; dir is removed afterwards.
func restoreSnapshot(file, dir string) (int64, error) {
	defer os.RemoveAll(dir)
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:2380"} // written into the member, never listened on
	if err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        file,
		Name:                "restored",
		OutputDataDir:       dir,
		PeerURLs:            []string{peer.String()},
		InitialCluster:      "restored=" + peer.String(),
		InitialClusterToken: "bench-restore",
	}); err != nil {
		return 0, fmt.Errorf("etcd snapshot restore of %s: %w", file, err)
	}
	return dirBytes(dir), nil
}

// profileEtcd starts, with -profile, a CPU profile of the etcd child into
// DIR/name.etcd.cpu.pprof; the function returned ends it (and does nothing
// without -profile).
func profileEtcd(o options, etcd *etcdProc, name string) (stop func() error, err error) {
	if o.profileDir == "" {
		return func() error { return nil }, nil
	}
	return etcd.Profile(filepath.Join(o.profileDir, name+".etcd.cpu.pprof"))
}

// quotaText is a quota as an operator gives it: in GiB, or in MiB below
// one (a small -production-quota).
func quotaText(q int64) string {
	if q >= 1<<30 && q%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", q>>30)
	}
	return fmt.Sprintf("%d MiB", q>>20)
}
