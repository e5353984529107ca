package undo

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// List reads the runs of a state directory, oldest first. A state directory
// that does not exist has no runs. A directory whose record does not read is
// listed by its name with the error in Command and the journal and snapshot
// of its directory, so that nothing is hidden from runs or rollback.
func (d StateDir) List() ([]Record, error) {
	stateDir := string(d)
	dir := filepath.Join(stateDir, runsDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	var out []Record
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		seq := seqOf(e.Name())
		if seq == 0 {
			continue // not a run directory
		}
		var rec Record
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), RecordFile))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err == nil && (rec.ID != e.Name() || rec.Seq != seq) {
			// Damaged: which run it is comes from its directory.
			err = fmt.Errorf("%s: it says run %q (number %d), in the directory of run %s", RecordFile, rec.ID, rec.Seq, e.Name())
		}
		if err != nil {
			// Its journal and snapshot are where a run keeps them by default:
			// a rollback still finds them.
			rd := filepath.Join(dir, e.Name())
			rec = Record{Header: Header{ID: e.Name(), Command: "unreadable record: " + err.Error(),
				Journal: filepath.Join(rd, JournalFile), Snapshot: filepath.Join(rd, SnapshotFile)}, Seq: seq, Dir: rd}
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// Holds says whether the directory is a state directory: it has the runs
// directory or the log of runs a writing run makes.
func (d StateDir) Holds() bool {
	if fi, err := os.Stat(filepath.Join(string(d), runsDir)); err == nil && fi.IsDir() {
		return true
	}
	_, err := os.Stat(filepath.Join(string(d), logFile))
	return err == nil
}

// RunOfJournal is the run of the state directory whose journal is the file
// at path (nil when none is, or the runs cannot be read).
func (d StateDir) RunOfJournal(path string) *Record {
	recs, err := d.List()
	if err != nil {
		return nil
	}
	want, err := os.Stat(path)
	if err != nil {
		return nil
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if fi, err := os.Stat(recs[i].Journal); err == nil && os.SameFile(fi, want) {
			return &recs[i]
		}
	}
	return nil
}

// RunOfEtcdJournal is the run whose journal in another etcd of the cluster
// (Record.Etcds) is the file at path, as that etcd sees it (InEtcd), and
// that etcd's name; nil when none.
func (d StateDir) RunOfEtcdJournal(path string) (*Record, string) {
	recs, err := d.List()
	if err != nil {
		return nil, ""
	}
	want, err := os.Stat(path)
	if err != nil {
		return nil, ""
	}
	for i := len(recs) - 1; i >= 0; i-- {
		for _, e := range recs[i].Etcds {
			if fi, err := os.Stat(e.Journal); err == nil && os.SameFile(fi, want) {
				v, _ := recs[i].InEtcd(e.Name)
				return &v, e.Name
			}
		}
	}
	return nil, ""
}

// NotFoundError says no run has the ID asked for.
type NotFoundError struct{ ID, StateDir string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no run %q in %s ('kube-etcd-migrate runs' lists them)", e.ID, e.StateDir)
}

// GapError says that runs created after the one asked for are gone from the
// state directory (their directories were removed) and may have written: what
// they wrote can no longer be undone, so undoing the run asked for and every
// later one would leave it in place.
type GapError struct {
	StateDir string
	// From is the run asked for; Missing the runs after it that are gone and
	// not known to have written nothing, by ID where the state directory
	// still knows it, else by number ("0002").
	From    Record
	Missing []string
	// Next is the oldest run listed after the last missing one ("" when none).
	Next string
}

func (e *GapError) Error() string {
	runs := "run " + e.Missing[0] + " is"
	switch n := len(e.Missing); {
	case n > 10:
		runs = fmt.Sprintf("runs %s, … %s (%d) are", strings.Join(e.Missing[:5], ", "), e.Missing[n-1], n)
	case n > 1:
		runs = "runs " + strings.Join(e.Missing, ", ") + " are"
	}
	return fmt.Sprintf("%s missing from %s (removed after run %s): what it wrote cannot be undone, so undoing run %s and every later run would leave that in place",
		runs, filepath.Join(e.StateDir, runsDir), e.From.ID, e.From.ID)
}

// Since returns run id and every later run, oldest first. id may be the
// full ID ("0003-migrate") or its number ("3"). A run created after it whose
// directory is gone is a GapError (the undo would be incomplete), unless the
// state directory's log says it ended having written nothing.
func (d StateDir) Since(id string) ([]Record, error) {
	stateDir := string(d)
	recs, err := d.List()
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if r.ID == id || strconv.Itoa(r.Seq) == strings.TrimLeft(id, "0") {
			missing, err := d.Missing(recs[i:])
			if err != nil {
				return nil, err
			}
			ge := &GapError{StateDir: stateDir, From: r}
			last := 0
			for _, m := range missing {
				if !m.WroteNothing {
					ge.Missing = append(ge.Missing, m.ID)
					last = m.Seq
				}
			}
			if len(ge.Missing) == 0 {
				return recs[i:], nil
			}
			for _, later := range recs[i:] {
				if later.Seq > last {
					ge.Next = later.ID
					break
				}
			}
			return nil, ge
		}
	}
	return nil, &NotFoundError{ID: id, StateDir: stateDir}
}

