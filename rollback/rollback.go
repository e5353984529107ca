package rollback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/undo"
	"os"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/liveness"
)

// RollbackResult counts what a rollback did (a dry run: would do). Each journal
// record undone counts once: a key two runs rewrote is restored twice, newest
// write first.
type RollbackResult struct {
	DryRun    bool     `json:"dryRun,omitempty"`
	Journals  []string `json:"journals,omitempty"`
	Restored  int      `json:"restored"`
	Unchanged int      `json:"unchanged"` // never written (intent without effect), or already back
	Skipped   int      `json:"skipped"`   // changed since the tool wrote it: left alone
	Failed    int      `json:"failed"`
	Keys      []string `json:"skippedKeys,omitempty"`
	// KeysNotListed counts the skipped or failed keys past the listing bound.
	KeysNotListed int `json:"skippedKeysNotListed,omitempty"`
	// Causes are the skipped and failed keys grouped by cause, each counted.
	Causes []RollbackCause `json:"causes,omitempty"`
	// Notes are keys restored with a difference: a deleted key whose lease
	// expired since comes back without a lease.
	Notes []string `json:"notes,omitempty"`
	// Preflight are the checks passed before the first write.
	Preflight []string `json:"preflight,omitempty"`
	// Space is what the rollback saw of etcd's space (with RollbackOptions.Quota).
	Space *guard.SpaceReport `json:"space,omitempty"`
	// Check is every journal read whole before the first write, and what
	// the values put back need (CheckUndo).
	Check *undo.UndoCheck `json:"check,omitempty"`
}

// maxKeysListed bounds the skipped and failed keys a rollback lists.
const maxKeysListed = 1000

// RollbackCause groups the keys a rollback skipped or failed for one cause.
type RollbackCause struct {
	Status   string `json:"status"` // skipped or failed
	Cause    string `json:"cause"`
	Count    int    `json:"count"`
	FirstKey string `json:"firstKey"`
	Error    string `json:"error,omitempty"` // the first key's, for a failure
}

// listKey lists a skipped or failed key (the first maxKeysListed) and
// counts it under its cause.
func (r *RollbackResult) listKey(status, key, cause string, err ...error) {
	why, errText := cause, ""
	if len(err) > 0 && err[0] != nil {
		why = guard.WhyNoAnswer(err[0])
		errText = why
	}
	if len(r.Keys) < maxKeysListed {
		r.Keys = append(r.Keys, key+" ("+why+")")
	} else {
		r.KeysNotListed++
	}
	for i := range r.Causes {
		if r.Causes[i].Status == status && r.Causes[i].Cause == cause {
			r.Causes[i].Count++
			return
		}
	}
	r.Causes = append(r.Causes, RollbackCause{Status: status, Cause: cause, Count: 1, FirstKey: key, Error: errText})
}

// add adds what o counted (one batch's) to r, its listed keys within the
// bound.
func (r *RollbackResult) add(o *RollbackResult) {
	r.Restored += o.Restored
	r.Unchanged += o.Unchanged
	r.Skipped += o.Skipped
	r.Failed += o.Failed
	r.Notes = append(r.Notes, o.Notes...)
	for _, k := range o.Keys {
		if len(r.Keys) < maxKeysListed {
			r.Keys = append(r.Keys, k)
		} else {
			r.KeysNotListed++
		}
	}
	r.KeysNotListed += o.KeysNotListed
next:
	for _, c := range o.Causes {
		for i := range r.Causes {
			if r.Causes[i].Status == c.Status && r.Causes[i].Cause == c.Cause {
				r.Causes[i].Count += c.Count
				continue next
			}
		}
		r.Causes = append(r.Causes, c)
	}
}

// Written is what the rollback wrote (restored keys; a dry run: none).
func (r RollbackResult) Written() int64 {
	if r.DryRun {
		return 0
	}
	return int64(r.Restored)
}

