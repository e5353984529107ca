// Package crash carries a panic — a bug of the tool, or of the code it calls —
// out of the goroutine it happened in, to the command, as an error. A panic
// that no goroutine recovers ends the process with a stack dump and Go's exit
// code 2, the code the tool gives a usage error: a runbook would take a crash
// for a mistyped flag. So every goroutine the tool starts defers Recover,
// which turns a panic into a *Panic that the goroutine hands on as it hands
// its other errors; the command layer writes it as one line and exits with a
// code of its own (command/exit.go). The goroutines the code it calls starts
// (gRPC's, etcd's client's) are that code's. It imports nothing of the module.
package crash

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
)

// Panic is a panic recovered: what the goroutine was doing, what panicked,
// and where.
type Panic struct {
	// Where is what the goroutine was doing ("scanning", "deciding KEY").
	Where string
	// Value is the panic's value as text: the runtime's own errors
	// ("invalid memory address or nil pointer dereference") in full; of any
	// other value only its type, since what the code it calls panics with may
	// quote the data it was given (a secret's plaintext).
	Value string
	// At is the function that panicked and its file and line.
	At string
}

func (p *Panic) Error() string {
	return fmt.Sprintf("internal error: panic while %s: %s, in %s", p.Where, p.Value, p.At)
}

// Recover, deferred by a goroutine, turns its panic into a *Panic in *err
// (replacing what *err held): `defer crash.Recover("scanning", &err)`.
func Recover(where string, err *error) {
	if v := recover(); v != nil {
		*err = New(where, v)
	}
}

// New is the *Panic of a value recovered (what recover returned) in the
// deferred function that calls it. A *Panic recovered again (one that a
// goroutine's caller panicked with anew, to hand it to its own caller) is
// itself.
func New(where string, v any) *Panic {
	if p, ok := v.(*Panic); ok {
		return p
	}
	value := fmt.Sprintf("panic(%T)", v)
	if re, ok := v.(runtime.Error); ok {
		value = re.Error()
	}
	return &Panic{Where: where, Value: value, At: panicked()}
}

// panicked is the function that panicked, from the stack of the deferred
// call recovering it: the first frame below the runtime's panic machinery
// that is not the runtime's.
func panicked() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	inPanic := false
	for {
		f, more := frames.Next()
		switch {
		case strings.HasPrefix(f.Function, "runtime.gopanic"), strings.HasPrefix(f.Function, "runtime.sigpanic"), strings.HasPrefix(f.Function, "runtime.panic"):
			inPanic = true
		case inPanic && !strings.HasPrefix(f.Function, "runtime."):
			return fmt.Sprintf("%s (%s:%d)", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return "an unknown function"
		}
	}
}
