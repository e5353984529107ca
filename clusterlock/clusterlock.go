// Package clusterlock keeps one writing run per cluster, whatever node it
// runs on, and the cluster's record of its writing runs, both in etcd itself:
// a writing run takes etcd's own mutex (go.etcd.io/etcd/client/v3/concurrency)
// under /kube-etcd-migrate/lock, on a lease its process keeps alive (a dead
// holder frees the lock when the lease expires), with who holds it beside it
// on the same lease (/kube-etcd-migrate/holder/LEASE: run ID, host, PID,
// state directory), and records the run under /kube-etcd-migrate/runs/ (ID,
// command, host, PID, state directory, undo files, start, end, exit code),
// where 'runs' on any node reads every host's runs. The keys are outside
// kube-apiserver's prefix (/registry by default): kube-apiserver never reads
// them, the liveness watch (which watches the prefix) never sees them as a
// writer, no scan reads them, and no journal holds them, so no rollback
// undoes them. A snapshot taken while a run holds the lock holds the lock's
// keys too: a cluster restored from it gets them back on their lease, which
// etcd restores with its full TTL and nothing keeps alive, so the lock frees
// itself one TTL after the restored etcd starts; the restored run records say
// what was running then. Taking the lock writes to etcd; everything else here
// reads.
package clusterlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/undo"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The keys, outside kube-apiserver's prefix.
const (
	// Prefix is the tool's own directory of keys in etcd.
	Prefix = "/kube-etcd-migrate/"
	// LockPrefix is the mutex's prefix: one key per contender,
	// LockPrefix/LEASE, the oldest the holder.
	LockPrefix = Prefix + "lock"
	// HolderPrefix + LEASE is the holder's Run (JSON), on the lock's lease.
	HolderPrefix = Prefix + "holder/"
	// RunsPrefix + REVISION (20 digits: etcd's revision when the run took
	// the lock) is each run's Run (JSON), kept without a lease.
	RunsPrefix = Prefix + "runs/"
)

// DefaultTTL is the lease's time to live (etcdctl lock's default): a holder
// killed without a word frees the lock this long after its last keep-alive.
const DefaultTTL = 60 * time.Second

// EnvTTL names the environment variable that sets the lease's time to live
// in seconds (tests set a short one).
const EnvTTL = "KUBE_ETCD_MIGRATE_LOCK_TTL"

// TTL is the lease's time to live: $KUBE_ETCD_MIGRATE_LOCK_TTL seconds when
// set, else DefaultTTL.
func TTL() (time.Duration, error) {
	v := strings.TrimSpace(os.Getenv(EnvTTL))
	if v == "" {
		return DefaultTTL, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("$%s=%q: want a whole number of seconds, at least 1", EnvTTL, v)
	}
	return time.Duration(n) * time.Second, nil
}

// Run is a writing run as the cluster records it: the run's header as its
// run directory has it (undo.Header: its ID, command, host and process,
// start, end, exit code, keys written, journal and snapshot), and where on its
// host it keeps its undo.
type Run struct {
	undo.Header
	// StateDir is where the run keeps its undo on Host ("" with --no-undo).
	StateDir string `json:"stateDir,omitempty"`
	// Revision is etcd's revision when the run took the lock: the
	// cluster's order of its runs.
	Revision int64 `json:"revision"`
	// Boot is the Linux boot ID of the run's host while it ran: with Host
	// and PID, what tells a holder that is provably gone (GoneHere).
	Boot string `json:"boot,omitempty"`
}

// BootID is this host's boot ID ("" when it cannot be read).
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// GoneHere says whether the holder is a run of this very host and boot, in
// stateDir, whose process no longer exists: a run killed before it could
// release the lock, whose rerun may take it over at once (Reclaim) rather
// than wait for its lease. A PID used again by another process counts as
// alive (the lease then frees the lock).
func (e *HeldError) GoneHere(host, stateDir string) bool {
	h := e.Holder
	boot := BootID()
	if h.Host == "" || h.Host != host || h.StateDir != stateDir || boot == "" || h.Boot != boot || h.PID <= 0 || h.PID == os.Getpid() {
		return false
	}
	return errors.Is(syscall.Kill(h.PID, 0), syscall.ESRCH)
}

// Reclaim releases a gone holder's lock (GoneHere): its lease revoked, its
// keys go with it. Its run's record stays, without an end.
func Reclaim(ctx context.Context, cli *clientv3.Client, e *HeldError) error {
	if _, err := cli.Revoke(ctx, e.Lease); err != nil && !etcdscan.IsLeaseNotFound(err) {
		return fmt.Errorf("release the lock of run %s (pid %d, gone): %w", e.Holder.ID, e.Holder.PID, err)
	}
	return nil
}

// Where says where the run keeps its undo: host and state directory.
func (r Run) Where() string {
	if r.StateDir == "" {
		return "on " + r.Host + ", no undo (--no-undo)"
	}
	return "on " + r.Host + " in " + r.StateDir
}

