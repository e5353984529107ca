package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
)

const (
	mSnapCeiling = "snapshot bare read"
	mSnapVerify  = "verify --snapshot"
	mSnapMigrate = "migrate --snapshot"
)

// snapshotRuns measures reading an etcd snapshot file of the seeded keyspace:
// the ceiling is a bare read of the same file by etcd's own code (etcdutl
// snapshot status: bbolt's integrity check, then every record read, decoded
// and hashed), beside the tool's verify --snapshot-file (the checks, then the
// file read in place: the scan's passes, decode and decisions, all within its
// wall time) and migrate --snapshot-file --output-snapshot (restore into a
// private etcd, the rewrites, compaction, defragmentation, the new file saved,
// restored afresh and verified). Objects are the keyspace's keys.
func snapshotRuns(ctx context.Context, o options, res *results, bin, dir string, etcd *etcdProc, newCfg string, stale int, settle func() error) error {
	path := filepath.Join(dir, "bench-snapshot.db")
	if err := etcdscan.Snapshot(ctx, etcd.cli, path); err != nil {
		return fmt.Errorf("snapshot of the seeded etcd: %w", err)
	}
	defer os.Remove(path)
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	logf("snapshot file: %.1f MB", float64(fi.Size())/1e6)
	for rep := 1; rep <= o.reps; rep++ {
		logf("snapshot repetition %d/%d", rep, o.reps)
		if err := settle(); err != nil {
			return err
		}
		start := time.Now()
		st, err := snapshot.NewV3(zap.NewNop()).Status(path)
		if err != nil {
			return fmt.Errorf("etcdutl snapshot status: %w", err)
		}
		elapsed := time.Since(start)
		res.get(mSnapCeiling).Samples = append(res.get(mSnapCeiling).Samples, sample{Seconds: elapsed.Seconds(), Objects: int64(st.TotalKey), Bytes: fi.Size()})
		logf("  bare read: %d keys in %.2fs", st.TotalKey, elapsed.Seconds())

		if err := settle(); err != nil {
			return err
		}
		tr, err := runTool(ctx, bin, "verify", "-o", "json", "--show-keys", "-1", "--snapshot-file", path, "--encryption-provider-config", newCfg)
		if err != nil {
			return err
		}
		var vo verifyOut
		if err := parseJSON(tr, &vo); err != nil {
			return err
		}
		if tr.exit != 3 || vo.Summary.Stale != int64(stale) || vo.Summary.Unreadable != 0 {
			return fmt.Errorf("verify --snapshot-file: exit %d, %d stale, %d unreadable; want exit 3, %d stale; stderr: %s", tr.exit, vo.Summary.Stale, vo.Summary.Unreadable, stale, tail(tr.stderr))
		}
		res.get(mSnapVerify).Samples = append(res.get(mSnapVerify).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: vo.Summary.Objects + vo.Summary.NotObjects, Bytes: fi.Size(), PeakRSSKB: tr.peakRSSKB})
		logf("  verify --snapshot-file: %d objects in %.2fs, peak RSS %d MB", vo.Summary.Objects, tr.wall.Seconds(), tr.peakRSSKB/1024)

		if err := settle(); err != nil {
			return err
		}
		out := filepath.Join(dir, "bench-snapshot-out.db")
		// The release the seeded keyspace is written for (a backup has no
		// kubeadm-config): migrate refuses to guess it.
		release := decode.TargetVersions()[len(decode.TargetVersions())-1]
		tr, err = runTool(ctx, bin, "migrate", "-o", "json", "--snapshot-file", path, "--output-snapshot", out, "--force", "--encryption-provider-config", newCfg, "--target-version", release)
		os.Remove(out)
		if err != nil {
			return err
		}
		var mo migrateOut
		if err := parseJSON(tr, &mo); err != nil {
			return err
		}
		if tr.exit != 0 || mo.Summary.Rewritten != int64(stale) {
			return fmt.Errorf("migrate --snapshot-file: exit %d, rewrote %d, want %d; stderr: %s", tr.exit, mo.Summary.Rewritten, stale, tail(tr.stderr))
		}
		inRun, _ := time.ParseDuration(mo.Duration)
		res.get(mSnapMigrate).Samples = append(res.get(mSnapMigrate).Samples, sample{Seconds: tr.wall.Seconds(), InRunSeconds: inRun.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: mo.Summary.Scanned, Bytes: fi.Size(), Rewrites: mo.Summary.Rewritten, PeakRSSKB: tr.peakRSSKB})
		logf("  migrate --snapshot-file --output-snapshot: %d scanned, %d rewritten in %.2fs (in-run %s), peak RSS %d MB (the private etcd included)", mo.Summary.Scanned, mo.Summary.Rewritten, tr.wall.Seconds(), mo.Duration, tr.peakRSSKB/1024)
	}
	return nil
}

// snapshotNote says how reading a snapshot file compares with its ceilings.
func snapshotNote(res *results) string {
	v := res.get(mSnapVerify).ObjectsPerS.Median
	if v == 0 {
		return ""
	}
	note := fmt.Sprintf("snapshot file: verify --snapshot-file (read in place) %.0f objects/s = %.2f x the bare read of the file, %.2f x verify against the live etcd (its wall time includes the sha256 and bbolt checks)",
		v, v/res.get(mSnapCeiling).ObjectsPerS.Median, v/res.get(mVerify).ObjectsPerS.Median)
	if m := res.get(mSnapMigrate).ObjectsPerS.Median; m > 0 {
		note += fmt.Sprintf("; migrate --snapshot-file --output-snapshot (restored into a private etcd, saved, restored afresh and verified) %.0f objects/s = %.2f x live migrate", m, m/res.get(mMigrate).ObjectsPerS.Median)
	}
	return note
}
