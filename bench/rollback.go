package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/undo"
)

// The rollback phase: a journal of -rollback-n rewrites of 2 KB values (a
// migration of a million secrets) is rolled back by the tool, as an operator
// rolls back before kube-apiserver starts again; the row has its rate and its
// peak private memory, against the bound the tool keeps (rollback reads the journal
// backwards a batch at a time, whatever its size).
const (
	mRollback         = "rollback (tool)"
	rollbackValueSize = 2 << 10
	// rollbackBoundMB is the peak private memory (RssAnon) a rollback must
	// stay under, at any journal size (issue 55: 100 MB at 1,000,000).
	rollbackBoundMB = 100
)

func rollbackRun(ctx context.Context, o options, dir string) (*results, error) {
	rdir := filepath.Join(dir, "rollback")
	if err := os.Mkdir(rdir, 0o700); err != nil {
		return nil, err
	}
	res := &results{Dataset: "rollback", N: o.rollbackN, Reps: 1, Keys: int64(o.rollbackN), KeyspaceBytes: int64(o.rollbackN) * rollbackValueSize,
		StaleObjects: o.rollbackN, BatchOps: etcdscan.DefaultMaxOps, Date: time.Now().UTC().Format(time.RFC3339)}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	etcd, err := startEtcd(filepath.Join(rdir, "etcd"), o.quota)
	if err != nil {
		return nil, err
	}
	defer etcd.Stop()
	journal := filepath.Join(rdir, "journal")
	logf("rollback phase: writing %d keys of %d bytes and the journal of their rewrite", o.rollbackN, rollbackValueSize)
	size, err := seedRollback(ctx, etcd.cli, journal, o.rollbackN)
	if err != nil {
		return nil, err
	}
	logf("  journal: %d MB", size>>20)
	if _, err := etcd.Settle(ctx); err != nil {
		return nil, err
	}
	// A million 2 KB values put back into the 3.8 GB they fill would pass
	// etcd's 8 GiB quota: rollback refuses that without compaction, and an
	// operator runs it with --compact-history, as here.
	tr, err := runTool(ctx, o.tool, "rollback", "-o", "json", "--endpoints", etcd.URL, "--journal", journal, "--liveness-window", "1s", "--compact-history")
	if err != nil {
		return nil, err
	}
	var rb rollback.RollbackResult
	if err := parseJSON(tr, &rb); err != nil {
		return nil, err
	}
	if tr.exit != 0 || rb.Restored != o.rollbackN || rb.Skipped != 0 || rb.Failed != 0 {
		return nil, fmt.Errorf("rollback: exit %d, %+v; stderr: %s", tr.exit, rb, tail(tr.stderr))
	}
	m := res.get(mRollback)
	m.Samples = append(m.Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: int64(o.rollbackN), Bytes: size, Rewrites: int64(rb.Restored), PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB})
	m.finish()
	logf("  rollback: %d restored in %.2fs (CPU %.2fs), peak private %d MB, RSS %d MB", rb.Restored, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
	peak := float64(tr.peakPrivateKB) / 1024
	res.Ratios = append(res.Ratios, ratio{Name: "rollback peak private (MB) / bound", Value: peak / rollbackBoundMB, Target: 1, Met: peak <= rollbackBoundMB, AtMost: true,
		Note: fmt.Sprintf("%.0f MB private (RssAnon; peak RSS, VmHWM, %d MB) on a journal of %d entries (%d MB); the bound is %d MB; lower is better, met when <= 1; the run includes its 1 s liveness watch and the snapshot of its undo", peak, tr.peakRSSKB>>10, o.rollbackN, size>>20, rollbackBoundMB)})
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	printTable(os.Stdout, res)
	if o.jsonPath != "" {
		if err := writeResults(res, strings.TrimSuffix(o.jsonPath, ".json")+"-rollback.json"); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// seedRollback writes n keys holding "new" values, as a migration left them,
// and the journal that migration would have written (each intent with the
// old value, each done with the new mod revision); it returns the journal's size.
func seedRollback(ctx context.Context, cli *clientv3.Client, path string, n int) (int64, error) {
	j, err := undo.OpenJournal(path)
	if err != nil {
		return 0, err
	}
	if err := j.Begin(1, "/registry"); err != nil {
		j.Close()
		return 0, err
	}
	const batch = 100
	old := make([]byte, rollbackValueSize)
	if _, err := rand.Read(old); err != nil {
		j.Close()
		return 0, err
	}
	for start := 0; start < n; start += batch {
		end := min(start+batch, n)
		puts := make([]etcdscan.Put, 0, end-start)
		olds := make([][]byte, 0, end-start)
		ops := make([]clientv3.Op, 0, end-start)
		for i := start; i < end; i++ {
			v := make([]byte, rollbackValueSize)
			if _, err := rand.Read(v); err != nil {
				j.Close()
				return 0, err
			}
			key := fmt.Sprintf("/registry/secrets/ns-%03d/s-%07d", i%1000, i)
			puts = append(puts, etcdscan.Put{Key: key, Value: v})
			olds = append(olds, old)
			ops = append(ops, clientv3.OpPut(key, string(v)))
		}
		if err := j.Intents(puts, olds); err != nil {
			j.Close()
			return 0, err
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			j.Close()
			return 0, fmt.Errorf("seed the rollback keys: %w", err)
		}
		done := make([]etcdscan.PutResult, len(puts))
		for i, p := range puts {
			done[i] = etcdscan.PutResult{Key: p.Key, Status: etcdscan.Written, NewModRevision: resp.Header.Revision}
		}
		if err := j.Done(done); err != nil {
			j.Close()
			return 0, err
		}
	}
	if err := j.Close(); err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// rollbackOfMigrate rolls back the migrate run whose journal is at path, as
// an operator would right after it (its own undo kept, no liveness watch as
// the migrate row has none), and records its rate: keys restored per second
// of the whole process, beside migrate's keys rewritten per second.
func rollbackOfMigrate(ctx context.Context, o options, res *results, bin, journal string, common []string, bytes int64, settle func() error, etcd *etcdProc) error {
	defer os.Remove(journal)
	if err := settle(); err != nil {
		return err
	}
	before := etcd.RSSKB()
	args := append([]string{"rollback", "-o", "json", "--journal", journal, "--allow-live-apiserver", "--quota-backend-bytes", fmt.Sprint(o.quota)}, common...)
	tr, err := runTool(ctx, bin, args...)
	if err != nil {
		return err
	}
	var rb rollback.RollbackResult
	if err := parseJSON(tr, &rb); err != nil {
		return err
	}
	if tr.exit != 0 || rb.Skipped != 0 || rb.Failed != 0 || rb.Restored == 0 {
		return fmt.Errorf("%s: exit %d, %d restored, %d skipped, %d failed; stderr: %s", mRollbackMigrate, tr.exit, rb.Restored, rb.Skipped, rb.Failed, tail(tr.stderr))
	}
	res.get(mRollbackMigrate).Samples = append(res.get(mRollbackMigrate).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: int64(rb.Restored), Bytes: bytes,
		Rewrites: int64(rb.Restored), PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, EtcdRSSBeforeKB: before, EtcdRSSAfterKB: etcd.RSSKB()})
	logf("  %s: %d restored in %.2fs (CPU %.2fs), peak private %d MB, RSS %d MB", mRollbackMigrate, rb.Restored, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB/1024, tr.peakRSSKB/1024)
	return nil
}
