package command

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// output is what a command prints, stdout and stderr, on their way to the
// terminal. A writing run (outliveTerminal) saves it too, as printed, in its
// run directory (writerun.OutputFile), and goes on when the terminal is gone: a
// closed pipe (EPIPE: a '| tee' that died with the terminal, '| head -c1'), a
// hung-up terminal (EIO), are no errors to it, what it prints goes on to the
// file.
type output struct {
	mu       sync.Mutex
	keep     bool     // a writing run: what is printed is saved
	buf      []byte   // printed before the run directory exists
	file     *os.File // the run directory's output file, once there is one
	tolerant bool     // a writing run: a terminal gone is no error
}

// maxEarlyOutput bounds what is kept of a writing run's output before its
// run directory exists (the connection and configuration lines).
const maxEarlyOutput = 1 << 20

// stream is stdout or stderr through the output.
type stream struct {
	o    *output
	w    io.Writer
	gone bool // the terminal (or pipe) is gone: nothing more is written to it
}

func (o *output) stream(w io.Writer) *stream { return &stream{o: o, w: w} }

func (s *stream) Write(p []byte) (int, error) {
	o := s.o
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.file != nil:
		_, _ = o.file.Write(p) // the disk's error, if any, is no reason to stop a run
	case o.keep && len(o.buf)+len(p) <= maxEarlyOutput:
		o.buf = append(o.buf, p...)
	}
	if s.gone {
		return len(p), nil
	}
	n, err := s.w.Write(p)
	if err != nil && o.tolerant && terminalGone(err) {
		s.gone = true
		return len(p), nil
	}
	return n, err
}

// terminalGone says whether a write failed because nothing reads the output
// any more: a closed pipe, a terminal hung up.
func terminalGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ENXIO)
}

// terminalOf is the file a stream writes to, for a progress bar (which
// writes there itself, unsaved).
func terminalOf(w io.Writer) (*os.File, bool) {
	if s, ok := w.(*stream); ok {
		w = s.w
	}
	f, ok := w.(*os.File)
	return f, ok
}

// outputOf is the output w writes through (nil for another writer).
func outputOf(w io.Writer) *output {
	if s, ok := w.(*stream); ok {
		return s.o
	}
	return nil
}

// attach saves the output, from its first line, in f (the run
// directory's output file).
func (o *output) attach(f *os.File) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = f.Write(o.buf)
	o.buf, o.file = nil, f
	return nil
}

// close closes the output file.
func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.file != nil {
		_ = o.file.Sync()
		o.file.Close()
		o.file = nil
	}
	o.buf = nil
}

// outliveTerminal makes a writing run (not a dry run) outlive its terminal,
// as nohup would: SIGHUP is noted (on errOut) and ignored, SIGPIPE too (a
// write to a closed pipe returns EPIPE, which the output passes over), and
// what it prints is saved for its run directory. The function returned
// undoes it.
func outliveTerminal(errOut io.Writer, dryRun bool) func() {
	o := outputOf(errOut)
	if dryRun || o == nil {
		return func() {}
	}
	o.mu.Lock()
	o.keep, o.tolerant = true, true
	o.mu.Unlock()
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGHUP, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		hup := false
		for {
			select {
			case <-done:
				return
			case sig := <-ch:
				if sig == syscall.SIGHUP && !hup {
					hup = true
					fmt.Fprintln(errOut, "note: SIGHUP (the terminal hung up): the run goes on to its end; its output is saved in its run directory ('kube-etcd-migrate runs' lists it)")
				}
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
