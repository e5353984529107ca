package writerun_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/clusterlock"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/writerun"
)

const (
	prefix = "/registry"
	window = time.Second
	nKeys  = 6
)

// timeline is what happened in a run, in order, as the stage and the
// test's own look at etcd and the files saw it.
type timeline struct {
	mu     sync.Mutex
	events []string
}

func (tl *timeline) add(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, fmt.Sprintf(format, args...))
}

func (tl *timeline) index(t *testing.T, ev string) int {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	i := slices.Index(tl.events, ev)
	if i < 0 {
		t.Fatalf("no %q in the run's timeline %q", ev, tl.events)
	}
	return i
}

func (tl *timeline) before(t *testing.T, a, b string) {
	t.Helper()
	if ia, ib := tl.index(t, a), tl.index(t, b); ia >= ib {
		t.Errorf("%q came after %q: %q", a, b, tl.events)
	}
}

// stage is a writing stage as migrate's is built: the first write through
// guard.FirstWrite with the run's lock and record, a journal whose intents
// are synced before each write, a writer watched by the run's watch. At
// each request it sends, it reads the journal file from disk: the
// request's intents must already be there. afterWrite, when set, runs after
// write i.
type stage struct {
	t          *testing.T
	cli        *clientv3.Client
	tl         *timeline
	afterWrite func(i int)
	lastRev    int64
}

func (s *stage) write(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
	var res writerun.Result
	watch := r.MainWatch()
	if watch == nil {
		s.t.Fatal("a run that writes a live etcd has no watch")
	}
	if r.Dir() == nil {
		s.t.Fatal("the stage's write began before the run directory was made")
	}
	s.tl.add("stage")
	var j *undo.Journal
	first := &guard.FirstWrite{Watch: watch, Client: s.cli, Snapshot: r.Snapshot(), Save: r.SaveSnapshot(),
		Lock: func(ctx context.Context) error {
			err := r.Lock(ctx)
			s.tl.add("lock")
			return err
		},
		Then: func(line string) error {
			s.tl.add("verdict")
			if err := r.Record("", []string{"checks passed", line}); err != nil {
				return err
			}
			var err error
			if j, err = undo.OpenJournal(r.Journal()); err != nil {
				return err
			}
			return j.BeginCommand("test", 0, prefix)
		}}
	defer func() {
		if j != nil {
			j.Close()
		}
	}()
	w := &etcdscan.Writer{Client: s.cli, Kine: r.Kine(), Observer: journalChecked{s, r.Journal(), watch.Observer()}}
	for i := range nKeys {
		if err := first.Open(ctx); err != nil {
			return res, err
		}
		key := fmt.Sprintf("%s/secrets/ns/s%d", prefix, i)
		cur, err := s.cli.Get(ctx, key)
		if err != nil {
			return res, err
		}
		kv := cur.Kvs[0]
		put := etcdscan.Put{Key: key, Value: []byte(fmt.Sprintf("new %d", i)), ModRevision: kv.ModRevision}
		if err := j.Intents([]etcdscan.Put{put}, [][]byte{kv.Value}); err != nil {
			return res, err
		}
		s.tl.add("intent %d", i)
		out := w.Write(ctx, []etcdscan.Put{put})
		if out[0].Status != etcdscan.Written {
			return res, fmt.Errorf("write %s: %v", key, out[0].Err)
		}
		if err := j.Done(out); err != nil {
			return res, err
		}
		s.tl.add("write %d", i)
		s.lastRev = out[0].NewModRevision
		res.Written++
		if s.afterWrite != nil {
			s.afterWrite(i)
		}
		if err := watch.Stopped(); err != nil {
			return res, err
		}
	}
	return res, watch.Settle(ctx)
}

// journalChecked reads the journal from disk before each request is sent:
// every put's intent must be there already.
type journalChecked struct {
	s       *stage
	journal string
	next    etcdscan.Observer
}

func (o journalChecked) Sending(puts []etcdscan.Put) (func(etcdscan.Outcome), error) {
	intents := map[string]bool{}
	if err := undo.ReadJournal(o.journal, func(rec undo.JournalRecord) error {
		if rec.Op == "intent" {
			intents[rec.Key] = true
		}
		return nil
	}); err != nil {
		o.s.t.Errorf("journal %s: %v", o.journal, err)
	}
	for _, p := range puts {
		if !intents[p.Key] {
			o.s.t.Errorf("%s was sent before its intent was in the journal", p.Key)
		}
	}
	return o.next.Sending(puts)
}