// RollbackOptions control a rollback.
type RollbackOptions struct {
	// DryRun decides every record and writes nothing.
	DryRun bool
	// Journal, when set, records what the rollback itself overwrites, re-creates
	// or removes, so that it can be undone in turn.
	Journal *undo.Journal
	// BeforeFirstWrite runs once, just before the first write.
	BeforeFirstWrite func(context.Context) error
	// Watch, when set, is the rollback's liveness watch (StartWatch): the
	// first write waits for its window's verdict, and a write under the
	// prefix that is not the rollback's stops it (*liveness.WriterError).
	Watch *guard.Watch
	// Snapshot, when set, is where the snapshot of etcd is saved before the
	// first write (while the liveness window ends).
	Snapshot string
	// SaveSnapshot, when set, saves Snapshot instead of etcd's own
	// snapshot (guard.FirstWrite's Save: a SQLite datastore's copy).
	SaveSnapshot func(ctx context.Context, path string) (undo.FileSum, error)
	// OnPreflight, when set, is given the window's line (""
	// without a watch) before the first write; an error stops the rollback
	// with nothing written.
	OnPreflight func(line string) error
	// Lock, when set, is the writing run's lock, taken at the first write
	// before the snapshot starts (FirstWrite.Lock).
	Lock func(context.Context) error
	// BatchOps is the number of records decided and written together (0: DefaultMaxOps).
	BatchOps int
	// Writers is the number of batches decided and written at once (0:
	// DefaultRollbackWriters); a dry run decides one at a time.
	Writers int
	// Quota, when set, is etcd's quota (FindQuota) the rollback keeps every
	// member's database below, less the margin, as migrate does: it stops
	// before a write would take the database past it (a *SpaceError).
	Quota *guard.Quota
	// CompactHistory compacts etcd's history up to the rollback's latest
	// write whenever the database nears the quota (with Quota), as migrate's
	// does: the rollback's own journal and snapshot are its undo.
	CompactHistory bool
	// Check is the journals read whole before anything was written
	// (CheckUndo, in the order of the journals given). nil: RollbackJournals
	// reads them so itself first, without an encryption check, and refuses
	// one that is damaged.
	Check *undo.UndoCheck
	// AllowUnverified undoes journals without checksums (written before
	// records were checksummed) instead of refusing them.
	AllowUnverified bool
}

// DefaultRollbackWriters is the number of batches a rollback decides and
// writes at once: twice migrate's writers (batches.DefaultWriters), for
// each of its batches reads its keys before it writes them (two round
// trips to etcd where migrate's take one), so that as many writes are in
// flight as in migrate's run; each is a batch of etcdscan.DefaultMaxOps
// keys, so etcd's raft entries stay the size of migrate's.
const DefaultRollbackWriters = 2 * batches.DefaultWriters

// Rollback puts back the old bytes of every key the journal says the tool
// wrote; see RollbackJournals.
func Rollback(ctx context.Context, cli *clientv3.Client, path string, w *etcdscan.Writer) (RollbackResult, error) {
	return RollbackJournals(ctx, cli, w, []string{path}, RollbackOptions{})
}

