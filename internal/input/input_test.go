package input

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestErrorWordsAndRender(t *testing.T) {
	e := Errorf("%s %s: %w (pass %s)", OutputSnapshot, "/x", fs.ErrExist, Force)
	if got, want := e.Error(), "output snapshot /x: file already exists (pass replacement of an existing output)"; got != want {
		t.Errorf("Error = %q, want %q", got, want)
	}
	flag := func(n Name) string { return map[Name]string{OutputSnapshot: "--output-snapshot", Force: "--force"}[n] }
	if got, want := e.Render(flag), "--output-snapshot /x: file already exists (pass --force)"; got != want {
		t.Errorf("Render = %q, want %q", got, want)
	}
	if !errors.Is(e, fs.ErrExist) {
		t.Error("%w argument not wrapped")
	}
	if got, want := RenderAll(fmt.Errorf("save: %w", e), flag), "save: --output-snapshot /x: file already exists (pass --force)"; got != want {
		t.Errorf("RenderAll = %q, want %q", got, want)
	}
}

// TestErrorfCopiesBytes: an error outlives the buffer a []byte argument was
// read from (a file's mapping): it writes what the buffer held when it was made.
func TestErrorfCopiesBytes(t *testing.T) {
	b := []byte{0xab, 0xcd}
	e := Errorf("record %x", b)
	b[0], b[1] = 0, 0
	if got, want := e.Error(), "record abcd"; got != want {
		t.Errorf("Error = %q, want %q", got, want)
	}
}
