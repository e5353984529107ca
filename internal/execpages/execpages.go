// Package execpages keeps the tool's own executable from weighing on its
// resident memory. Linux (6.18 here) keeps a file read from disk in its page
// cache in folios of up to 2 MB and maps a whole folio on a fault: executing
// one function of the tool's 45 MB of code, or reading one table of its 49 MB
// of read-only data, maps up to the 2 MB around it. Measured on a 550 MB
// snapshot file, `verify --snapshot-file` peaked at 149 MB (VmHWM), of which
// 63 MB anonymous memory (its heap, bounded by the command's memory limit)
// and 82 MB the executable's own pages, most of them never used again after
// the packages' initialisation.
//
// Start turns transparent huge pages off for the process and drops the
// executable's read-only pages at start, ten times in the first second and
// every second after, so that what counts in its resident set is what it
// executes and reads now (measured on the same file: a peak of 95–104 MB
// instead of 149). Only mappings of the executable that cannot be written and
// hold no page of the process's own (smaps: Anonymous 0 kB) are dropped: their
// pages are the file's, they stay in the page cache, and what runs or is read
// again faults back in without reading the disk (minor faults).
package execpages

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// prSetTHPDisable is prctl's PR_SET_THP_DISABLE (linux/prctl.h).
const prSetTHPDisable = 41

// Interval is how often Start drops the pages again, after the first
// Interval.
const Interval = time.Second

// Early is how many times Start drops the pages in the first Interval,
// evenly: a command's first second (its packages' initialisation, the first
// objects of every kind decoded) touches the most code it will, and its peak
// resident set was there, just before the first drop (measured on the
// benchmark's mixed dataset: 124–126 MB with one drop a second, 106–111
// with ten in the first, the same CPU per object).
const Early = 10

// Start turns off transparent huge pages for the process (prctl
// PR_SET_THP_DISABLE: a fault then maps no 2 MB huge-page entry of a file;
// without it the same run peaked at 116 MB) and drops the pages of the
// executable's read-only mappings from the process (madvise MADV_DONTNEED),
// then Early times in the first Interval and every Interval after it, from
// a goroutine of its own, for the life of the process. The mappings are
// found once, in /proc/self/smaps (they do not change while the process runs); where they cannot be (not Linux, no
// /proc), Start does nothing more: the tool works the same without it.
func Start() {
	_, _, _ = syscall.Syscall6(syscall.SYS_PRCTL, prSetTHPDisable, 1, 0, 0, 0, 0)
	ms := Mappings()
	if len(ms) == 0 {
		return
	}
	release(ms)
	go func() {
		for range Early {
			time.Sleep(Interval / Early)
			release(ms)
		}
		for range time.Tick(Interval) {
			release(ms)
		}
	}()
}

// release is Release, as Start calls it (a test counts the calls).
var release = Release

// Mappings are the executable's read-only mappings that hold no page of the
// process's own (nil when /proc cannot tell).
func Mappings() []Mapping {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil
	}
	return fileMappings(smaps, exe)
}

// Release drops the pages of ms from the process's resident set, and returns
// the bytes of the mappings it dropped.
func Release(ms []Mapping) int64 {
	var dropped int64
	for _, m := range ms {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, m.start, m.end-m.start, syscall.MADV_DONTNEED); errno == 0 {
			dropped += int64(m.end - m.start)
		}
	}
	return dropped
}

// Mapping is one mapping of the process: its addresses.
type Mapping struct{ start, end uintptr }

// fileMappings are the mappings of /proc/PID/smaps (its text) of the file
// path that cannot be written and hold no anonymous page: every resident page
// of theirs is the file's.
func fileMappings(smaps []byte, path string) []Mapping {
	var out []Mapping
	var cur *Mapping
	keep := false
	done := func() {
		if cur != nil && keep {
			out = append(out, *cur)
		}
		cur, keep = nil, false
	}
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Bytes()
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := bytes.Cut(f[0], []byte("-")); ok && len(f) >= 5 {
			// A mapping's header: start-end perms offset dev inode [path].
			done()
			start, err1 := strconv.ParseUint(string(lo), 16, 64)
			end, err2 := strconv.ParseUint(string(hi), 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				continue
			}
			name := ""
			if len(f) >= 6 {
				name = string(bytes.Join(f[5:], []byte(" ")))
			}
			if name == path && bytes.IndexByte(f[1], 'w') < 0 {
				cur, keep = &Mapping{uintptr(start), uintptr(end)}, true
			}
			continue
		}
		// A field of the current mapping: "Anonymous: N kB".
		if cur != nil && string(f[0]) == "Anonymous:" && (len(f) < 2 || string(f[1]) != "0") {
			keep = false
		}
	}
	done()
	return out
}
