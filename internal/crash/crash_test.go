package crash

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

type secretPanic struct{ plaintext string }

// TestRecover: a goroutine's panic comes back to its caller as a *Panic
// naming what it did, the runtime's error and the function that panicked;
// a value of another type is named by its type only.
func TestRecover(t *testing.T) {
	run := func(f func()) error {
		var err error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer Recover("testing", &err)
			f()
		}()
		wg.Wait()
		return err
	}
	err := run(func() {
		var p *struct{ n int }
		_ = p.n
	})
	var p *Panic
	if !errors.As(err, &p) || !strings.HasPrefix(err.Error(), "internal error: panic while testing: runtime error: invalid memory address or nil pointer dereference, in kube-etcd-migrate/internal/crash.TestRecover.func") || strings.Contains(err.Error(), "\n") {
		t.Errorf("nil map: %v", err)
	}
	err = run(func() { panic(secretPanic{"s3cr3t"}) })
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "panic(crash.secretPanic)") {
		t.Errorf("a panic of another value: %v", err)
	}
	if err := run(func() {}); err != nil {
		t.Errorf("no panic: %v", err)
	}
}

// TestNewOfAPanic: a *Panic panicked with again, to hand it from a
// goroutine's caller to its own, is recovered as itself.
func TestNewOfAPanic(t *testing.T) {
	p := &Panic{Where: "probing", Value: "x", At: "f (f.go:1)"}
	var err error
	func() {
		defer Recover("running", &err)
		panic(p)
	}()
	if err != p {
		t.Errorf("recovered %v, want %v", err, p)
	}
}