// cluster is a real etcd holding nKeys objects, and a state directory.
type cluster struct {
	srv      *testetcd.Server
	cli      *clientv3.Client
	stateDir undo.StateDir
	log      *bytes.Buffer
}

func newCluster(t *testing.T) *cluster {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	for i := range nKeys {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("%s/secrets/ns/s%d", prefix, i), fmt.Sprintf("old %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	return &cluster{srv: srv, cli: cli, stateDir: undo.StateDir(filepath.Join(t.TempDir(), "state")), log: &bytes.Buffer{}}
}

func (c *cluster) config() writerun.Config {
	return writerun.Config{
		Command: "test", Log: c.log, Client: c.cli, Prefix: prefix, Endpoints: c.cli.Endpoints(),
		Undo:     writerun.Undo{StateDir: c.stateDir},
		Liveness: writerun.Liveness{Window: window},
		ExitCode: func(err error) int { return 1 },
	}
}

// values are the keys' values now.
func (c *cluster) values(t *testing.T) []string {
	t.Helper()
	resp, err := c.cli.Get(context.Background(), prefix+"/secrets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out
}

// runs are the runs of the state directory.
func (c *cluster) runs(t *testing.T) []undo.Record {
	t.Helper()
	recs, err := c.stateDir.List()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return recs
}

// TestProtocol drives a stage through Do on a real etcd and checks the
// order of a writing run's steps from what etcd and the files show.
func TestProtocol(t *testing.T) {
	c := newCluster(t)
	tl := &timeline{}
	s := &stage{t: t, cli: c.cli, tl: tl}
	started := time.Now()
	var firstWrite time.Time
	s.afterWrite = func(i int) {
		if i == 0 {
			firstWrite = time.Now()
		}
	}
	if err := writerun.Do(context.Background(), c.config(), writerun.Stage{Write: s.write}); err != nil {
		t.Fatalf("run: %v\n%s", err, c.log)
	}
	tl.before(t, "stage", "lock")
	tl.before(t, "lock", "verdict")
	tl.before(t, "verdict", "intent 0")
	for i := range nKeys {
		tl.before(t, fmt.Sprintf("intent %d", i), fmt.Sprintf("write %d", i))
	}
	// No write before the window's verdict: the window began with the run.
	if d := firstWrite.Sub(started); d < window {
		t.Errorf("the first write came %s after the run started, before its %s window could end", d, window)
	}
	for i, v := range c.values(t) {
		if v != fmt.Sprintf("new %d", i) {
			t.Errorf("key %d: %q, want it written", i, v)
		}
	}

	recs := c.runs(t)
	if len(recs) != 1 {
		t.Fatalf("runs: %+v", recs)
	}
	rec := recs[0]
	// The lock was taken before the snapshot: the snapshot holds the run's
	// holder record (and none of the run's writes).
	f, err := snapshotdb.Open(rec.Snapshot, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	found := false
	if _, err := f.Scan(context.Background(), etcdscan.ScanOptions{Prefixes: []string{clusterlock.HolderPrefix}}, func(page []etcdscan.KV) error {
		found = found || len(page) > 0
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Errorf("the snapshot %s has no holder of the cluster's lock: it was saved before the lock was taken", rec.Snapshot)
	}
	if kv, ok, err := f.Get(context.Background(), prefix+"/secrets/ns/s0", 0); err != nil || !ok || string(kv.Value) != "old 0" {
		t.Errorf("the snapshot's s0: %q %v %v, want the value before the run", kv.Value, ok, err)
	}
	// The finish after the last write: the run's end recorded in etcd at a
	// later revision, the lock released, the run directory finished.
	if rec.ExitCode == nil || *rec.ExitCode != 0 || rec.KeysWritten != nKeys {
		t.Errorf("run directory's record: exit %v, %d keys written", rec.ExitCode, rec.KeysWritten)
	}
	runs, held, err := clusterlock.List(context.Background(), c.cli)
	if err != nil || held != nil || len(runs) != 1 {
		t.Fatalf("cluster's runs %+v, holder %v, %v", runs, held, err)
	}
	resp, err := c.cli.Get(context.Background(), clusterlock.Prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var end int64
	for _, kv := range resp.Kvs {
		end = max(end, kv.ModRevision)
	}
	if end <= s.lastRev {
		t.Errorf("the run's end was recorded in etcd at revision %d, not after its last write (%d)", end, s.lastRev)
	}
	if !runs[0].Finished() || *runs[0].ExitCode != 0 {
		t.Errorf("etcd's record of the run: %+v", runs[0])
	}
}

// TestWriterMidRun: a writer appearing after the run's first write stops
// the run; what it wrote before is journaled, nothing after it is written.
func TestWriterMidRun(t *testing.T) {
	c := newCluster(t)
	s := &stage{t: t, cli: c.cli, tl: &timeline{}}
	s.afterWrite = func(i int) {
		if i == 1 {
			if _, err := c.cli.Put(context.Background(), prefix+"/leases/kube-system/apiserver-x", "a live kube-apiserver"); err != nil {
				t.Error(err)
			}
			time.Sleep(500 * time.Millisecond) // the watch's event arrives
		}
	}
	err := writerun.Do(context.Background(), c.config(), writerun.Stage{Write: s.write})
	if !errors.As(err, new(*liveness.WriterError)) {
		t.Fatalf("run: %v, want it stopped by the writer\n%s", err, c.log)
	}
	vals := c.values(t)
	for i, v := range vals {
		want := fmt.Sprintf("old %d", i)
		if i <= 2 {
			want = fmt.Sprintf("new %d", i) // written before the writer was seen
		}
		if i > 2 && v != want {
			t.Errorf("key %d: %q written after the writer appeared", i, v)
		}
	}
	recs := c.runs(t)
	if len(recs) != 1 || recs[0].ExitCode == nil || *recs[0].ExitCode != 1 {
		t.Fatalf("runs: %+v", recs)
	}
	if _, held, _ := clusterlock.List(context.Background(), c.cli); held != nil {
		t.Errorf("the lock is still held after the run stopped: %v", held)
	}
}

// TestWriterInWindow: a writer during the liveness window refuses the run
// before its first write: nothing written, no snapshot kept.
func TestWriterInWindow(t *testing.T) {
	c := newCluster(t)
	s := &stage{t: t, cli: c.cli, tl: &timeline{}}
	cfg := c.config()
	cfg.Liveness.Window = 3 * time.Second
	go func() {
		time.Sleep(time.Second)
		_, _ = c.cli.Put(context.Background(), prefix+"/leases/kube-system/apiserver-x", "a live kube-apiserver")
	}()
	err := writerun.Do(context.Background(), cfg, writerun.Stage{Write: s.write})
	if err == nil || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("run: %v, want a refusal with nothing written\n%s", err, c.log)
	}
	for i, v := range c.values(t) {
		if v != fmt.Sprintf("old %d", i) {
			t.Errorf("key %d: %q written", i, v)
		}
	}
	recs := c.runs(t)
	if len(recs) != 1 {
		t.Fatalf("runs: %+v", recs)
	}
	if _, err := os.Stat(recs[0].Snapshot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused run's snapshot %s is kept: %v", recs[0].Snapshot, err)
	}
}

// TestHeldRefusedFirst: while another run holds the cluster's lock, a run
// is refused before anything else: no run directory, no stage, nothing
// written anywhere.
func TestHeldRefusedFirst(t *testing.T) {
	c := newCluster(t)
	other := clusterlock.Run{Header: undo.Header{ID: "0001-migrate", Command: "migrate", Host: "another-node", PID: 1, Start: time.Now().UTC()}}
	l, err := clusterlock.Acquire(context.Background(), c.cli, other, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	before, err := c.srv.Revision(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checked := false
	err = writerun.Do(context.Background(), c.config(), writerun.Stage{
		Check: func(context.Context, *writerun.Run) error { checked = true; return nil },
		Write: func(context.Context, *writerun.Run) (writerun.Result, error) {
			t.Error("the stage ran while another run held the lock")
			return writerun.Result{}, nil
		},
	})
	var held *clusterlock.HeldError
	if !errors.As(err, &held) || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("run: %v, want the holder named", err)
	}
	if checked {
		t.Error("the stage's checks ran while another run held the lock")
	}
	if recs := c.runs(t); len(recs) != 0 {
		t.Errorf("a refused run left run directories: %+v", recs)
	}
	if after, _ := c.srv.Revision(context.Background()); after != before {
		t.Errorf("etcd's revision moved from %d to %d: the refused run wrote", before, after)
	}
}

// TestCheckRefusalLeavesNoRunDirectory: a stage's read-only check refusing
// the run leaves no run directory and writes nothing.
func TestCheckRefusalLeavesNoRunDirectory(t *testing.T) {
	c := newCluster(t)
	before, _ := c.srv.Revision(context.Background())
	refusal := errors.New("the journals do not check")
	err := writerun.Do(context.Background(), c.config(), writerun.Stage{
		Check: func(context.Context, *writerun.Run) error { return refusal },
		Write: func(context.Context, *writerun.Run) (writerun.Result, error) {
			t.Error("the stage wrote after its check refused")
			return writerun.Result{}, nil
		},
	})
	if !errors.Is(err, refusal) {
		t.Fatalf("run: %v", err)
	}
	if recs := c.runs(t); len(recs) != 0 {
		t.Errorf("run directories: %+v", recs)
	}
	if after, _ := c.srv.Revision(context.Background()); after != before {
		t.Errorf("etcd's revision moved from %d to %d", before, after)
	}
}

// TestPanicIsRecorded: a stage that panics after its first write ends the
// run as any failure does: Do returns the panic as a *crash.Panic, the run's
// end is recorded with the exit code a crash gives, and the lock is released.
func TestPanicIsRecorded(t *testing.T) {
	c := newCluster(t)
	s := &stage{t: t, cli: c.cli, tl: &timeline{}}
	s.afterWrite = func(i int) {
		if i == 0 {
			panic("a bug of the stage")
		}
	}
	cfg := c.config()
	cfg.ExitCode = func(err error) int {
		if errors.As(err, new(*crash.Panic)) {
			return 70
		}
		return 1
	}
	err := writerun.Do(context.Background(), cfg, writerun.Stage{Write: s.write})
	if !errors.As(err, new(*crash.Panic)) {
		t.Fatalf("run: %v, want the panic as an error", err)
	}
	recs := c.runs(t)
	if len(recs) != 1 || recs[0].ExitCode == nil || *recs[0].ExitCode != 70 {
		t.Fatalf("run directory's record: %+v", recs)
	}
	runs, held, err := clusterlock.List(context.Background(), c.cli)
	if err != nil || held != nil || len(runs) != 1 || !runs[0].Finished() || *runs[0].ExitCode != 70 {
		t.Fatalf("cluster's record %+v, holder %v, %v", runs, held, err)
	}
}

// TestTwoEtcds: a run writing two etcds (a cluster kept in several) has
// each one's watch, and the first write on either waits for the other's
// verdict: a writer in the second etcd's window refuses the run, named by
// that etcd, before anything is written on the first. An etcd added by the
// stage's check has its files recorded once the run directory is made.
func TestTwoEtcds(t *testing.T) {
	c := newCluster(t)
	events := newCluster(t)
	cfg := c.config()
	cfg.Liveness.Window = 3 * time.Second
	go func() {
		time.Sleep(time.Second)
		_, _ = events.cli.Put(context.Background(), prefix+"/events/ns/e1", "a live kube-apiserver's event")
	}()
	var other *writerun.Etcd
	err := writerun.Do(context.Background(), cfg, writerun.Stage{
		Check: func(ctx context.Context, r *writerun.Run) error {
			var err error
			other, err = r.AddEtcd(ctx, writerun.EtcdSpec{Name: "events", Endpoints: events.cli.Endpoints(), Client: events.cli, Prefix: prefix})
			if err == nil && other.Journal != "" {
				t.Errorf("etcd of events: journal %q before the run directory", other.Journal)
			}
			return err
		},
		Write: func(ctx context.Context, r *writerun.Run) (writerun.Result, error) {
			if !strings.HasSuffix(other.Journal, "-events") || filepath.Dir(other.Journal) != filepath.Dir(r.Journal()) {
				t.Errorf("etcd of events: journal %q, the run's %q", other.Journal, r.Journal())
			}
			me, err := r.AddEtcd(ctx, writerun.EtcdSpec{Endpoints: c.cli.Endpoints(), Client: c.cli, Prefix: prefix})
			if err != nil {
				return writerun.Result{}, err
			}
			if me.Watch != r.MainWatch() || me.Journal != r.Journal() {
				t.Errorf("main etcd: not the run's watch and journal")
			}
			if err := r.Ready(ctx, me); err != nil {
				return writerun.Result{}, err
			}
			_, err = c.cli.Put(ctx, prefix+"/secrets/ns/s0", "new")
			return writerun.Result{Written: 1}, err
		},
	})
	var ee *writerun.EtcdError
	if !errors.As(err, &ee) || ee.Label != "etcd of events" {
		t.Fatalf("run: %v, want the etcd of events' writer", err)
	}
	if v := c.values(t)[0]; v != "old 0" {
		t.Errorf("main etcd written: %q", v)
	}
	recs := c.runs(t)
	if len(recs) != 1 || len(recs[0].Etcds) != 1 || recs[0].Etcds[0].Name != "events" || recs[0].Etcds[0].Journal != other.Journal {
		t.Fatalf("runs: %+v", recs)
	}
}
