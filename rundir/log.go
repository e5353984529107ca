package rundir

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The state directory's log (runs.log) has a JSON line when each run starts
// and one when it ends, appended and synced before the run goes on. It
// outlives the run directories: a directory removed by hand is still known
// by its ID, its number is never given again, and a run that ended having
// written nothing is known to need no undo.

// logEntry is one line of the log.
type logEntry struct {
	ID          string `json:"id"`
	Seq         int    `json:"seq"`
	Event       string `json:"event"` // "start" or "end"
	ExitCode    *int   `json:"exitCode,omitempty"`
	KeysWritten int64  `json:"keysWritten,omitempty"`
}

// appendLog appends e to the state directory's log and syncs it.
func appendLog(stateDir string, e logEntry) error {
	path := filepath.Join(stateDir, logFile)
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
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

// loggedRun is what the log says of one run.
type loggedRun struct {
	ID          string
	ended       bool
	keysWritten int64
}

// runLog is the log read: each run by number, and the newest number.
type runLog struct {
	runs   map[int]loggedRun
	newest int
}

// readLog reads the state directory's log (none in a state directory an
// older release made). A line that does not parse (a torn last line) is
// passed over: the run directories, not the log, are what a rollback undoes.
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
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e logEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Seq <= 0 || seqOf(e.ID) != e.Seq {
			continue
		}
		r := out.runs[e.Seq]
		r.ID = e.ID
		if e.Event == "end" {
			r.ended, r.keysWritten = true, e.KeysWritten
		}
		out.runs[e.Seq] = r
		out.newest = max(out.newest, e.Seq)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("state directory %s: %s: %w", stateDir, logFile, err)
	}
	return out, nil
}
