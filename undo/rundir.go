// The state directory and its run directories. A state directory (by default
// /var/lib/kube-etcd-migrate, mode 0700: it holds stored values, secrets among
// them) holds one run directory per writing run, numbered in the order the runs
// started on this host: the run's record (run.json: command, start and end,
// exit code, keys written, where its journal and snapshot are, and, from its
// end, their checksums and the encryption keys its journal's values need),
// its journal of
// old values, the etcd snapshot taken before its first write, its plan (the
// checks it passed before writing), its summary and its output as printed
// (output.log); beside the run directories, a log of every run's start and
// end (runs.log). A run holds a lock on its directory (flock) while it goes
// on: a run with no end recorded is running while the lock is held, and was
// killed once it is not (Record.State). A run directory
// is created before anything is written and never reused, nor is its number
// once the directory is removed; a snapshot file that exists is never
// replaced, so the state before the first of several reruns stays on disk. One
// writing run at a time holds the state directory's lock. Listing the runs and
// undoing run N and every later one (newest first) start from here: see List
// and Since, which refuses when a later run that may have written is gone (its
// undo with it).

package undo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kube-etcd-migrate/snapshotdb"
)

// DefaultStateDir is where runs keep their undo unless told otherwise.
const DefaultStateDir = "/var/lib/kube-etcd-migrate"

// EnvStateDir names the environment variable that sets the state directory
// when no flag does.
const EnvStateDir = "KUBE_ETCD_MIGRATE_STATE_DIR"

// The files of a run directory.
const (
	RecordFile   = "run.json"
	JournalFile  = "journal"
	SnapshotFile = "snapshot.db"
	PlanFile     = "plan.txt"
	SummaryFile  = "summary.json"
	// OutputFile is what the run printed, stdout and stderr interleaved as
	// a terminal shows them (the command line writes it).
	OutputFile = "output.log"
	runsDir    = "runs"
	lockFile   = "lock"
	// logFile records each run's start and end in the state
	// directory itself, so that a run directory removed by hand (the newest
	// one too) is seen as missing, what it wrote is still known, and its
	// number is never given again.
	logFile = "runs.log"
)

// Header is what names a writing run and says how it ended, wherever the
// run is recorded: its run directory's run.json (Record) and the cluster's
// record of it in etcd (clusterlock.Run) carry it alike.
type Header struct {
	ID      string    `json:"id"`
	Command string    `json:"command"`
	Start   time.Time `json:"start"`
	// End and ExitCode are absent while the run is going on, and for ever when
	// it was killed: then its journal still says what it wrote.
	End      *time.Time `json:"end,omitempty"`
	ExitCode *int       `json:"exitCode,omitempty"`
	// KeysWritten counts the keys the run wrote or removed, as its summary
	// says (a killed run's journal may hold more).
	KeysWritten int64 `json:"keysWritten"`
	// Journal and Snapshot are its undo's files (the main etcd's).
	Journal  string `json:"journal"`
	Snapshot string `json:"snapshot,omitempty"`
	// Host and PID are the host and process that ran it.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
}

// Finished says whether the run recorded its end.
func (h Header) Finished() bool { return h.End != nil && h.ExitCode != nil }

// Record is what run.json says of a run.
type Record struct {
	Header
	Seq       int      `json:"seq"`
	Dir       string   `json:"dir"`
	Endpoints []string `json:"endpoints,omitempty"`
	Prefix    string   `json:"prefix,omitempty"`
	// Undoes names the runs a rollback run undid, newest first.
	Undoes []string `json:"undoes,omitempty"`
	// JournalSum and SnapshotSum are the checksums of the run's journal and
	// snapshot, recorded at its end (none for a killed run, a file not on
	// disk then, or a run of a release before checksums): what a rollback
	// and 'runs --verify' compare the files with.
	JournalSum  *FileSum `json:"journalSum,omitempty"`
	SnapshotSum *FileSum `json:"snapshotSum,omitempty"`
	// UndoNeedsKeys are the encryption providers and keys of the old values
	// its journal holds, what a rollback puts back ("aescbc:key1",
	// "identity"), recorded at its end: kube-apiserver's configuration
	// must read them for as long as the undo is kept.
	UndoNeedsKeys []string `json:"undoNeedsKeys,omitempty"`
	// Output is the file the run's output is saved in (OutputFile).
	Output string `json:"output,omitempty"`
	// Etcds are the run's undo in the cluster's other etcds (kube-apiserver's
	// --etcd-servers-overrides: kops' etcd-events): a journal and snapshot
	// each, in the same run directory. Journal, Snapshot and Endpoints above
	// are the main etcd's.
	Etcds []RunEtcd `json:"etcds,omitempty"`
}

