package kinedb

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Process is a process holding a SQLite file open, or a session on a
// PostgreSQL or MySQL database (Session).
type Process struct {
	PID int
	// Command is its name (/proc/PID/comm), e.g. "k3s-server".
	Command string

	// Session: a PostgreSQL session, PID its server process's (the
	// database server's host), with its User, Application (its
	// application_name) and Client (address:port, when connected over TCP
	// and visible to the tool's role); or a MySQL one, PID its connection
	// ID, Application "kube-etcd-migrate" for another run of the tool's
	// (MySQL has no application name).
	Session                   bool
	User, Application, Client string
}

func (p Process) String() string {
	if p.Session {
		s := fmt.Sprintf("session %d of user %q", p.PID, p.User)
		if p.Application != "" {
			s += fmt.Sprintf(" (application %q)", p.Application)
		}
		if p.Client != "" {
			s += " from " + p.Client
		}
		return s
	}
	if p.Command == "" {
		return fmt.Sprintf("process %d", p.PID)
	}
	return fmt.Sprintf("%s (pid %d)", p.Command, p.PID)
}

// Holders are the processes other than this one with the database, its
// write-ahead log or its shared-memory file open, found through
// /proc/PID/fd. Processes whose descriptors cannot be read (another user's,
// without privilege) are not seen; without /proc, none are.
func Holders(database string) ([]Process, error) {
	abs, err := filepath.Abs(database)
	if err != nil {
		return nil, fmt.Errorf("kine datastore %s: %w", database, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	names := map[string]bool{abs: true, abs + "-wal": true, abs + "-shm": true, abs + "-journal": true}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("looking for processes holding %s open: %w", database, err)
	}
	self := os.Getpid()
	var out []Process
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || !names[target] {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
			out = append(out, Process{PID: pid, Command: strings.TrimSpace(string(comm))})
			break
		}
	}
	return out, nil
}
