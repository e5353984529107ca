package writerun

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/undo"
)

// Config is what a writing command hands the owner of its run: plain data
// read from its flags, and the few hooks only the command line can fill.
type Config struct {
	// Command names the run ("migrate", "quarantine", "rollback").
	Command string
	// Log is where the run's lines go (the command's standard error).
	Log io.Writer
	// Client is the cluster's etcd the run writes to (the main one of a
	// cluster kept in several): its lock and the run's record there. nil: the
	// run writes no live etcd (a backup file read in place).
	Client *clientv3.Client
	// Prefix is kube-apiserver's prefix there; Endpoints the etcd's, for
	// the run's record.
	Prefix    string
	Endpoints []string
	// DryRun: the run decides and writes nothing: no lock, no run
	// directory, no watch.
	DryRun bool
	// Private: the run writes a private copy, or the output, of a backup
	// file, never the cluster's etcd: no lock, no run directory (the backup
	// is the undo), no watch.
	Private bool
	// Undo is where the run keeps its undo.
	Undo Undo
	// Liveness is the watch's setting for the whole run.
	Liveness Liveness
	// Since, for a rollback of runs, is the oldest run undone: the runs of
	// the cluster on other hosts after it are named before anything else.
	Since *undo.Record
	// Attach, when set, is given the run directory's output file (OutputFile)
	// as soon as the directory is made, to write what the command prints
	// there from its first line; it owns the file.
	Attach func(*os.File) error
	// ExitCode is the exit code an error of the stage gives, recorded in
	// the run directory and in etcd at the finish.
	ExitCode func(error) int
	// Spell names the operator's inputs in the run's warning lines.
	Spell func(input.Name) string
	// Kine, when set, is the SQLite datastore the run writes, served
	// through kine in this process (Client is its client): no other
	// process holds the file and kinedb holds its flock, which is the
	// run's lock (nothing of the run is recorded in the datastore); the
	// run's watch is the file's holders (guard.StartProbeWatch: no one
	// writes it without opening it), whatever Liveness says; its snapshot
	// a consistent copy of the database (SaveSnapshot). On a PostgreSQL
	// datastore the lock is kinedb's advisory lock (seen from every host),
	// the watch the database's other sessions (Others), and there is no
	// snapshot: the run directory records none (Snapshot is ""), the
	// journal is the undo.
	Kine *kinedb.Server
}

// Liveness is how the run's liveness watch judges others' writes.
type Liveness struct {
	// Allow: no watch (--allow-live-apiserver).
	Allow bool
	// Window is how long etcd is watched before the first write; 0:
	// liveness.DefaultWindow.
	Window time.Duration
}

func (l Liveness) options() guard.PreflightOptions {
	return guard.PreflightOptions{AllowLiveAPIServer: l.Allow, LivenessWindow: l.Window}
}

// Result is what a stage wrote, for the run's record.
type Result struct {
	// Written counts the keys written.
	Written int64
	// Summary is the run's report, kept in its run directory (nil: none).
	Summary any
}

// Stage is a writing command's work, handed to Do. Check, when set, runs
// before the run directory exists and may only read (a rollback reads its
// journals whole there); Write does the work through Run: it hands Run's
// Lock and Record to the first write (guard.FirstWrite) and writes with Run's
// journal, snapshot and watch. The error Write returns is the command's
// outcome, whose exit code the run records.
type Stage struct {
	Check func(ctx context.Context, r *Run) error
	Write func(ctx context.Context, r *Run) (Result, error)
}

// Run is one writing run while Do holds it: what a stage writes with.
type Run struct {
	cfg  Config
	hold *hold
	dir  *dir

	mu      sync.Mutex
	main    *guard.Watch
	watches []*guard.Watch
	checks  map[string][]string
	order   []string
	etcds   []*Etcd

	ready    sync.Once
	readyErr error
}

// Do is a writing run from its start to its finish, in this order:
//
//  1. The cluster's lock is read: while another run holds it, the run is
//     refused before it reads anything else, and nothing is written
//     anywhere (a killed predecessor of this host is reclaimed).
//  2. The liveness watch of the main etcd starts, so that its window runs
//     while everything after it goes on (the stage starts one for each
//     other etcd it writes through Watch).
//  3. The stage's Check, read-only: a refusal leaves no run directory.
//  4. The run directory is made, before anything is written, and named on
//     Log: a run killed from here on is listed and rolled back.
//  5. The stage's Write. Its first write goes through guard.FirstWrite with
//     Lock (the cluster's lock is taken before the snapshot starts, so two
//     runs never both snapshot and write) and Record (the checks passed
//     and the window's verdict, in the run directory before the journal
//     opens); the journal makes each record durable before its write, and
//     the watch stops the run at another writer.
//  6. The finish, after the stage's last write (or its panic, returned as a
//     *crash.Panic): the watches close, the run's end and exit code are
//     recorded in etcd (the lock released) and in the run directory (its
//     state directory released).
//
// On a SQLite datastore served through kine (Config.Kine) the same order
// holds with SQLite's counterparts: the lock is the file's (kinedb's flock,
// taken when it was served; nothing is recorded in the datastore), the
// watch is the file's holders, the snapshot a copy of the database. On a
// PostgreSQL datastore: the lock is kinedb's advisory lock on the database
// (seen by every host), the watch the other clients connected to it, and
// there is no snapshot: the journal is the undo. On MySQL the same, the
// lock a user lock (GET_LOCK).
func Do(ctx context.Context, cfg Config, st Stage) (err error) {
	r, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	var res Result
	defer func() { r.finish(res, err) }()
	// A panic of the stage is the run's outcome too: recorded at the finish
	// (the lock released, the run's end written), then the command's to say.
	defer crash.Recover("running "+cfg.Command, &err)
	if st.Check != nil {
		if err := st.Check(ctx, r); err != nil {
			return err
		}
	}
	if err := r.open(); err != nil {
		return err
	}
	res, err = st.Write(ctx, r)
	return err
}

