package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/release"
)

const (
	mKineVerify   = "verify (SQLite)"
	mKinePlan     = "plan (SQLite)"
	mKineMigrate  = "migrate (SQLite)"
	mKineRollback = "rollback (SQLite)"
	mKineEtcdVer  = "verify (etcd, same keys)"
	mKineEtcdMig  = "migrate (etcd, same keys)"
)

// kineOptions are the kine phase's flags (-kine, -kine-n, -kine-reps).
type kineOptions struct {
	on      bool
	n, reps int
}

// kineBoundMB is the peak private memory (RssAnon) each command on a SQLite
// datastore is held to: the bound of a run on etcd.
const kineBoundMB = 100

// kinePhase measures k3s's default datastore, SQLite through kine: o.kine.n
// mixed objects written through kine as kube-apiserver writes them (one
// create transaction a key, each event with its lease) into a k3s node's
// state.db, and the same objects into an etcd of their own. Then, in each
// repetition, on the node as an operator runs them (k3s stopped, the tool
// finding the datastore; its defaults: the undo's snapshot a copy of the
// database, the journal): verify, plan, migrate and rollback --run of it,
// and beside them verify and migrate (a 1 s window) of the same keys on the
// etcd, so that SQLite's cost is read against etcd's in one run: time, CPU
// per object and peak private memory, each against kineBoundMB; and plan's
// range against the migrate it estimates.
func kinePhase(ctx context.Context, o options, dir string) (*results, error) {
	n := o.kine.n
	res := &results{Dataset: "kine-sqlite", N: n, StaleVersion: o.staleVersion, StaleKey: o.staleKey, Reps: o.kine.reps,
		PageSize: etcdscan.DefaultPageSize, Date: time.Now().UTC().Format(time.RFC3339)}
	res.Machine.CPUs, res.Machine.GoVersion, res.Machine.OS = runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	res.Machine.CPU = cpuModel()
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	logf("kine phase: %d mixed objects in k3s's SQLite datastore (kine %s) and in an etcd, %d repetition(s)", n, kinedb.KineVersion, o.kine.reps)

	// A k3s server node as k3s lays out its default datastore (no etcd
	// directory, no cluster-init: DATA/server/db/state.db) with secrets
	// encryption, its configuration the rotation's target ([key2, key1]).
	root := filepath.Join(dir, "node")
	data := filepath.Join(root, "var/lib/rancher/k3s/server")
	for _, d := range []string{filepath.Join(root, "etc/rancher/k3s"), filepath.Join(data, "db"), filepath.Join(data, "cred")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/rancher/k3s/config.yaml"), []byte("secrets-encryption: true\n"), 0o600); err != nil {
		return nil, err
	}
	oldCfg, newCfg, err := writeEncryptionConfigs(dir)
	if err != nil {
		return nil, err
	}
	if err := copyFile(newCfg, filepath.Join(data, "cred/encryption-config.json")); err != nil {
		return nil, err
	}
	db := filepath.Join(data, "db/state.db")
	gen, err := newGenerator(ctx, n, o.staleVersion, o.staleKey, oldCfg, newCfg, false)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	seeded, err := seedKine(ctx, gen, db, filepath.Join(dir, "kine"))
	if err != nil {
		return nil, fmt.Errorf("seeding the SQLite datastore through kine: %w", err)
	}
	res.SeedSeconds = time.Since(start).Seconds()
	// Every object is in kine's table (its latest row, not a deletion): a
	// count that differs later is the read's, not the seeding's.
	rows, err := kineKeys(ctx, db)
	if err != nil {
		return nil, err
	}
	if fixed, err := gen.fixedObjects(); err != nil || rows != seeded+len(fixed) {
		return nil, fmt.Errorf("seeding the SQLite datastore: %d keys in kine's table, want %d objects and %d namespaces and CRDs (%v)", rows, seeded, len(fixed), err)
	}
	stale := gen.staleKeys()
	res.StaleObjects, res.Keys = len(stale), int64(seeded)
	fi, err := os.Stat(db)
	if err != nil {
		return nil, err
	}
	logf("  seeded %d objects through kine in %.1fs (%.0f/s); state.db %.1f MB; %d stale", seeded, res.SeedSeconds, float64(seeded)/res.SeedSeconds, float64(fi.Size())/1e6, len(stale))
	res.Notes = append(res.Notes, fmt.Sprintf("state.db %.1f MB after seeding %d objects through kine", float64(fi.Size())/1e6, seeded))
	// The seeded database as it is, write-ahead log included (SQLite's own
	// copy: the file alone may lack the last transactions, still in
	// state.db-wal), put back before each repetition.
	pristine := filepath.Join(dir, "state.db.seeded")
	if err := kinedb.Copy(ctx, db, pristine); err != nil {
		return nil, err
	}

	etcd, err := startEtcd(filepath.Join(dir, "etcd"), o.quota)
	if err != nil {
		return nil, err
	}
	defer etcd.Stop()
	gen.leases = nil // kine's: etcd grants its own
	if err := gen.grantLeases(ctx, etcd.cli); err != nil {
		return nil, err
	}
	if _, err := gen.seed(ctx, etcd.cli, func(objSpec) bool { return true }, true); err != nil {
		return nil, err
	}
	settle := func() error { return etcd.Quiet(ctx) }
	node := []string{"--node-root", root, "--target-version", release.Linked()}
	onEtcd := []string{"--endpoints", etcd.URL, "--encryption-provider-config", newCfg, "--target-version", release.Linked()}

	record := func(name string, tr toolRun, rewrites int64) {
		res.get(name).Samples = append(res.get(name).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: int64(seeded), Rewrites: rewrites,
			PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, DiskKB: tr.stateBytes >> 10})
		logf("  %s: %.2fs (CPU %.2fs), peak private %d MB", name, tr.wall.Seconds(), tr.cpu.Seconds(), tr.peakPrivateKB>>10)
	}
	for rep := 1; rep <= o.kine.reps; rep++ {
		logf("repetition %d/%d", rep, o.kine.reps)
		for _, f := range []string{db + "-wal", db + "-shm"} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				return nil, err
			}
		}
		if err := copyFile(pristine, db); err != nil {
			return nil, err
		}
		state := filepath.Join(dir, fmt.Sprintf("state-%d", rep))

		// SQLite: verify, plan, migrate at its defaults, its rollback.
		tr, err := runTool(ctx, o.tool, append([]string{"verify", "-o", "json", "--show-keys", "-1"}, node...)...)
		if err != nil {
			return nil, err
		}
		var vo verifyOut
		if err := parseJSON(tr, &vo); err != nil {
			return nil, err
		}
		if tr.exit != 3 || vo.Summary.Stale != int64(len(stale)) || vo.Summary.Unreadable != 0 {
			// Kept, to be read again by hand: was it the seeding or the read?
			kept := filepath.Join(os.TempDir(), fmt.Sprintf("kine-verify-mismatch-%d.db", os.Getpid()))
			if err := kinedb.Copy(ctx, db, kept); err != nil {
				kept = "not kept: " + err.Error()
			}
			return nil, fmt.Errorf("%s: exit %d, %d objects: %d stale, %d current, %d unreadable; want exit 3, %d stale of %d seeded; the database copied to %s; stderr: %s",
				mKineVerify, tr.exit, vo.Summary.Objects, vo.Summary.Stale, vo.Summary.Current, vo.Summary.Unreadable, len(stale), seeded, kept, tail(tr.stderr))
		}
		record(mKineVerify, tr, 0)

		tr, po, err := runPlan(ctx, o.tool, append([]string{"--state-dir", state}, node...)...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mKinePlan, err)
		}
		res.get(mKinePlan).Samples = append(res.get(mKinePlan).Samples, sample{Seconds: tr.wall.Seconds(), CPUSeconds: tr.cpu.Seconds(), Objects: int64(seeded),
			PeakPrivateKB: tr.peakPrivateKB, PeakRSSKB: tr.peakRSSKB, EstimateLow: po.Estimate.Low, EstimateHigh: po.Estimate.High})
		logf("  %s: %.2fs, peak private %d MB; its estimate of migrate %.1f–%.1fs", mKinePlan, tr.wall.Seconds(), tr.peakPrivateKB>>10, po.Estimate.Low, po.Estimate.High)

		tr, err = runTool(ctx, o.tool, append([]string{"migrate", "-o", "json", "--state-dir", state}, node...)...)
		if err != nil {
			return nil, err
		}
		var mo migrateOut
		if err := parseJSON(tr, &mo); err != nil {
			return nil, err
		}
		if tr.exit != 0 || mo.Summary.Rewritten != int64(len(stale)) {
			return nil, fmt.Errorf("%s: exit %d, %d rewritten; want exit 0, %d; stderr: %s", mKineMigrate, tr.exit, mo.Summary.Rewritten, len(stale), tail(tr.stderr))
		}
		tr.stateBytes = dirBytes(state)
		record(mKineMigrate, tr, mo.Summary.Rewritten)
		res.Ratios = append(res.Ratios, rangeRatio(fmt.Sprintf("plan's range holds migrate (SQLite), rep %d", rep), tr.wall.Seconds(), po.Estimate.Low, po.Estimate.High, "seconds"))

		tr, err = runTool(ctx, o.tool, "rollback", "--node-root", root, "--state-dir", state, "--run", "0001-migrate")
		if err != nil {
			return nil, err
		}
		if tr.exit != 0 {
			return nil, fmt.Errorf("%s: exit %d; stderr: %s", mKineRollback, tr.exit, tail(tr.stderr))
		}
		record(mKineRollback, tr, int64(len(stale)))
		if err := os.RemoveAll(state); err != nil {
			return nil, err
		}

		// The same keys on etcd: verify, migrate (a 1 s window), reseeded.
		if err := settle(); err != nil {
			return nil, err
		}
		tr, err = runTool(ctx, o.tool, append([]string{"verify", "-o", "json", "--show-keys", "-1"}, onEtcd...)...)
		if err != nil {
			return nil, err
		}
		if tr.exit != 3 {
			return nil, fmt.Errorf("%s: exit %d; stderr: %s", mKineEtcdVer, tr.exit, tail(tr.stderr))
		}
		record(mKineEtcdVer, tr, 0)
		if err := settle(); err != nil {
			return nil, err
		}
		tr, err = runTool(ctx, o.tool, append([]string{"migrate", "-o", "json", "--state-dir", state, "--liveness-window", "1s"}, onEtcd...)...)
		if err != nil {
			return nil, err
		}
		if err := parseJSON(tr, &mo); err != nil {
			return nil, err
		}
		if tr.exit != 0 || mo.Summary.Rewritten != int64(len(stale)) {
			return nil, fmt.Errorf("%s: exit %d, %d rewritten; stderr: %s", mKineEtcdMig, tr.exit, mo.Summary.Rewritten, tail(tr.stderr))
		}
		tr.stateBytes = dirBytes(state)
		record(mKineEtcdMig, tr, mo.Summary.Rewritten)
		if err := os.RemoveAll(state); err != nil {
			return nil, err
		}
		if _, err := gen.seed(ctx, etcd.cli, func(s objSpec) bool { return s.stale }, true); err != nil {
			return nil, err
		}
	}
	for _, m := range res.Measurements {
		m.finish()
	}
	for _, p := range []struct{ sqlite, etcd string }{{mKineVerify, mKineEtcdVer}, {mKineMigrate, mKineEtcdMig}} {
		s, e := res.get(p.sqlite), res.get(p.etcd)
		if s.ObjectsPerS.Median > 0 && e.CPUMicros.Median > 0 {
			res.Ratios = append(res.Ratios, ratio{Name: p.sqlite + " / " + p.etcd + " (time)", Value: e.ObjectsPerS.Median / s.ObjectsPerS.Median, Note: "reported: the same keys, the same command, medians"},
				ratio{Name: p.sqlite + " / " + p.etcd + " (CPU)", Value: s.CPUMicros.Median / e.CPUMicros.Median, Note: "reported: the tool's whole process (kine in it on SQLite; etcd's own CPU not counted)"})
		}
	}
	for _, name := range []string{mKineVerify, mKinePlan, mKineMigrate, mKineRollback} {
		peak := res.get(name).PeakPrivateMB.Max
		res.Ratios = append(res.Ratios, ratio{Name: name + " peak private (MB) / bound", Value: peak / kineBoundMB, Target: 1, Met: peak <= kineBoundMB, AtMost: true,
			Note: fmt.Sprintf("%.0f MB private (RssAnon), the largest of the repetitions; the bound is a run on etcd's, %d MB", peak, kineBoundMB)})
	}
	res.LoadAvg = append(res.LoadAvg, loadAvg())
	return res, nil
}