// RunEtcd is a run's undo in one of the cluster's other etcds.
type RunEtcd struct {
	// Name names the etcd by the resources kept there ("events").
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints,omitempty"`
	Journal   string   `json:"journal"`
	Snapshot  string   `json:"snapshot,omitempty"`
	// JournalSum, SnapshotSum and UndoNeedsKeys are as the Record's.
	JournalSum    *FileSum `json:"journalSum,omitempty"`
	SnapshotSum   *FileSum `json:"snapshotSum,omitempty"`
	UndoNeedsKeys []string `json:"undoNeedsKeys,omitempty"`
}

// InEtcd is the record as one of its other etcds sees it: r with that
// etcd's journal, snapshot, endpoints and checksums (false: r has no etcd
// of that name). Everything that reads a run's undo reads it so.
func (r Record) InEtcd(name string) (Record, bool) {
	for _, e := range r.Etcds {
		if e.Name != name {
			continue
		}
		v := r
		v.Etcds = nil
		v.Journal, v.Snapshot, v.Endpoints = e.Journal, e.Snapshot, e.Endpoints
		v.JournalSum, v.SnapshotSum, v.UndoNeedsKeys = e.JournalSum, e.SnapshotSum, e.UndoNeedsKeys
		return v, true
	}
	return Record{}, false
}

// Finished says whether the run recorded its end.

// A run's states (State).
const (
	StateRunning  = "running"
	StateFinished = "finished"
	StateKilled   = "killed"
)

// State says whether the run is running (no end recorded, and its process
// holds the lock of its run directory), finished (its end recorded), or
// killed (no end recorded, and nothing holds its lock: the process is gone;
// its journal says what it wrote). The lock is tested, never taken for
// longer than the test.
func (r Record) State() string {
	if r.Finished() {
		return StateFinished
	}
	d, err := os.Open(r.Dir)
	if err != nil {
		return StateRunning // cannot tell: not called killed
	}
	defer d.Close()
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return StateRunning // held (EWOULDBLOCK), or cannot tell
	}
	_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
	return StateKilled
}

// SnapshotTaken says whether the run's snapshot file is on disk.
func (r Record) SnapshotTaken() bool {
	if r.Snapshot == "" {
		return false
	}
	_, err := os.Stat(r.Snapshot)
	return err == nil
}

// StateDir is a state directory as the operator names it (--state-dir, else
// $KUBE_ETCD_MIGRATE_STATE_DIR, else DefaultStateDir): the command line
// resolves it once and hands it on. "" is none: a run without an undo.
type StateDir string

// NextRunFiles are where a new run's journal and snapshot would be, as far
// as their filesystem goes: in the nearest directory of the state
// directory's runs that exists. Nothing is made: it is for the checks of
// disk space made before a run directory exists (plan).
func (d StateDir) NextRunFiles() (journal, snapshot string) {
	dir := existing(filepath.Join(string(d), runsDir))
	return filepath.Join(dir, JournalFile), filepath.Join(dir, SnapshotFile)
}

// existing is dir, or its nearest ancestor that exists.
func existing(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

// State is an open state directory: it holds the lock that keeps a second
// writing run out until Close.
type State struct {
	Dir  string
	lock *os.File
}

// LockedError says another run holds the state directory.
type LockedError struct{ Dir, Holder string }

func (e *LockedError) Error() string {
	s := fmt.Sprintf("state directory %s is in use by another run", e.Dir)
	if e.Holder != "" {
		s += " (" + e.Holder + ")"
	}
	return s + "; one writing run at a time: wait for it to end"
}

// Open creates the state directory if needed (mode 0700), refuses one that
// others may read, and takes its lock.
func (d StateDir) Open() (*State, error) {
	dir := string(d)
	if dir == "" {
		return nil, errors.New("no state directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(abs, runsDir), 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", abs, err)
	}
	if err := private(abs); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(abs, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", abs, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(f.Name())
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &LockedError{Dir: abs, Holder: strings.TrimSpace(string(holder))}
		}
		return nil, fmt.Errorf("state directory %s: lock: %w", abs, err)
	}
	host, _ := os.Hostname()
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d on %s since %s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))), 0)
	return &State{Dir: abs, lock: f}, nil
}

