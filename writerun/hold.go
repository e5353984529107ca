package writerun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/clusterlock"
	"kube-etcd-migrate/undo"
)

// hold is a writing run's hold on the cluster's lock in etcd (package
// clusterlock): one writing run per cluster, whatever node it runs on.
// checkFree reads, before the run's checks, whether another run holds the
// lock (a refusal then writes nothing at all); take takes it just before the
// snapshot of the run's first write; finish records the run's end and
// releases it. nil (a run on a backup file, a dry run) holds nothing. Where
// etcd refuses the tool's keys (auth) or kube-apiserver's prefix covers them,
// the run goes on with the state directory's lock alone, said so on a
// warning line.
type hold struct {
	w       io.Writer
	cli     *clientv3.Client
	command string
	// stateDir is where the run keeps its undo ("" with no undo): a holder
	// of this host and state directory whose process is gone is this run's
	// killed predecessor, whose lock it takes over at once.
	stateDir string
	dir      *dir
	// since is the oldest run a rollback undoes (nil: not a rollback of
	// runs): later runs elsewhere are named.
	since *undo.Record

	mu    sync.Mutex
	taken bool
	lock  *clusterlock.Lock
	off   string // why the cluster's lock is not used
}

// newHold is the hold of a run that writes to cli under prefix and keeps
// its undo in stateDir ("" with none); nil for a run that writes no live
// etcd (none, or cli nil).
func newHold(w io.Writer, cli *clientv3.Client, prefix, command, stateDir string, none bool) *hold {
	if none || cli == nil {
		return nil
	}
	h := &hold{w: w, cli: cli, command: command}
	if stateDir != "" {
		h.stateDir = stateDir
		if abs, err := filepath.Abs(stateDir); err == nil {
			h.stateDir = abs
		}
	}
	if clusterlock.Covers(prefix) {
		h.off = fmt.Sprintf("kube-apiserver's prefix %s covers the tool's keys %s: the cluster's lock would be a write under it", prefix, clusterlock.Prefix)
	}
	return h
}

// checkFree refuses the run, before it checks or writes anything, while
// another run holds the cluster's lock. It only reads.
func (h *hold) checkFree(ctx context.Context) error {
	if h == nil || h.off != "" {
		return nil
	}
	held, err := clusterlock.Holder(ctx, h.cli)
	var np *clusterlock.NotPermittedError
	switch {
	case errors.As(err, &np):
		h.off = np.Error()
		return nil
	case err != nil:
		return err
	case held != nil:
		if err := h.reclaim(ctx, held); err != nil {
			return err
		}
	}
	host, _ := os.Hostname()
	h.nameElsewhere(ctx, host, h.stateDir)
	return nil
}

// reclaim takes over the lock of this run's killed predecessor (a run of
// this host, boot and state directory whose process is gone: its lease would
// free it only later), or refuses the run, naming the holder.
func (h *hold) reclaim(ctx context.Context, held *clusterlock.HeldError) error {
	host, _ := os.Hostname()
	if !held.GoneHere(host, h.stateDir) {
		return &NothingWrittenError{Err: held}
	}
	if err := clusterlock.Reclaim(ctx, h.cli, held); err != nil {
		return err
	}
	fmt.Fprintf(h.w, "note: run %s (pid %d on this host, state directory %s) holds the cluster's lock but its process is gone (killed): its lock is released\n", held.Holder.ID, held.Holder.PID, held.Holder.UndoPlace())
	return nil
}

