package writerun

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/undo"
)

// EtcdSpec is one etcd a run writes, as the stage knows it: the main one
// (Name "") or another of a cluster whose kube-apiserver keeps resources in
// several (--etcd-servers-overrides), named by the resources kept there.
type EtcdSpec struct {
	Name      string
	Endpoints []string
	Client    *clientv3.Client
	// Prefix is what the liveness watch there watches.
	Prefix string
	// Preflight, when set, is the read-only checks the stage runs there
	// before that etcd's first write; Ready runs it for an etcd whose own
	// first write comes after another's.
	Preflight func(ctx context.Context) error
}

// Etcd is an etcd in the run: its liveness watch (nil: none, as MainWatch)
// and where its undo goes ("" without an undo).
type Etcd struct {
	EtcdSpec
	Watch             *guard.Watch
	Journal, Snapshot string
}

// Label names the etcd on the run's lines.
func (e *Etcd) Label() string {
	if e.Name == "" {
		return "main etcd"
	}
	return "etcd of " + e.Name
}

// AddEtcd adds an etcd to the run, in the order the stage writes them:
// the main one (spec.Name "") has the run's watch and files; another has
// its own watch started (closed at the finish) and its journal and
// snapshot beside the run's, named by its resources (EtcdFile) and
// recorded in the run directory before anything is written there, so that
// 'rollback --run' finds them. An etcd added by the stage's Check (its
// watch's window then runs while the checks go on) has its files once the
// run directory is made.
func (r *Run) AddEtcd(ctx context.Context, spec EtcdSpec) (*Etcd, error) {
	e := &Etcd{EtcdSpec: spec}
	if spec.Name == "" {
		e.Watch = r.MainWatch()
	} else {
		w, err := r.Watch(ctx, spec.Client, spec.Prefix)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Label(), err)
		}
		e.Watch = w
	}
	if err := r.place(e); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.etcds = append(r.etcds, e)
	r.mu.Unlock()
	return e, nil
}

// place names e's undo files, and records another etcd's in the run
// directory: at AddEtcd, and again when the run directory is made (an etcd
// added by the stage's Check, before it exists).
func (r *Run) place(e *Etcd) error {
	e.Journal, e.Snapshot = r.Journal(), r.Snapshot()
	if e.Name == "" {
		return nil
	}
	e.Journal, e.Snapshot = EtcdFile(e.Journal, e.Name), EtcdFile(e.Snapshot, e.Name)
	if u := r.Dir(); u != nil {
		if err := u.AddEtcd(undo.RunEtcd{Name: e.Name, Endpoints: e.Endpoints, Journal: e.Journal, Snapshot: e.Snapshot}); err != nil {
			return fmt.Errorf("%s: %w", e.Label(), err)
		}
	}
	return nil
}

// Ready is called before the first write on etcd self, and does its work
// once per run (the first etcd that writes calls it first): it waits for
// every other etcd's liveness verdict and runs the Preflight of every etcd
// added after self (those before it wrote nothing, or called Ready first),
// so that a live kube-apiserver, an alarm or too little room on any etcd
// refuses the run before anything is written anywhere.
func (r *Run) Ready(ctx context.Context, self *Etcd) error {
	r.ready.Do(func() { r.readyErr = r.allReady(ctx, self) })
	return r.readyErr
}

func (r *Run) allReady(ctx context.Context, self *Etcd) error {
	r.mu.Lock()
	etcds := append([]*Etcd(nil), r.etcds...)
	r.mu.Unlock()
	after := false
	for _, e := range etcds {
		if e == self {
			after = true
			continue
		}
		if e.Watch != nil {
			if _, err := e.Watch.Verdict(ctx); err != nil {
				return &EtcdError{Label: e.Label(), Err: err}
			}
		}
		if after && e.Preflight != nil {
			if err := e.Preflight(ctx); err != nil {
				return &EtcdError{Label: e.Label(), Err: err}
			}
		}
	}
	return nil
}

// EtcdError is an error of another etcd than the one whose first write
// met it (Ready): it names its etcd. The stage that meets it says that
// nothing was written, which its message then does not repeat.
type EtcdError struct {
	Label string
	Err   error
}

func (e *EtcdError) Error() string {
	return e.Label + ": " + strings.TrimSuffix(e.Err.Error(), " (nothing was written)")
}
func (e *EtcdError) Unwrap() error { return e.Err }

// OpenJournal opens e's journal for a command that journals its writes
// itself (a rollback's undo of its own), its begin record written at
// etcd's current revision under prefix; nil, nil without an undo.
func (e *Etcd) OpenJournal(ctx context.Context, command, prefix string) (*undo.Journal, error) {
	if e.Journal == "" {
		return nil, nil
	}
	rev, err := etcdscan.Revision(ctx, e.Client)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Label(), err)
	}
	return undo.BeginJournal(e.Journal, command, rev, prefix)
}

// EtcdFile is the file of a run's undo for the etcd named name, beside
// path (the main etcd's): "journal" -> "journal-events", "snapshot.db" ->
// "snapshot-events.db".
func EtcdFile(path, name string) string {
	if path == "" {
		return ""
	}
	name = strings.NewReplacer(",", "+", "/", "_").Replace(name)
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + name + ext
}
