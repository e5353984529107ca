package snapshotdb

// SetLimits shrinks the memory of a run of the key index and the bytes read
// through one mapping, so that a small file's index is spilled to disk in
// many runs and the file remapped many times (tests), and drops f's cached
// index (nil f: none); it returns what puts them back.
func SetLimits(f *File, run, mapped int) (restore func()) {
	w, m := runBytes, mappedBytes
	runBytes, mappedBytes = run, int64(mapped)
	f.forget()
	return func() {
		runBytes, mappedBytes = w, m
		f.forget()
	}
}

// Passes is how many passes over the file f's reads made.
func Passes(f *File) int64 { return f.passes.Load() }

// Spills is how many runs of an index f's reads spilled to disk.
func Spills(f *File) int64 { return f.spills.Load() }

// Forget drops f's cached index.
func Forget(f *File) { f.forget() }

// SetFanIn lowers how many runs are merged at once, so that a small file's
// index is merged in several rounds (tests); it returns what puts it back.
func SetFanIn(n int) (restore func()) {
	old := fanIn
	fanIn = n
	return func() { fanIn = old }
}

// SetRegions sets the size of the regions of the mapping counted as records
// are read out of order (1<<shift bytes), how many are read before their
// pages are dropped, and, when mapped > 0, the bytes read through a mapping
// before the whole of it is dropped; it drops f's cached index (nil f: none)
// and returns what puts them back.
func SetRegions(f *File, shift uint, regions int, mapped int64) (restore func()) {
	s, n, m := regionShift, mappedRegions, mappedBytes
	regionShift, mappedRegions = shift, regions
	if mapped > 0 {
		mappedBytes = mapped
	}
	f.forget()
	return func() {
		regionShift, mappedRegions, mappedBytes = s, n, m
		f.forget()
	}
}

// Drops is how many regions of the mapping f's reads dropped (dropRegions).
func Drops(f *File) int64 { return f.drops.Load() }

// Releases is how many times f's reads dropped a whole mapping (release).
func Releases(f *File) int64 { return f.releases.Load() }
