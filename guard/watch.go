package guard

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"kube-etcd-migrate/undo"
	"os"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/liveness"
)

// Watch is a writing run's liveness watch (package liveness): started
// before the run's other checks, its window runs while they, the snapshot
// and the decisions go on; the first write waits for its verdict
// (Verdict), and from then on a write under the prefix that is not the run's
// stops the run (Stopped, Stopping). A nil *Watch watches nothing (a dry
// run, --allow-live-apiserver): its methods say so.
type Watch struct {
	lw *liveness.Watch
	// probe, instead of lw, watches a datastore no one can write without
	// holding its file open (StartProbeWatch).
	probe *probeWatch

	once    sync.Once
	verdict string
	err     error
}

// StartWatch starts the liveness watch of a run that writes to cli under
// prefix: none (nil) with opts.AllowLiveAPIServer.
func StartWatch(ctx context.Context, cli *clientv3.Client, prefix string, opts PreflightOptions) (*Watch, error) {
	if opts.AllowLiveAPIServer {
		return nil, nil
	}
	lw, err := liveness.Start(ctx, cli, prefix, opts.LivenessWindow)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	return &Watch{lw: lw}, nil
}

// Close ends the watch.
func (w *Watch) Close() {
	switch {
	case w == nil:
	case w.probe != nil:
		w.probe.close()
	default:
		w.lw.Close()
	}
}

// Verdict waits for the window's verdict: the preflight's line saying that
// nothing wrote under the prefix ("" without a watch), or a *PreflightError
// naming every key that moved (a kube-apiserver lease, any other key, or a
// master lease whose etcd lease has time left). Asked again, it answers the
// same at once.
func (w *Watch) Verdict(ctx context.Context) (string, error) {
	if w == nil {
		return "", nil
	}
	if w.probe != nil {
		return w.probe.verdict(ctx)
	}
	rep, err := w.lw.Window(ctx)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return "", err // interrupted while waiting: not the verdict
	}
	w.once.Do(func() {
		switch {
		case err != nil:
			w.err = fmt.Errorf("preflight: %w", err)
		case rep.Refusal() != "":
			w.err = &PreflightError{Err: input.Errorf("%s, or pass %s", rep.Refusal(), input.AllowLiveAPIServer)}
		default:
			w.verdict = rep.Summary()
		}
	})
	return w.verdict, w.err
}

// Stopped is nil while nothing but the run writes under the prefix, then a
// *liveness.WriterError, or the error that ended the watch.
func (w *Watch) Stopped() error {
	if w == nil {
		return nil
	}
	if w.probe != nil {
		return w.probe.stopped()
	}
	return w.lw.Stopped()
}

// Settle is called after the run's last write: nil when nothing but the run
// wrote under the prefix up to etcd's current revision, else what Stopped
// says, complete (the kube-apiserver identity leases written meanwhile).
func (w *Watch) Settle(ctx context.Context) error {
	if w == nil {
		return nil
	}
	if w.probe != nil {
		return w.probe.settle(ctx)
	}
	return w.lw.Settle(ctx)
}

// waitJudged waits until every revision up to rev is judged: a compaction up
// to it then leaves the watch whole.
func (w *Watch) waitJudged(ctx context.Context, rev int64) error {
	if w == nil || w.probe != nil {
		return nil
	}
	return w.lw.WaitJudged(ctx, rev)
}

// Observer is what the run's etcdscan.Writer tells of its requests (nil
// without a watch).
func (w *Watch) Observer() etcdscan.Observer {
	if w == nil {
		return nil
	}
	if w.probe != nil {
		return w.probe
	}
	return observer{w.lw}
}

// observer announces each request of the run to the watch, and its outcome.
type observer struct{ lw *liveness.Watch }