// take takes the cluster's lock, once: a run that holds it refuses this one
// (naming it; nothing written). etcd refusing the tool's keys is a warning:
// the run goes on with the state directory's lock alone.
func (h *hold) take(ctx context.Context) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.taken {
		return nil
	}
	h.taken = true
	if h.off != "" {
		h.warnOff()
		return nil
	}
	ttl, err := clusterlock.TTL()
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	// The cluster's record of the run is its run directory's header.
	rec := clusterlock.Run{Header: undo.Header{ID: "none (--no-undo)", Command: h.command, Host: host, PID: os.Getpid(), Start: time.Now().UTC().Truncate(time.Second)}, Boot: clusterlock.BootID()}
	if d := h.dir; d != nil {
		rec.Header, rec.StateDir = d.run.Header, d.state.Dir
	}
	l, err := clusterlock.Acquire(ctx, h.cli, rec, ttl)
	var np *clusterlock.NotPermittedError
	var held *clusterlock.HeldError
	if errors.As(err, &held) && held.GoneHere(host, h.stateDir) {
		// Its predecessor, killed since checkFree: once more.
		if err = h.reclaim(ctx, held); err == nil {
			l, err = clusterlock.Acquire(ctx, h.cli, rec, ttl)
		}
	}
	switch {
	case errors.As(err, &np):
		h.off = np.Error()
		h.warnOff()
		return nil
	case errors.As(err, &held):
		return &NothingWrittenError{Err: held}
	case err != nil:
		return err
	}
	h.lock = l
	fmt.Fprintf(h.w, "run %s holds the cluster's lock in etcd (%s, lease %s): a writing run on any node is refused until it ends\n", rec.ID, clusterlock.LockPrefix, ttl)
	go func(lost <-chan struct{}, id string) {
		<-lost
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.lock != nil {
			fmt.Fprintf(h.w, "warning: run %s lost the cluster's lock (its lease was not kept alive: etcd unreachable): a writing run on another node is no longer kept out\n", id)
		}
	}(l.Lost(), rec.ID)
	return nil
}

func (h *hold) warnOff() {
	keeps := "only this host's lock (the state directory's) keeps a second writing run out"
	if h.dir == nil {
		keeps = "and with --no-undo no state directory's lock either: nothing keeps a second writing run out"
	}
	fmt.Fprintf(h.w, "warning: no cluster lock: %s; %s: make sure no other node runs a writing command until this one ends\n", h.off, keeps)
}

// nameElsewhere says, reading only, where the earlier runs of the cluster
// keep their undo, when elsewhere than here, and for a rollback, the runs
// elsewhere after the oldest it undoes (checkFree, before the run's checks).
func (h *hold) nameElsewhere(ctx context.Context, host, stateDir string) {
	runs, _, err := clusterlock.List(ctx, h.cli)
	if err != nil {
		return
	}
	// Read before this run takes the lock: every run listed is earlier.
	if places := clusterlock.Elsewhere(runs, host, stateDir); len(places) > 0 {
		fmt.Fprintf(h.w, "note: the cluster's earlier runs keep their undo elsewhere too: %s ('kube-etcd-migrate runs' there)\n", describe(places))
	}
	if h.since == nil {
		return
	}
	if later := clusterlock.Later(runs, h.since.ID, h.since.Start, host, stateDir); len(later) > 0 {
		fmt.Fprintf(h.w, "warning: runs on other hosts wrote after run %s: %s; their keys this rollback would put back are skipped as changed since, unless they are undone first where they are kept\n", h.since.ID, describe(later))
	}
}

func describe(runs []clusterlock.Run) string {
	s := make([]string, len(runs))
	for i, r := range runs {
		s[i] = fmt.Sprintf("%s (%s) %s", r.ID, r.Command, r.Where())
	}
	return strings.Join(s, "; ")
}

// finish records the run's end in etcd and releases the cluster's lock.
func (h *hold) finish(code int, written int64) {
	if h == nil {
		return
	}
	h.mu.Lock()
	l := h.lock
	h.lock = nil
	h.mu.Unlock()
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ferr := l.Finish(ctx, code, written); ferr != nil {
		fmt.Fprintf(h.w, "warning: run %s: %s (the lock frees itself when its lease expires)\n", l.Record().ID, ferr)
	}
}