// Check says, without changing anything, whether a writing run could keep its
// undo in the state directory now: it is private if it exists, and no
// run holds it. A directory that does not exist yet is fine (the run makes it).
func (d StateDir) Check() error {
	dir := string(d)
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	if _, err := os.Stat(abs); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := private(abs); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(abs, lockFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state directory %s: %w", abs, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(f.Name())
		return &LockedError{Dir: abs, Holder: strings.TrimSpace(string(holder))}
	}
	return nil
}

// private refuses a directory that others than its owner may read or enter.
func private(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("state directory %s has mode %v: it will hold stored values (secrets among them); make it private first (chmod 700 %s)", dir, perm, dir)
	}
	return nil
}

// Close releases the lock.
func (s *State) Close() error {
	if s == nil || s.lock == nil {
		return nil
	}
	_ = s.lock.Truncate(0)
	err := s.lock.Close() // closing the file releases the flock
	s.lock = nil
	return err
}

// Run is a run directory being written.
type Run struct {
	Record
	stateDir string
	// lock holds the run directory's flock while the run goes on (State).
	lock *os.File
}

// NewRun creates the next run directory for command (mode 0700) and its record.
// Nothing in an earlier run's directory is touched.
func (s *State) NewRun(command string, endpoints []string, prefix string) (*Run, error) {
	recs, err := StateDir(s.Dir).List()
	if err != nil {
		return nil, err
	}
	seq := 1
	if len(recs) > 0 {
		seq = recs[len(recs)-1].Seq + 1
	}
	log, err := readLog(s.Dir)
	if err != nil {
		return nil, err
	}
	seq = max(seq, log.newest+1)
	for {
		id := fmt.Sprintf("%04d-%s", seq, command)
		dir := filepath.Join(s.Dir, runsDir, id)
		err := os.Mkdir(dir, 0o700)
		if errors.Is(err, fs.ErrExist) {
			seq++ // a directory without a readable record: never reused
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("run directory %s: %w", dir, err)
		}
		// The run holds its directory's lock until its end: a run with no
		// end recorded is running while it is held, killed once it is not.
		// (Blocking: a 'runs' may be testing it that instant.)
		lock, err := os.Open(dir)
		if err == nil {
			if err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
				lock.Close()
			}
		}
		if err != nil {
			os.Remove(dir)
			return nil, fmt.Errorf("run directory %s: lock: %w", dir, err)
		}
		if err := appendLog(s.Dir, logEntry{ID: id, Seq: seq, Event: "start"}); err != nil {
			lock.Close()
			os.Remove(dir)
			return nil, err
		}
		host, _ := os.Hostname()
		r := &Run{Record: Record{
			Header: Header{ID: id, Command: command, Start: time.Now().UTC().Truncate(time.Second),
				Journal: filepath.Join(dir, JournalFile), Snapshot: filepath.Join(dir, SnapshotFile), Host: host, PID: os.Getpid()},
			Seq: seq, Dir: dir, Endpoints: endpoints, Prefix: prefix,
		}, stateDir: s.Dir, lock: lock}
		if err := r.save(); err != nil {
			lock.Close()
			return nil, err
		}
		return r, nil
	}
}

// Path is a file of the run directory.
func (r *Run) Path(name string) string { return filepath.Join(r.Dir, name) }

// WritePlan records the checks the run passed before its first write.
func (r *Run) WritePlan(lines []string) error {
	return writeFile(r.Path(PlanFile), []byte(strings.Join(lines, "\n")+"\n"))
}

// Finish records the run's end, its exit code, the keys it wrote and its
// summary (any JSON value; nil: none), and the checksums of its journal and
// snapshot, each read whole once (Seal).
func (r *Run) Finish(exitCode int, keysWritten int64, summary any) error {
	err := r.Seal()
	end := time.Now().UTC().Truncate(time.Second)
	r.End, r.ExitCode, r.KeysWritten = &end, &exitCode, keysWritten
	if summary != nil {
		b, merr := json.MarshalIndent(summary, "", "  ")
		if merr == nil {
			merr = writeFile(r.Path(SummaryFile), append(b, '\n'))
		}
		if err == nil {
			err = merr
		}
	}
	if serr := r.save(); err == nil {
		err = serr
	}
	// A run opens its journal once its checks pass, before its first
	// write: one without a journal was refused, or stopped, before writing.
	_, jerr := os.Stat(r.Journal)
	logged := logEntry{ID: r.ID, Seq: r.Seq, Event: "end", ExitCode: &exitCode, KeysWritten: keysWritten, Journaled: r.Journal != "" && jerr == nil}
	if lerr := appendLog(r.stateDir, logged); err == nil {
		err = lerr
	}
	r.Release()
	return err
}