// seedKine writes gen's objects into a new SQLite datastore db through kine
// (kinedb, writable), as kube-apiserver writes: the namespaces and the CRD,
// then every object, each by a create transaction of its own from several
// goroutines, each event with its lease (kine's lease is its TTL).
func seedKine(ctx context.Context, gen *generator, db, priv string) (int, error) {
	if err := os.MkdirAll(priv, 0o700); err != nil {
		return 0, err
	}
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		return 0, err
	}
	srv, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: priv})
	if err != nil {
		return 0, err
	}
	defer srv.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	create := func(key string, value []byte, lease clientv3.LeaseID) error {
		var opts []clientv3.OpOption
		if lease != 0 {
			opts = append(opts, clientv3.WithLease(lease))
		}
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, string(value), opts...)).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("%s exists", key)
		}
		return err
	}
	fixed, err := gen.fixedObjects()
	if err != nil {
		return 0, err
	}
	for k, v := range fixed {
		if err := create(k, v, 0); err != nil {
			return 0, err
		}
	}
	if err := gen.grantLeases(ctx, cli); err != nil {
		return 0, err
	}
	const workers = 4
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for wi := 0; wi < workers; wi++ {
		wg.Add(1)
		go func(wi int) {
			defer wg.Done()
			w := gen.worker()
			for i := wi; i < gen.n; i += workers {
				s := gen.spec(i)
				v, err := w.value(ctx, s)
				if err != nil {
					errs[wi] = err
					return
				}
				var lease clientv3.LeaseID
				if s.kind == kEvent {
					lease = gen.leases[i/eventsPerLs]
				}
				if err := create(s.key, v, lease); err != nil {
					errs[wi] = err
					return
				}
			}
		}(wi)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return gen.n, nil
}

// kineKeys counts the keys under /registry/ of the kine datastore db, as a
// read of it finds them (each one's latest row, not a deletion), read with
// SQL, not through kine.
func kineKeys(ctx context.Context, db string) (int, error) {
	// A busy timeout, as the tool's own read of the file has: kine's
	// server just closed may still be folding its write-ahead log in.
	d, err := sql.Open("sqlite", "file:"+db+"?mode=ro&_pragma=busy_timeout(30000)")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	var n int
	err = d.QueryRowContext(ctx, `SELECT count(*) FROM kine k JOIN (SELECT name, MAX(id) AS id FROM kine GROUP BY name) m ON k.id = m.id WHERE k.deleted = 0 AND k.name LIKE '/registry/%' AND k.name != '/registry/health'`).Scan(&n)
	return n, err
}
