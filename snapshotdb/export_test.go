package snapshotdb

// SetLimits shrinks the memory of a run of the key index, so that a small
// file's index is spilled to disk in many runs (tests), and drops f's cached
// index (nil f: none); it returns what puts it back.
func SetLimits(f *File, run int) (restore func()) {
	w := runBytes
	runBytes = run
	f.forget()
	return func() {
		runBytes = w
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

// SetChunkBytes sets how much an output snapshot's build copies between
// commits (tests).
func SetChunkBytes(n int) (restore func()) {
	old := chunkBytes
	chunkBytes = n
	return func() { chunkBytes = old }
}