// start is steps 1 and 2.
func start(ctx context.Context, cfg Config) (*Run, error) {
	r := &Run{cfg: cfg, checks: map[string][]string{}}
	stateDir := ""
	if !cfg.Undo.None {
		stateDir = string(cfg.Undo.StateDir)
	}
	r.hold = newHold(cfg.Log, cfg.Client, cfg.Prefix, cfg.Command, stateDir, cfg.DryRun || cfg.Private || cfg.Kine != nil)
	if r.hold != nil {
		r.hold.since = cfg.Since
	}
	if err := r.hold.checkFree(ctx); err != nil {
		return nil, err
	}
	main, err := r.Watch(ctx, cfg.Client, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	r.main = main
	return r, nil
}

// Kine says whether the run writes a SQLite datastore through kine: its
// writer takes one key per transaction (etcdscan.Writer's Kine).
func (r *Run) Kine() bool { return r.cfg.Kine != nil }

// SaveSnapshot is how the run's snapshot is saved (guard.FirstWrite's
// Save): nil for etcd's own snapshot; on SQLite through kine, a
// consistent copy of the database (kinedb.Copy, while kine serves it) with
// its sum. On PostgreSQL and MySQL there is none (Snapshot is "").
func (r *Run) SaveSnapshot() func(ctx context.Context, path string) (undo.FileSum, error) {
	k := r.cfg.Kine
	if k == nil {
		return nil
	}
	return func(ctx context.Context, path string) (undo.FileSum, error) {
		if !k.SQLite() {
			// Never asked for (the run's Snapshot is ""): said, not etcd's.
			dump := "pg_dump"
			if k.Kind() == "MySQL" {
				dump = "mysqldump"
			}
			return undo.FileSum{}, fmt.Errorf("%s: the tool takes no snapshot of a %s datastore (its undo is the journal; back the database up with %s)", k.Name(), k.Kind(), dump)
		}
		if err := kinedb.Copy(ctx, k.Database, path); err != nil {
			return undo.FileSum{}, err
		}
		d, err := snapshotdb.Digest(path)
		return undo.FileSum{Bytes: d.Size, SHA256: d.SHA256}, err
	}
}

// writesLive says whether the run writes a live etcd.
func (r *Run) writesLive() bool {
	return !r.cfg.DryRun && !r.cfg.Private && r.cfg.Client != nil
}

// open is step 4.
func (r *Run) open() error {
	if r.cfg.DryRun || r.cfg.Private {
		return nil
	}
	u := r.cfg.Undo
	if k := r.cfg.Kine; k != nil && !k.SQLite() {
		u.noSnapshot = k.Name()
	}
	d, err := openDir(r.cfg.Log, u, r.cfg.Command, r.cfg.Endpoints, r.cfg.Prefix, r.cfg.Attach, r.cfg.Spell)
	if err != nil {
		return err
	}
	r.dir = d
	if r.hold != nil {
		r.hold.dir = d
	}
	r.mu.Lock()
	etcds := append([]*Etcd(nil), r.etcds...)
	r.mu.Unlock()
	for _, e := range etcds {
		if err := r.place(e); err != nil {
			return err
		}
	}
	return nil
}

// finish is step 6.
func (r *Run) finish(res Result, err error) {
	r.mu.Lock()
	ws := r.watches
	r.watches = nil
	r.mu.Unlock()
	for _, w := range ws {
		w.Close()
	}
	code := 0
	if err != nil {
		code = 1
		if r.cfg.ExitCode != nil {
			code = r.cfg.ExitCode(err)
		}
	}
	r.hold.finish(code, res.Written)
	r.dir.finish(r.cfg.Log, code, res.Written, res.Summary, r.cfg.Spell)
}

// MainWatch is the liveness watch of the main etcd (Do's, step 2): nil for
// a run that writes no live etcd or that may write beside a live
// kube-apiserver.
func (r *Run) MainWatch() *guard.Watch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.main
}

// Watch starts the liveness watch of another etcd the run writes to (one of
// a cluster kept in several), under prefix; nil as MainWatch is. Closed at
// the run's finish.
func (r *Run) Watch(ctx context.Context, cli *clientv3.Client, prefix string) (*guard.Watch, error) {
	if !r.writesLive() {
		return nil, nil
	}
	var w *guard.Watch
	var err error
	if k := r.cfg.Kine; k != nil {
		w = guard.StartProbeWatch(k.Name(), !k.SQLite(), func() (string, error) {
			ps, err := k.Others()
			var who []string
			for _, p := range ps {
				who = append(who, p.String())
			}
			return strings.Join(who, ", "), err
		})
	} else {
		w, err = guard.StartWatch(ctx, cli, prefix, r.cfg.Liveness.options())
	}
	if err != nil || w == nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watches = append(r.watches, w)
	return w, nil
}