func (o observer) Sending(puts []etcdscan.Put) (func(etcdscan.Outcome), error) {
	tok, err := o.lw.Begin()
	if err != nil {
		return nil, err
	}
	return func(out etcdscan.Outcome) {
		switch {
		case out.Revision != 0:
			o.lw.Applied(tok, out.Revision)
		case out.Unknown:
			ps := make([]liveness.Possible, len(puts))
			for i, p := range puts {
				ps[i] = liveness.Possible{Key: p.Key, Value: p.Value, Delete: p.Delete}
			}
			o.lw.Unknown(tok, ps)
		default:
			o.lw.NotApplied(tok)
		}
	}, nil
}

// FirstWrite is what a writing run does once, just before its first write:
// it takes the run's lock (Lock), starts saving the snapshot (when Snapshot is set) while the liveness
// window still runs, waits for the window's verdict and the snapshot, then
// runs Then with the verdict's line. A refusal removes the snapshot just
// saved: nothing was written, and it is no run's undo. Open is safe for
// concurrent use: the first caller does it, the others wait and get the
// same error.
type FirstWrite struct {
	Watch    *Watch
	Client   *clientv3.Client
	Snapshot string
	// Save, when set, saves the snapshot instead of etcd's Snapshot of
	// Client (a SQLite datastore's copy); it returns the file's sum.
	Save func(ctx context.Context, path string) (undo.FileSum, error)
	// Lock, when set, runs first, before the snapshot starts: the writing
	// run's cluster lock, so that no other run snapshots and writes beside
	// this one. Its error is the run's refusal as it is.
	Lock func(context.Context) error
	// Then, when set, runs once both are in, with the window's line ("" when
	// none): the run's plan, its journal opened.
	Then func(line string) error

	mu   sync.Mutex
	done bool
	err  error
}

// Open does it the first time and returns its error every time.
func (f *FirstWrite) Open(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return f.err
	}
	f.done = true
	if f.Lock != nil {
		if err := f.Lock(ctx); err != nil {
			f.err = err
			return err
		}
	}
	save := f.Save
	if save == nil {
		save = func(ctx context.Context, path string) (undo.FileSum, error) {
			d, err := etcdscan.SaveSnapshot(ctx, f.Client, path)
			return undo.FileSum{Bytes: d.Size, SHA256: d.SHA256}, err
		}
	}
	snap := startSnapshot(ctx, save, f.Snapshot)
	line, err := f.Watch.Verdict(ctx)
	if err == nil {
		err = f.Watch.Stopped() // a writer after the window, before the first write
		if err != nil {
			err = fmt.Errorf("%w (nothing was written)", err)
		}
	}
	if err != nil {
		snap.discard()
		f.err = err
		return err
	}
	if err := snap.wait(); err != nil {
		f.err = fmt.Errorf("%w (nothing was written)", err)
		return f.err
	}
	if f.Then != nil {
		if err := f.Then(line); err != nil {
			f.err = fmt.Errorf("%w (nothing was written)", err)
			return f.err
		}
	}
	return nil
}

// Opened says whether Open was done and let the run write.
func (f *FirstWrite) Opened() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done && f.err == nil
}

// pendingSnapshot is a snapshot being saved in the background.
type pendingSnapshot struct {
	path   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startSnapshot starts saving etcd's snapshot to path (none when "").
func startSnapshot(ctx context.Context, save func(context.Context, string) (undo.FileSum, error), path string) *pendingSnapshot {
	if path == "" {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &pendingSnapshot{path: path, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer crash.Recover("saving the snapshot", &s.err)
		sum, err := save(ctx, path)
		if s.err = err; err == nil {
			undo.RememberWritten(path, sum)
		}
	}()
	return s
}

func (s *pendingSnapshot) wait() error {
	if s == nil {
		return nil
	}
	<-s.done
	s.cancel()
	return s.err
}

// discard stops the snapshot and removes what it saved.
func (s *pendingSnapshot) discard() {
	if s == nil {
		return
	}
	s.cancel()
	<-s.done
	if s.err == nil {
		undo.ForgetWritten(s.path)
		_ = os.Remove(s.path)
	}
	// etcd's snapshot writes PATH.part and renames it when it is whole.
	if err := os.Remove(s.path + ".part"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return
	}
}
