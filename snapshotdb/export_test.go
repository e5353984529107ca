package snapshotdb

// SetLimits shrinks the window of keys a pass keeps and the bytes read
// through one mapping, so that a small file takes many passes and many
// remappings (tests), and drops f's cached window (nil f: none); it returns
// what puts them back.
func SetLimits(f *File, window, mapped int) (restore func()) {
	w, m := windowBytes, mappedBytes
	windowBytes, mappedBytes = window, int64(mapped)
	f.forget()
	return func() {
		windowBytes, mappedBytes = w, m
		f.forget()
	}
}

func (f *File) forget() {
	if f != nil {
		f.mu.Lock()
		f.cache = nil
		f.mu.Unlock()
	}
}

// Passes is how many passes over the file f's reads made.
func Passes(f *File) int64 { return f.passes.Load() }

// Forget drops f's cached window.
func Forget(f *File) { f.forget() }
