package writerun_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx": k3s's session
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testmysql"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/writerun"
)

// kineCluster is a SQLite datastore served writable through kine, as a
// writing run on a k3s node serves it, its keys made as kube-apiserver
// makes them.
func kineCluster(t *testing.T) (*cluster, *kinedb.Server) {
	t.Helper()
	srv, cli := testkine.Serve(t)
	for i := range nKeys {
		testkine.Create(t, cli, fmt.Sprintf("%s/secrets/ns/s%d", prefix, i), fmt.Sprintf("old %d", i), 0)
	}
	return &cluster{cli: cli, stateDir: undo.StateDir(filepath.Join(t.TempDir(), "state")), log: &bytes.Buffer{}}, srv
}

func kineConfig(c *cluster, srv *kinedb.Server) writerun.Config {
	cfg := c.config()
	cfg.Kine = srv
	cfg.Endpoints = []string{"sqlite://" + srv.Database}
	return cfg
}

// TestKineRun: a writing run on a SQLite datastore through kine writes every
// key, and its undo's snapshot is a copy of the database (the keys as they
// were, 0600) that the run's record checksums; a second writing run on the
// same file is refused while the first serves it.
func TestKineRun(t *testing.T) {
	c, srv := kineCluster(t)
	_, err := kinedb.Serve(context.Background(), kinedb.Config{Database: srv.Database, Dir: t.TempDir()})
	var locked *kinedb.LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("a second writable serve of %s: %v, want a LockedError", srv.Database, err)
	}
	s := &stage{t: t, cli: c.cli, tl: &timeline{}}
	if err := writerun.Do(context.Background(), kineConfig(c, srv), writerun.Stage{Write: s.write}); err != nil {
		t.Fatalf("run on kine: %v\n%s", err, c.log)
	}
	for i, v := range c.values(t) {
		if want := fmt.Sprintf("new %d", i); v != want {
			t.Errorf("key %d: %q, want %q", i, v, want)
		}
	}
	recs := c.runs(t)
	if len(recs) != 1 || recs[0].ExitCode == nil || *recs[0].ExitCode != 0 {
		t.Fatalf("runs: %+v\n%s", recs, c.log)
	}
	sc, err := undo.CheckSnapshot(recs[0].Snapshot, recs[0].SnapshotSum)
	if err != nil || sc.Problem != "" || !sc.SQLite || !sc.Sealed {
		t.Fatalf("the run's snapshot: %+v, %v; want a SQLite copy verified by its recorded sum", sc, err)
	}
	if fi, err := os.Stat(recs[0].Snapshot); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the snapshot (the cluster's values) %v: mode %v, want 0600", err, fi.Mode())
	}
	// The copy holds the keys as they were before the first write.
	cp, err := kinedb.Serve(context.Background(), kinedb.Config{Database: recs[0].Snapshot, Dir: t.TempDir(), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	cpc, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cpc.Close()
	old := &cluster{cli: cpc}
	for i, v := range old.values(t) {
		if want := fmt.Sprintf("old %d", i); v != want {
			t.Errorf("the snapshot's key %d: %q, want %q", i, v, want)
		}
	}
}

// TestKineWriterMidRun: a process that opens the SQLite datastore during a
// run on it (k3s started: no one writes the file without opening it) stops
// the run before its next write, naming the process.
func TestKineWriterMidRun(t *testing.T) {
	c, srv := kineCluster(t)
	s := &stage{t: t, cli: c.cli, tl: &timeline{}}
	s.afterWrite = func(i int) {
		if i != 1 {
			return
		}
		holder := exec.Command("sh", "-c", `exec 3<"$0"; exec sleep 30`, srv.Database)
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if ps, _ := srv.Others(); len(ps) > 0 {
				break
			}
		}
		time.Sleep(600 * time.Millisecond) // the watch's next look
	}
	err := writerun.Do(context.Background(), kineConfig(c, srv), writerun.Stage{Write: s.write})
	var we *liveness.WriterError
	if !errors.As(err, &we) || !strings.Contains(err.Error(), srv.Database) || !strings.Contains(err.Error(), "sleep (pid") {
		t.Fatalf("run: %v, want it stopped by the process that opened %s\n%s", err, srv.Database, c.log)
	}
	for i, v := range c.values(t) {
		want := fmt.Sprintf("old %d", i)
		if i <= 1 {
			want = fmt.Sprintf("new %d", i) // written before the holder appeared
		}
		if v != want {
			t.Errorf("key %d: %q, want %q", i, v, want)
		}
	}
	recs := c.runs(t)
	if len(recs) != 1 || recs[0].ExitCode == nil || *recs[0].ExitCode != 1 {
		t.Fatalf("runs: %+v", recs)
	}
}