// RollbackJournals undoes the journals in the order given (newest run first),
// each from its last record to its first, in bounded memory: the records are
// read backwards a page at a time and never held all at once. A write is undone
// when the key still holds exactly what the tool wrote (its mod revision, or
// the sha256 of the value the journal recorded): compare-and-swap on the key's
// current mod revision puts the old bytes back, keeping its lease; a key
// changed since by anyone else is skipped and listed. A key the tool removed
// (quarantine) is created again if it is still absent, with its lease if that
// is still alive (without, and noted, if it expired); a key a rollback created
// again is removed when it still holds what the rollback wrote. Undoing every
// run from the newest back gives the state before the oldest, byte for byte.
// Every journal is read whole first (opts.Check, or CheckUndo here): a
// damaged one is refused before anything is written, and a record cut short
// at the end of a killed run's journal is passed over.
func RollbackJournals(ctx context.Context, cli *clientv3.Client, w *etcdscan.Writer, journals []string, opts RollbackOptions) (RollbackResult, error) {
	res := RollbackResult{DryRun: opts.DryRun, Journals: journals}
	check := opts.Check
	if check == nil {
		specs := make([]undo.JournalSpec, len(journals))
		for i, p := range journals {
			specs[i] = undo.JournalSpec{Path: p}
		}
		var err error
		if check, err = undo.CheckUndo(ctx, specs, undo.UndoOptions{}); err != nil {
			return res, err
		}
		if un := check.Unverified(); len(un) > 0 && !opts.AllowUnverified {
			return res, &undo.UnverifiedJournalError{Journals: un}
		}
	}
	res.Check = check
	valid := map[string]int64{}
	for _, j := range check.Journals {
		valid[j.Path] = j.ValidBytes()
	}
	for _, p := range journals {
		if _, ok := valid[p]; !ok {
			return res, fmt.Errorf("journal %s: not read through before the rollback (internal error); nothing was written", p)
		}
	}
	if !opts.DryRun {
		if err := guard.RollbackAlarms(ctx, cli, journals); err != nil {
			return res, err
		}
	}
	rb := &rollback{ctx: ctx, cli: cli, w: w, opts: opts, res: &res, batchOps: opts.BatchOps}
	if rb.batchOps <= 0 {
		rb.batchOps = etcdscan.DefaultMaxOps
	}
	rb.first = &guard.FirstWrite{Watch: opts.Watch, Client: cli, Snapshot: opts.Snapshot, Save: opts.SaveSnapshot, Lock: opts.Lock, Then: func(line string) error {
		if line != "" {
			res.Preflight = append(res.Preflight, line)
		}
		if opts.OnPreflight != nil {
			if err := opts.OnPreflight(line); err != nil {
				return err
			}
		}
		if opts.BeforeFirstWrite != nil {
			return opts.BeforeFirstWrite(ctx)
		}
		return nil
	}}
	if !opts.DryRun && opts.Watch != nil && w.Observer == nil {
		w.Observer = opts.Watch.Observer()
	}
	if opts.DryRun {
		rb.sim = map[string]simValue{}
	} else if opts.Quota != nil {
		st, err := etcdscan.Status(ctx, cli)
		if err != nil {
			return res, err
		}
		rb.guard = guard.NewEtcdSpaceGuard(cli, *opts.Quota, opts.CompactHistory, st)
		rb.guard.Watched(opts.Watch)
		res.Space = rb.guard.Report()
	}
	var err error
	for _, path := range journals {
		rb.path = path
		if err = rb.journal(path, valid[path]); err != nil {
			break
		}
	}
	if rb.guard != nil {
		rb.guard.Finish(context.WithoutCancel(ctx))
	}
	if rb.first.Opened() {
		// Every write, up to the last, is judged: a writer that appeared
		// is the rollback's outcome.
		if serr := opts.Watch.Settle(context.WithoutCancel(ctx)); serr != nil && (err == nil || errors.As(serr, new(*liveness.WriterError))) {
			err = serr
		}
	}
	var se *guard.SpaceError
	if errors.As(err, &se) {
		se.Journal, se.Verb = rb.path, "rollback"
	}
	return res, err
}

// rollback is one rollback's state.
type rollback struct {
	ctx      context.Context
	cli      *clientv3.Client
	w        *etcdscan.Writer
	opts     RollbackOptions
	res      *RollbackResult
	path     string // the journal being undone
	batchOps int
	// first is the first write: the window's verdict, the snapshot.
	first *guard.FirstWrite
	// pendingDone holds, for keys whose "done" record was read (backwards)
	// before its intent, the mod revision the write produced: at most the
	// writes in flight when the journal was written.
	pendingDone map[string]int64
	// sim is a dry run's view of the keys it would have changed.
	sim map[string]simValue
	// guard keeps etcd's database below its quota (RollbackOptions.Quota).
	guard *guard.SpaceGuard

	// mu guards res, which each batch adds what it did to, and busy: the
	// keys of the batches sent and not yet done (a key met again waits for
	// them: a key's records are undone newest first).
	mu   sync.Mutex
	busy map[string]int
}

// simValue is a key as a dry run would have left it.
type simValue struct {
	absent bool
	sum    [32]byte
}

// item is one journal record to undo.
type item struct {
	rec     undo.JournalRecord
	doneRev int64
}