// MissingRun is a run whose directory is gone.
type MissingRun struct {
	// ID as the state directory's log knows it, else the number ("0002").
	ID  string `json:"id"`
	Seq int    `json:"seq"`
	// WroteNothing: the log records its end with no journal (the run was
	// refused, or stopped, before its first write) and no key written.
	WroteNothing bool `json:"wroteNothing,omitempty"`
}

// maxMissingRuns bounds what Missing lists: each run is numbered one after
// the newest, so more missing runs than that are a number damaged in the log
// or a directory named by hand, not runs that ran.
const maxMissingRuns = 1000

// Missing lists the runs created after the first of recs (as List gives
// them) whose directories are gone: a number between two listed runs, or up
// to the newest run the state directory's log records, that no entry of its
// runs directory carries; the first maxMissingRuns of them.
func (d StateDir) Missing(recs []Record) ([]MissingRun, error) {
	stateDir := string(d)
	if len(recs) == 0 {
		return nil, nil
	}
	log, err := readLog(stateDir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(stateDir, runsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	taken := map[int]bool{}
	for _, e := range ents {
		// Any entry holds its number: NewRun passes over a name that exists.
		if seq := seqOf(e.Name()); seq > 0 {
			taken[seq] = true
		}
	}
	var out []MissingRun
	for seq := recs[0].Seq + 1; seq <= max(recs[len(recs)-1].Seq, log.newest) && len(out) < maxMissingRuns; seq++ {
		if taken[seq] {
			continue
		}
		m := MissingRun{ID: fmt.Sprintf("%04d", seq), Seq: seq}
		if run, ok := log.runs[seq]; ok {
			m.ID, m.WroteNothing = run.ID, run.ended && run.wroteNothing
		}
		out = append(out, m)
	}
	return out, nil
}

// seqOf is the number a run directory's name starts with (0 when none).
func seqOf(name string) int {
	seq, err := strconv.Atoi(strings.SplitN(name, "-", 2)[0])
	if err != nil || seq < 0 {
		return 0
	}
	return seq
}

// logEntry is one line of the log.
type logEntry struct {
	ID          string `json:"id"`
	Seq         int    `json:"seq"`
	Event       string `json:"event"` // "start" or "end"
	ExitCode    *int   `json:"exitCode,omitempty"`
	KeysWritten int64  `json:"keysWritten,omitempty"`
	// Journaled: the run's journal was on disk at its end (a write may
	// have landed even when KeysWritten, the writes confirmed, is 0).
	Journaled bool `json:"journaled,omitempty"`
}

// maxLogLine bounds a line of the log: its lines are a few hundred bytes,
// and a longer one (a block of zeros a crash left, bytes appended by hand)
// is passed over as a torn line is, without holding it.
const maxLogLine = 64 << 10

// nextLine reads the next line of r without its newline, or nil for one
// longer than max (read through, not kept); io.EOF after the last line.
func nextLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	long := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !long {
			if len(line)+len(chunk) > max+1 {
				long, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	}
}

// appendLog appends e to the state directory's log and syncs it, on a line
// of its own after a torn last line.
func appendLog(stateDir string, e logEntry) error {
	path := filepath.Join(stateDir, logFile)
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if torn, terr := endsTorn(f); terr != nil {
		err = terr
	} else {
		if torn {
			b = append([]byte{'\n'}, b...)
		}
		_, err = f.Write(append(b, '\n'))
	}
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("state directory: %s: %w", path, err)
	}
	return nil
}

// endsTorn says whether f is a log whose last line has no newline (a write
// a crash cut short).
func endsTorn(f *os.File) (bool, error) {
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return false, err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, fi.Size()-1); err != nil {
		return false, err
	}
	return last[0] != '\n', nil
}

// loggedRun is what the log says of one run.
type loggedRun struct {
	ID string
	// wroteNothing: it ended with no journal and no key written.
	ended, wroteNothing bool
}

// runLog is the log read: each run by number, and the newest number.
type runLog struct {
	runs   map[int]loggedRun
	newest int
}

// readLog reads the state directory's log (none in a state directory an
// older release made). A line that does not parse (a torn last line, or
// one longer than maxLogLine) is passed over: the run directories, not the log, are what a rollback undoes.
func readLog(stateDir string) (runLog, error) {
	out := runLog{runs: map[int]loggedRun{}}
	f, err := os.Open(filepath.Join(stateDir, logFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for {
		line, rerr := nextLine(br, maxLogLine)
		var e logEntry
		if len(line) > 0 && json.Unmarshal(line, &e) == nil && e.Seq > 0 && seqOf(e.ID) == e.Seq {
			r := out.runs[e.Seq]
			r.ID = e.ID
			if e.Event == "end" {
				r.ended, r.wroteNothing = true, e.KeysWritten == 0 && !e.Journaled
			}
			out.runs[e.Seq] = r
			out.newest = max(out.newest, e.Seq)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return out, fmt.Errorf("state directory %s: %s: %w", stateDir, logFile, rerr)
		}
	}
	return out, nil
}