// TestKinePGWatch: on a PostgreSQL datastore served writable through kine,
// the run's watch is the database's other sessions (kinedb's Others): none
// while kine's own pool and lock are in use, and a session that appears
// mid-run (k3s started) stops it, the datastore and the session named.
func TestKinePGWatch(t *testing.T) {
	srv, cli, dsn := testkine.ServePG(t)
	c := &cluster{cli: cli, stateDir: undo.StateDir(filepath.Join(t.TempDir(), "state")), log: &bytes.Buffer{}}
	cfg := c.config()
	cfg.Kine = srv
	var pid int
	err := writerun.Do(context.Background(), cfg, writerun.Stage{Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
		w := r.MainWatch()
		if w == nil {
			t.Fatal("no watch")
		}
		testkine.Create(t, cli, prefix+"/secrets/ns/a", "one", 0)
		time.Sleep(600 * time.Millisecond)
		if err := w.Stopped(); err != nil {
			t.Fatalf("the watch stopped the run, alone: %v", err)
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if err := w.Stopped(); err != nil {
				return writerun.Result{}, err
			}
		}
		return writerun.Result{}, nil
	}})
	var we *liveness.WriterError
	if !errors.As(err, &we) || !strings.Contains(err.Error(), srv.Name()) || !strings.Contains(err.Error(), fmt.Sprintf("session %d of user", pid)) {
		t.Fatalf("run: %v; want it stopped by session %d on %s\n%s", err, pid, srv.Name(), c.log)
	}
	t.Log(err)
}

// TestKineMySQLWatch: as TestKinePGWatch, on a MySQL datastore (a real
// MariaDB): the run's watch is the database's other sessions, none while
// kine's own pool and lock are in use, and a session that appears mid-run
// (k3s started) stops it, the datastore and the session named.
func TestKineMySQLWatch(t *testing.T) {
	srv, cli, ep := testkine.ServeMySQL(t)
	c := &cluster{cli: cli, stateDir: undo.StateDir(filepath.Join(t.TempDir(), "state")), log: &bytes.Buffer{}}
	cfg := c.config()
	cfg.Kine = srv
	var id int
	err := writerun.Do(context.Background(), cfg, writerun.Stage{Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
		w := r.MainWatch()
		if w == nil {
			t.Fatal("no watch")
		}
		testkine.Create(t, cli, prefix+"/secrets/ns/a", "one", 0)
		time.Sleep(600 * time.Millisecond)
		if err := w.Stopped(); err != nil {
			t.Fatalf("the watch stopped the run, alone: %v", err)
		}
		db := testmysql.Open(t, ep)
		defer db.Close()
		if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if err := w.Stopped(); err != nil {
				return writerun.Result{}, err
			}
		}
		return writerun.Result{}, nil
	}})
	var we *liveness.WriterError
	if !errors.As(err, &we) || !strings.Contains(err.Error(), srv.Name()) || !strings.Contains(err.Error(), fmt.Sprintf("session %d of user", id)) {
		t.Fatalf("run: %v; want it stopped by session %d on %s\n%s", err, id, srv.Name(), c.log)
	}
	t.Log(err)
}