// Covers says whether kube-apiserver's prefix covers the tool's keys (a
// prefix of "/", or of "/kube-etcd-migrate"): then the lock would be a
// write under the prefix, seen as a writer, and is not taken.
func Covers(prefix string) bool {
	p := strings.TrimSuffix(prefix, "/") + "/"
	return strings.HasPrefix(Prefix, p)
}

// HeldError refuses a run while another holds the cluster's lock.
type HeldError struct {
	// Holder is the run that holds it (Host "" when its record is not
	// there yet: it took the lock an instant ago).
	Holder Run
	// Lease is the lock's lease, and TTL what is left of it.
	Lease clientv3.LeaseID
	TTL   time.Duration
}

func (e *HeldError) Error() string {
	who := fmt.Sprintf("an unnamed run (lease %x, its record not yet written)", int64(e.Lease))
	if e.Holder.Host != "" {
		who = fmt.Sprintf("run %s (%s, pid %d on %s, state directory %s, since %s)", e.Holder.ID, e.Holder.Command, e.Holder.PID, e.Holder.Host,
			orNone(e.Holder.StateDir), e.Holder.Start.Local().Format(time.DateTime))
	}
	return fmt.Sprintf("another writing run holds the cluster's lock in etcd (%s): %s; one writing run per cluster: wait for it to end (if its process is gone, its lease frees the lock within %s)",
		LockPrefix, who, e.TTL.Round(time.Second))
}

func orNone(dir string) string {
	if dir == "" {
		return "none (--no-undo)"
	}
	return dir
}

// NotPermittedError says etcd refused the tool's keys: with etcd's auth
// on, the user the tool connects as (kube-apiserver's client certificate)
// may write under kube-apiserver's prefix only. The run goes on with the
// host's lock alone, said so.
type NotPermittedError struct {
	Key string
	Err error
}

func (e *NotPermittedError) Error() string {
	return fmt.Sprintf("etcd refused the cluster's lock key %s (%v): the user the tool connects as may not write outside kube-apiserver's prefix", e.Key, e.Err)
}

func (e *NotPermittedError) Unwrap() error { return e.Err }

// permission is err as a *NotPermittedError when etcd refused key for lack
// of permission (auth on), else err.
func permission(key string, err error) error {
	if err == nil {
		return nil
	}
	if etcdscan.IsPermissionDenied(err) {
		return &NotPermittedError{Key: key, Err: err}
	}
	return err
}

// Holder reads, without writing, who holds the cluster's lock: nil when
// nobody does.
func Holder(ctx context.Context, cli *clientv3.Client) (*HeldError, error) {
	resp, err := cli.Get(ctx, LockPrefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return nil, permission(LockPrefix, fmt.Errorf("read the cluster's lock %s: %w", LockPrefix, err))
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return holderOf(ctx, cli, string(resp.Kvs[0].Key), clientv3.LeaseID(resp.Kvs[0].Lease))
}

// holderOf reads the holder's record and its lease's time left.
func holderOf(ctx context.Context, cli *clientv3.Client, key string, lease clientv3.LeaseID) (*HeldError, error) {
	he := &HeldError{Lease: lease}
	hex := strings.TrimPrefix(key, LockPrefix+"/")
	resp, err := cli.Get(ctx, HolderPrefix+hex)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's lock holder %s: %w", HolderPrefix+hex, err)
	}
	if len(resp.Kvs) > 0 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &he.Holder); err != nil {
			return nil, fmt.Errorf("the cluster's lock holder %s: %w", HolderPrefix+hex, err)
		}
	}
	if lease != 0 {
		ttl, err := cli.TimeToLive(ctx, lease)
		if err == nil && ttl.TTL > 0 {
			he.TTL = time.Duration(ttl.TTL) * time.Second
		}
	}
	return he, nil
}

// Lock is the cluster's lock, held by this process.
type Lock struct {
	cli     *clientv3.Client
	session *concurrency.Session
	mutex   *concurrency.Mutex
	run     Run
	runKey  string
	holder  string
}