// journal undoes the records of the journal at path up to byte end (where
// its records end, as CheckJournal read them: a record cut short after it
// is passed over). Its batches are decided and written by concurrent
// writers (RollbackOptions.Writers) while the journal is read on: a key
// whose earlier record is in a batch not yet done waits for the batches
// sent, so that each key's records are undone in order, newest first.
func (rb *rollback) journal(path string, end int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("journal %s: %w", path, err)
	}
	defer f.Close()
	n := rb.opts.Writers
	if n <= 0 {
		n = DefaultRollbackWriters
	}
	if rb.opts.DryRun {
		n = 1 // its view of the keys (sim) is decided in order
	}
	ctx, cancel := context.WithCancel(rb.ctx)
	defer cancel()
	rb.busy = map[string]int{}
	pool := batches.Start(n, 0, cancel, rb.batch)
	readErr := rb.read(ctx, path, undo.NewBackwardReader(f, end), pool)
	if err := pool.Wait(); err != nil {
		return err
	}
	return readErr
}

// read reads the journal backwards into batches of at most batchOps
// records, each key once, and sends them to pool.
func (rb *rollback) read(ctx context.Context, path string, br *undo.BackwardReader, pool *batches.Pool[item]) error {
	rb.pendingDone = map[string]int64{}
	var batch []item
	inBatch := map[string]bool{}
	send := func() error {
		if len(batch) == 0 {
			return nil
		}
		rb.mu.Lock()
		for _, it := range batch {
			rb.busy[it.rec.Key]++
		}
		rb.mu.Unlock()
		err := pool.Send(ctx, batch)
		batch, inBatch = nil, map[string]bool{}
		return err
	}
	for {
		line, off, err := br.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("journal %s: %w", path, err)
		}
		var r undo.JournalRecord
		if err := json.Unmarshal(line, &r); err != nil {
			// Read through before (CheckJournal): the file changed since.
			return fmt.Errorf("journal %s: record at byte %d: %w (the file changed since it was read through)", path, off, err)
		}
		switch r.Op {
		case "done", "deleted":
			if r.NewModRevision != 0 {
				rb.pendingDone[r.Key] = r.NewModRevision
			} else if r.DeleteRevision != 0 {
				rb.pendingDone[r.Key] = r.DeleteRevision
			}
		case "intent", "delete-intent", "create-intent":
			it := item{rec: r, doneRev: rb.pendingDone[r.Key]}
			delete(rb.pendingDone, r.Key)
			rb.mu.Lock()
			again := inBatch[r.Key] || rb.busy[r.Key] > 0
			rb.mu.Unlock()
			if again || len(batch) >= rb.batchOps {
				if err := send(); err != nil {
					return err
				}
				if again {
					pool.Settle() // its newer record first
				}
			}
			batch = append(batch, it)
			inBatch[r.Key] = true
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return send()
}

// current reads the keys of a batch as they are now: in one transaction of
// reads, or on kine (the Writer's Kine), which serves no such transaction,
// each with a read of its own.
func (rb *rollback) current(items []item) ([]*currentKV, error) {
	kvs := make([][]*mvccpb.KeyValue, len(items))
	if rb.w.Kine {
		for i, it := range items {
			resp, err := rb.cli.Get(rb.ctx, it.rec.Key)
			if err != nil {
				return nil, fmt.Errorf("rollback: read %s: %w", it.rec.Key, err)
			}
			kvs[i] = resp.Kvs
		}
	} else {
		ops := make([]clientv3.Op, len(items))
		for i, it := range items {
			ops[i] = clientv3.OpGet(it.rec.Key)
		}
		resp, err := rb.cli.Txn(rb.ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("rollback: read %s ...: %w", items[0].rec.Key, err)
		}
		for i, r := range resp.Responses {
			kvs[i] = r.GetResponseRange().Kvs
		}
	}
	out := make([]*currentKV, len(items))
	for i := range items {
		if rb.sim != nil {
			if s, ok := rb.sim[items[i].rec.Key]; ok {
				if !s.absent {
					out[i] = &currentKV{simSum: &s.sum}
				}
				continue
			}
		}
		if len(kvs[i]) > 0 {
			kv := kvs[i][0]
			out[i] = &currentKV{value: kv.Value, modRevision: kv.ModRevision, createRevision: kv.CreateRevision, version: kv.Version, lease: kv.Lease}
		}
	}
	return out, nil
}
