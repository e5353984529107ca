package guard

import (
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// DiskMargin is the room a run leaves free on every filesystem it writes to:
// the state directory is often on the filesystem of /var/lib/etcd, and etcd
// preallocates its WAL files 64 MiB at a time.
const DiskMargin = 64 << 20

// DiskNeed is a file a run will write and about how large it grows.
type DiskNeed struct {
	What  string // "snapshot", "journal", ...
	Path  string // the file (its directory must exist)
	Bytes int64
	// Etcd: etcd's own growth in its data directory, not a file of the
	// undo (RunSpace).
	Etcd bool
}

// DiskSpaceError refuses a run whose files would not fit, before its first write.
type DiskSpaceError struct {
	Dir    string // a directory on the filesystem that is short of room
	Needs  []DiskNeed
	Needed int64
	Free   int64
	// Elsewhere is the input that puts the undo on another filesystem
	// (the state directory's, unless set: rollback's undo directory).
	Elsewhere input.Name
}

func (e *DiskSpaceError) Error() string { return e.Render(input.Words) }

// UndoNeeds says whether the undo's own files are among the needs (else
// only etcd's growth is: another state directory would not help).
func (e *DiskSpaceError) UndoNeeds() bool {
	for _, n := range e.Needs {
		if !n.Etcd {
			return true
		}
	}
	return false
}

// Render is the message with the state directory's input spelled by spell.
func (e *DiskSpaceError) Render(spell func(input.Name) string) string {
	parts := make([]string, len(e.Needs))
	for i, n := range e.Needs {
		parts[i] = fmt.Sprintf("%s %s", n.What, textfmt.Bytes(n.Bytes))
	}
	undo := e.UndoNeeds()
	elsewhere := e.Elsewhere
	if elsewhere == "" {
		elsewhere = input.StateDir
	}
	remedy := "free room there, or give a " + spell(elsewhere) + " on another filesystem"
	switch {
	case !undo:
		remedy = "free room there: etcd itself needs it (its database and WAL grow with what the run writes, whatever the undo)"
	case elsewhere == input.StateDir:
		remedy += " (then give runs and rollback the same " + spell(input.StateDir) + ")"
	case elsewhere == input.UndoDir:
		remedy += " (the runs undone are still read from " + spell(input.StateDir) + ")"
	}
	return fmt.Sprintf("not enough disk space on the filesystem of %s: the run needs %s there (%s) and %s left free, %s is free; %s",
		e.Dir, textfmt.Bytes(e.Needed), strings.Join(parts, ", "), textfmt.Bytes(DiskMargin), textfmt.Bytes(e.Free), remedy)
}

// CheckDiskSpace checks that the files fit together, with DiskMargin to spare, on
// the filesystems they go to; it returns a line per filesystem checked.
// Filesystems are told apart by device ID (stat).
func CheckDiskSpace(needs []DiskNeed) ([]string, error) {
	return checkDiskSpace(needs, freeBytes)
}

// freeBytes is the room an unprivileged process has on dir's filesystem.
func freeBytes(dir string) (int64, error) {
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); err != nil {
		return 0, err
	}
	return int64(sfs.Bavail) * int64(sfs.Bsize), nil
}

// checkDiskSpace is CheckDiskSpace with the room of each filesystem as
// free says.
func checkDiskSpace(needs []DiskNeed, free func(dir string) (int64, error)) ([]string, error) {
	type fsNeeds struct {
		dir   string
		free  int64
		needs []DiskNeed
		total int64
	}
	byDev := map[uint64]*fsNeeds{}
	var devs []uint64
	for _, n := range needs {
		dir := filepath.Dir(n.Path)
		dev, err := deviceOf(dir)
		if err != nil {
			return nil, fmt.Errorf("disk space for the %s %s: %w", n.What, n.Path, err)
		}
		f := byDev[dev]
		if f == nil {
			room, err := free(dir)
			if err != nil {
				return nil, fmt.Errorf("disk space for the %s %s: %w", n.What, n.Path, err)
			}
			f = &fsNeeds{dir: dir, free: room}
			byDev[dev] = f
			devs = append(devs, dev)
		}
		f.needs = append(f.needs, n)
		f.total += n.Bytes
	}
	sort.Slice(devs, func(i, j int) bool { return byDev[devs[i]].dir < byDev[devs[j]].dir })
	var lines []string
	for _, d := range devs {
		f := byDev[d]
		if f.total+DiskMargin > f.free {
			return lines, &DiskSpaceError{Dir: f.dir, Needs: f.needs, Needed: f.total, Free: f.free}
		}
		what := make([]string, len(f.needs))
		undo, etcd := false, false
		for i, n := range f.needs {
			what[i] = fmt.Sprintf("%s %s", n.What, textfmt.Bytes(n.Bytes))
			undo, etcd = undo || !n.Etcd, etcd || n.Etcd
		}
		who := "the undo needs"
		switch {
		case undo && etcd:
			who = "etcd's data directory is on it too: the undo and etcd need"
		case etcd:
			who = "etcd's data directory: etcd needs"
		}
		lines = append(lines, fmt.Sprintf("disk space on the filesystem of %s: %s free, %s at most %s (%s) and %s left free", f.dir, textfmt.Bytes(f.free), who, textfmt.Bytes(f.total), strings.Join(what, ", "), textfmt.Bytes(DiskMargin)))
	}
	return lines, nil
}

// roomBeside is what is left on the filesystem of path's directory beside
// the needs on that filesystem and DiskMargin, as free says (0 when
// nothing is, or it cannot be told).
func roomBeside(path string, needs []DiskNeed, free func(dir string) (int64, error)) int64 {
	dir := filepath.Dir(path)
	dev, err := deviceOf(dir)
	if err != nil {
		return 0
	}
	room, err := free(dir)
	if err != nil {
		return 0
	}
	for _, n := range needs {
		ndev, err := deviceOf(filepath.Dir(n.Path))
		if err != nil {
			return 0
		}
		if ndev == dev {
			room -= n.Bytes
		}
	}
	return max(0, room-DiskMargin)
}

// deviceOf is the ID of the filesystem dir is on: what tells filesystems apart.
func deviceOf(dir string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Dev), nil
}

// FileSize is the size of a file, 0 when it does not exist.
func FileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