// Acquire takes the cluster's lock for run without waiting, on a lease of
// ttl its process keeps alive until Release, and records run (its Revision
// set) beside it and among the cluster's runs. Another holder is a
// *HeldError; etcd refusing the keys (auth) a *NotPermittedError.
func Acquire(ctx context.Context, cli *clientv3.Client, run Run, ttl time.Duration) (*Lock, error) {
	secs := int(ttl.Round(time.Second) / time.Second)
	// The lease lives as long as the process keeps it (not the run's
	// context: an interrupted run still finishes its writes under it).
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(max(secs, 1)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, permission(LockPrefix, fmt.Errorf("take the cluster's lock %s: lease: %w", LockPrefix, err))
	}
	m := concurrency.NewMutex(s, LockPrefix)
	if err := m.TryLock(ctx); err != nil {
		defer s.Close()
		if errors.Is(err, concurrency.ErrLocked) {
			resp, gerr := cli.Get(ctx, LockPrefix+"/", clientv3.WithFirstCreate()...)
			if gerr != nil || len(resp.Kvs) == 0 {
				return nil, &HeldError{TTL: ttl}
			}
			he, herr := holderOf(ctx, cli, string(resp.Kvs[0].Key), clientv3.LeaseID(resp.Kvs[0].Lease))
			if herr != nil {
				return nil, herr
			}
			return nil, he
		}
		return nil, permission(LockPrefix, fmt.Errorf("take the cluster's lock %s: %w", LockPrefix, err))
	}
	l := &Lock{cli: cli, session: s, mutex: m, run: run}
	l.run.Revision = m.Header().Revision
	l.runKey = fmt.Sprintf("%s%020d", RunsPrefix, l.run.Revision)
	l.holder = HolderPrefix + strings.TrimPrefix(m.Key(), LockPrefix+"/")
	b, err := json.Marshal(l.run)
	if err != nil {
		l.Release(ctx)
		return nil, err
	}
	resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(
		clientv3.OpPut(l.holder, string(b), clientv3.WithLease(s.Lease())),
		clientv3.OpPut(l.runKey, string(b)),
	).Commit()
	if err == nil && !resp.Succeeded {
		err = errors.New("the lock was lost as it was taken (its lease expired)")
	}
	if err != nil {
		l.Release(ctx)
		return nil, permission(l.holder, fmt.Errorf("record the run beside the cluster's lock: %w", err))
	}
	return l, nil
}

// Record is the run as recorded, its Revision set.
func (l *Lock) Record() Run { return l.run }

// Lost is closed when the lock's lease is no longer kept alive (etcd
// unreachable for longer than its time to live, or Release).
func (l *Lock) Lost() <-chan struct{} { return l.session.Done() }

// Finish records the run's end among the cluster's runs and releases the
// lock.
func (l *Lock) Finish(ctx context.Context, exitCode int, keysWritten int64) error {
	end := time.Now().UTC().Truncate(time.Second)
	l.run.End, l.run.ExitCode, l.run.KeysWritten = &end, &exitCode, keysWritten
	b, err := json.Marshal(l.run)
	if err == nil {
		_, err = l.cli.Put(ctx, l.runKey, string(b))
	}
	if err != nil {
		err = fmt.Errorf("record the run's end at %s: %w", l.runKey, err)
	}
	if rerr := l.Release(ctx); err == nil {
		err = rerr
	}
	return err
}

// Release lets the lock go: its keys are removed with its lease.
func (l *Lock) Release(ctx context.Context) error {
	if l == nil || l.session == nil {
		return nil
	}
	// Revoking the lease removes the mutex's key and the holder's; within
	// ctx (the session's own Close would wait up to the lease's time to
	// live for an etcd that is gone, when the lease expires by itself).
	l.session.Orphan()
	_, err := l.cli.Revoke(ctx, l.session.Lease())
	l.session = nil
	if err != nil && !etcdscan.IsLeaseNotFound(err) {
		return fmt.Errorf("release the cluster's lock: %w", err)
	}
	return nil
}

// List reads the cluster's runs, oldest first, and the run holding the lock
// now (nil when none).
func List(ctx context.Context, cli *clientv3.Client) ([]Run, *HeldError, error) {
	resp, err := cli.Get(ctx, RunsPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, permission(RunsPrefix, fmt.Errorf("read the cluster's runs %s: %w", RunsPrefix, err))
	}
	var runs []Run
	for _, kv := range resp.Kvs {
		var r Run
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, nil, fmt.Errorf("the cluster's run %s: %w", kv.Key, err)
		}
		runs = append(runs, r)
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Revision < runs[j].Revision })
	held, err := Holder(ctx, cli)
	if err != nil {
		return runs, nil, err
	}
	return runs, held, nil
}

// Elsewhere are the runs of runs kept somewhere else than on host in
// stateDir, the newest of each place, oldest first: where the earlier
// runs' undo is.
func Elsewhere(runs []Run, host, stateDir string) []Run {
	newest := map[string]Run{}
	for _, r := range runs {
		if r.Host == host && r.StateDir == stateDir {
			continue
		}
		newest[r.Host+"\x00"+r.StateDir] = r
	}
	out := make([]Run, 0, len(newest))
	for _, r := range newest {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out
}

// Later are the runs of runs kept on another host or in another state
// directory than the run id of host and stateDir that took the cluster's
// lock after it did (after it started, start, when the cluster has no
// record of it): what a rollback of that run does not undo.
func Later(runs []Run, id string, start time.Time, host, stateDir string) []Run {
	mine := func(r Run) bool { return r.Host == host && r.StateDir == stateDir }
	var self int64 = -1
	for _, r := range runs {
		if mine(r) && r.ID == id {
			self = r.Revision
		}
	}
	var out []Run
	for _, r := range runs {
		if !mine(r) && (self >= 0 && r.Revision > self || self < 0 && r.Start.After(start)) {
			out = append(out, r)
		}
	}
	return out
}

// UndoPlace is where the run keeps its undo, as its lines say it.
func (r Run) UndoPlace() string { return orNone(r.StateDir) }