// Seal sets the checksums of the run's journal and snapshot, as they are
// now that the run has stopped writing them, and the keys the journal's
// values need (JournalSum, SnapshotSum, UndoNeedsKeys): those this process
// took as it wrote each file, when the file is still the one it wrote (its
// size and modification time), else read from the file whole. A journal
// read that does not verify even now is an error, and gets no checksum.
func (r *Run) Seal() error {
	err := r.seal()
	for i, e := range r.Etcds {
		v, _ := r.InEtcd(e.Name)
		view := &Run{Record: v}
		if serr := view.seal(); serr != nil && err == nil {
			err = fmt.Errorf("%s: %w", e.Name, serr)
		}
		r.Etcds[i].JournalSum, r.Etcds[i].SnapshotSum, r.Etcds[i].UndoNeedsKeys = view.JournalSum, view.SnapshotSum, view.UndoNeedsKeys
	}
	return err
}

// seal is Seal of the main etcd's files.
func (r *Run) seal() error {
	var err error
	if _, serr := os.Stat(r.Journal); r.Journal != "" && serr == nil {
		if ws, ok := recall(r.Journal); ok && ws.needsKnown {
			sum := ws.sum
			r.JournalSum, r.UndoNeedsKeys = &sum, ws.needs
		} else if jc, jerr := CheckJournal(context.Background(), JournalSpec{Path: r.Journal}, CheckOptions{Prefix: r.Prefix}); jerr != nil {
			err = fmt.Errorf("run %s: its journal does not verify at its end: %w", r.ID, jerr)
		} else {
			r.JournalSum = &FileSum{Bytes: jc.Bytes, SHA256: jc.SHA256, Records: jc.Records}
			r.UndoNeedsKeys = jc.NeedsKeys()
		}
	}
	if r.SnapshotTaken() {
		if ws, ok := recall(r.Snapshot); ok {
			sum := ws.sum
			r.SnapshotSum = &sum
		} else if d, derr := snapshotdb.Digest(r.Snapshot); derr != nil && err == nil {
			err = derr
		} else if derr == nil {
			r.SnapshotSum = &FileSum{Bytes: d.Size, SHA256: d.SHA256}
		}
	}
	return err
}

// Release lets go of the run directory's lock (Finish does): a run that
// recorded no end is then killed as far as State goes.
func (r *Run) Release() {
	if r.lock != nil {
		r.lock.Close()
		r.lock = nil
	}
}

// OpenOutput creates the file the run's output is saved in (OutputFile,
// mode 0600) and records it.
func (r *Run) OpenOutput() (*os.File, error) {
	path := r.Path(OutputFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	r.Output = path
	if err := r.save(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// SetSnapshot records where the run's snapshot is (an explicit --snapshot).
func (r *Run) SetSnapshot(path string) error { r.Snapshot = path; return r.save() }

// SetJournal records where the run's journal is (an explicit --journal).
func (r *Run) SetJournal(path string) error { r.Journal = path; return r.save() }

// AddEtcd records the undo of the run in another etcd of the cluster.
func (r *Run) AddEtcd(e RunEtcd) error { r.Etcds = append(r.Etcds, e); return r.save() }

// SetUndoes records the runs a rollback undoes.
func (r *Run) SetUndoes(ids []string) error { r.Undoes = ids; return r.save() }

func (r *Run) save() error {
	b, err := json.MarshalIndent(r.Record, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(r.Path(RecordFile), append(b, '\n'))
}

// writeFile replaces path atomically (mode 0600).
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("run directory: %s: %w", path, err)
	}
	return nil
}

// The state directory's log (runs.log) has a JSON line when each run starts
// and one when it ends, appended and synced before the run goes on. It
// outlives the run directories: a directory removed by hand is still known
// by its ID, its number is never given again, and a run that ended having
// written nothing is known to need no undo.
